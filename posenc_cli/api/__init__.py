"""posenc as Python functions: train, evaluate, extend, sweep and compare, each returning data.

The commands in `posenc_cli.cli` parse their flags, call these and render what they return; a notebook calls them
directly. They print nothing (a progress display is whatever the caller passes as `callback`/`progress`), raise
`posenc_cli.errors.UserError` subclasses for a user's mistake (a bad value, a missing file, a directory of the wrong
kind), and take the commands' defaults::

    from posenc_cli import api

    run = api.train(["pos=rope", "model=tiny", "train.steps=600"], out="runs/rope")
    child = api.extend(run.run_dir, method="yarn", factor=4.0).result  # runs/rope-yarnx4
    api.evaluate([run.run_dir, child.out_dir], lengths=[1, 2, 4])
    api.compare([run.run_dir, child.out_dir])  # a pandas DataFrame: one row per run, one column per length
    api.task_scores(["sweeps/tasks"])  # task cells per run × task, with the competence gate's verdict
    report = api.sweep("extrapolation", ["train.steps=200"], out="sweeps/main")  # report.comparison.to_frame()

Layout follows litgpt's `api.py` beside its `__main__.py` (commands as plain typed functions): the command decides
nothing that this module does not.
"""

from __future__ import annotations

from posenc_cli.analysis.compare import Comparison
from posenc_cli.api.bench import bench, cost_curve
from posenc_cli.api.calibration import calibrate
from posenc_cli.api.comparison import REFERENCES, CompareReport, TextTable, compare, comparison, task_scores
from posenc_cli.api.data import prepare_data
from posenc_cli.api.evaluation import (
    Evaluation,
    TaskEvaluation,
    eval_config,
    evaluate,
    evaluate_algorithmic,
    evaluate_passkey,
    evaluate_tasks,
    longest_instance_length,
    task_summaries,
)
from posenc_cli.api.export import export
from posenc_cli.api.extension import (
    evaluate_pair,
    extend,
    one_method,
    scaling_method,
    scaling_methods,
    scaling_params,
)
from posenc_cli.api.models import load_model
from posenc_cli.api.profiles import profile_rows
from posenc_cli.api.schemes import schemes
from posenc_cli.api.sweeps import (
    SweepPlan,
    SweepReport,
    SweepRun,
    plan_sweep,
    run_planned_sweep,
    sweep,
    sweep_report,
)
from posenc_cli.api.training import is_main_process, train, train_config, train_warning
from posenc_cli.api.viz import EncodingPicture, viz_attention, viz_compare, viz_encoding

__all__ = [
    "REFERENCES",
    "CompareReport",
    "Comparison",
    "EncodingPicture",
    "Evaluation",
    "SweepPlan",
    "SweepReport",
    "SweepRun",
    "TaskEvaluation",
    "TextTable",
    "bench",
    "calibrate",
    "compare",
    "comparison",
    "cost_curve",
    "eval_config",
    "evaluate",
    "evaluate_algorithmic",
    "evaluate_pair",
    "evaluate_passkey",
    "evaluate_tasks",
    "export",
    "extend",
    "is_main_process",
    "load_model",
    "longest_instance_length",
    "one_method",
    "plan_sweep",
    "prepare_data",
    "profile_rows",
    "run_planned_sweep",
    "scaling_method",
    "scaling_methods",
    "scaling_params",
    "schemes",
    "sweep",
    "sweep_report",
    "task_scores",
    "task_summaries",
    "train",
    "train_config",
    "train_warning",
    "viz_attention",
    "viz_compare",
    "viz_encoding",
]
