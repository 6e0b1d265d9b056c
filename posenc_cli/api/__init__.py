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
    api.task_seed_scores(["sweeps/tasks"])  # per experiment × task × length: mean ± sd over seeds, seeds learned
    api.learning_curves(["sweeps/tasks"])  # in-distribution accuracy against steps, runs equal but for them
    report = api.sweep("extrapolation", ["train.steps=200"], out="sweeps/main")  # report.comparison.to_frame()

Layout follows litgpt's `api.py` beside its `__main__.py` (commands as plain typed functions): the command decides
nothing that this module does not.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time `__getattr__` imports each on first use
    from posenc_cli.analysis.compare import Comparison
    from posenc_cli.api.benchmarking import bench, cost_curve
    from posenc_cli.api.calibration import calibrate
    from posenc_cli.api.comparing import (
        REFERENCES,
        CompareReport,
        TextTable,
        compare,
        comparison,
        learning_curves,
        task_scores,
        task_seed_scores,
    )
    from posenc_cli.api.data import prepare_data
    from posenc_cli.api.evaluation import (
        Evaluation,
        TaskEvaluation,
        check_instance_length,
        eval_config,
        evaluate,
        evaluate_algorithmic,
        evaluate_passkey,
        evaluate_tasks,
        task_summaries,
    )
    from posenc_cli.api.exporting import export
    from posenc_cli.api.extension import (
        evaluate_pair,
        extend,
        one_method,
        scaling_method,
        scaling_methods,
        scaling_params,
    )
    from posenc_cli.api.models import load_model
    from posenc_cli.api.plotting import plot_accuracy_by_length
    from posenc_cli.api.profiles import profile_rows
    from posenc_cli.api.scheme_table import schemes
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

# name -> the module that defines it (no module is named as a function it holds: importing `api.bench` would set
# the package's `bench` to the module): `from posenc_cli import api` stays light (no torch) until a function is used,
# so a command importing one API module (extend --help reads the scaling methods' flags) loads only that one.
_HOME = {
    "Comparison": "posenc_cli.analysis.compare",
    "bench": "posenc_cli.api.benchmarking",
    "cost_curve": "posenc_cli.api.benchmarking",
    "calibrate": "posenc_cli.api.calibration",
    "REFERENCES": "posenc_cli.api.comparing",
    "CompareReport": "posenc_cli.api.comparing",
    "TextTable": "posenc_cli.api.comparing",
    "compare": "posenc_cli.api.comparing",
    "comparison": "posenc_cli.api.comparing",
    "task_scores": "posenc_cli.api.comparing",
    "task_seed_scores": "posenc_cli.api.comparing",
    "learning_curves": "posenc_cli.api.comparing",
    "prepare_data": "posenc_cli.api.data",
    "Evaluation": "posenc_cli.api.evaluation",
    "TaskEvaluation": "posenc_cli.api.evaluation",
    "check_instance_length": "posenc_cli.api.evaluation",
    "eval_config": "posenc_cli.api.evaluation",
    "evaluate": "posenc_cli.api.evaluation",
    "evaluate_algorithmic": "posenc_cli.api.evaluation",
    "evaluate_passkey": "posenc_cli.api.evaluation",
    "evaluate_tasks": "posenc_cli.api.evaluation",
    "task_summaries": "posenc_cli.api.evaluation",
    "export": "posenc_cli.api.exporting",
    "evaluate_pair": "posenc_cli.api.extension",
    "extend": "posenc_cli.api.extension",
    "one_method": "posenc_cli.api.extension",
    "scaling_method": "posenc_cli.api.extension",
    "scaling_methods": "posenc_cli.api.extension",
    "scaling_params": "posenc_cli.api.extension",
    "load_model": "posenc_cli.api.models",
    "plot_accuracy_by_length": "posenc_cli.api.plotting",
    "profile_rows": "posenc_cli.api.profiles",
    "schemes": "posenc_cli.api.scheme_table",
    "SweepPlan": "posenc_cli.api.sweeps",
    "SweepReport": "posenc_cli.api.sweeps",
    "SweepRun": "posenc_cli.api.sweeps",
    "plan_sweep": "posenc_cli.api.sweeps",
    "run_planned_sweep": "posenc_cli.api.sweeps",
    "sweep": "posenc_cli.api.sweeps",
    "sweep_report": "posenc_cli.api.sweeps",
    "is_main_process": "posenc_cli.api.training",
    "train": "posenc_cli.api.training",
    "train_config": "posenc_cli.api.training",
    "train_warning": "posenc_cli.api.training",
    "EncodingPicture": "posenc_cli.api.viz",
    "viz_attention": "posenc_cli.api.viz",
    "viz_compare": "posenc_cli.api.viz",
    "viz_encoding": "posenc_cli.api.viz",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


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
    "check_instance_length",
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
    "learning_curves",
    "load_model",
    "one_method",
    "plan_sweep",
    "plot_accuracy_by_length",
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
    "task_seed_scores",
    "task_summaries",
    "train",
    "train_config",
    "train_warning",
    "viz_attention",
    "viz_compare",
    "viz_encoding",
]
