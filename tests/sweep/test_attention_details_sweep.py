"""configs/sweep/attention-details.yaml (issue #43 item 5): its plan (stages, jobs, labels), each option reaching the
job's config, and every job's parameter count within 2% of its baseline's. Plans and builds models only: no training.
"""

from __future__ import annotations

import functools

import pytest

from posenc_cli.config import Config, config_dir
from posenc_cli.data.tokenizer import BYTE_VOCAB_SIZE
from posenc_cli.model import build_model
from posenc_cli.sweep.plan import StagePlan, plan_sweep, validate_plan
from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec

BASELINES = ("rope", "nope", "alibi")
PRESETS = ("fope", "gpt-oss", "gemma4")  # RoPE variants: held against the RoPE baseline
TOLERANCE = 0.02


@functools.cache
def planned() -> tuple[list[StagePlan], dict[str, Config]]:
    path = find_sweep_file("attention-details", [config_dir()])
    assert path.read_text().startswith("# posenc sweep attention-details")
    plans = plan_sweep(load_sweep_spec(path), [])
    return plans, validate_plan(plans, None)  # as `posenc sweep attention-details --dry-run` plans and checks


def jobs(stage: str) -> dict[str, Config]:
    """The stage's jobs' configs by label."""
    plans, configs = planned()
    (plan,) = [p for p in plans if p.stage.name == stage]
    return {job.label: configs[job.key] for job in plan.jobs}


@pytest.mark.integration  # composes a shipped sweep's jobs
def test_plans_every_stage_with_its_jobs_and_labels() -> None:
    plans, configs = planned()
    assert [(p.stage.name, len(p.jobs)) for p in plans] == [
        ("baseline", 3), ("sinks", 3), ("gate-elementwise", 3), ("gate-headwise", 3), ("qk-norm", 6), ("canon", 3),
        ("presets", 3), ("streaming", 6),
    ]  # fmt: skip
    assert len(configs) == 30
    labels = [job.label for p in plans for job in p.jobs]
    assert len(set(labels)) == len(labels)  # every row of the table is one job
    assert set(jobs("baseline")) == set(BASELINES)
    assert set(jobs("presets")) == set(PRESETS)
    assert set(jobs("qk-norm")) == {f"{p} + qk-norm {n}" for p in BASELINES for n in ("rms", "l2")}
    assert set(jobs("streaming")) == {f"{p}, sinks {s}, streaming" for p in BASELINES for s in ("False", "True")}


def test_each_option_reaches_its_jobs_config() -> None:
    for label, cfg in jobs("baseline").items():
        assert cfg.pos.name == label
        m = cfg.model
        options = (m.attn_sinks, m.attn_gate, m.qk_norm, m.canon)
        assert options == (False, "none", "none", "") and (m.d_model, m.n_layer) == (176, 6)
        assert cfg.eval.protocol == "nonoverlap" and cfg.eval.lengths == [1, 2, 4, 8, 16]
    assert all(cfg.model.attn_sinks for cfg in jobs("sinks").values())
    assert {(c.model.attn_gate, c.model.d_model) for c in jobs("gate-elementwise").values()} == {("elementwise", 168)}
    assert {(c.model.attn_gate, c.model.d_model) for c in jobs("gate-headwise").values()} == {("headwise", 176)}
    assert all(label.endswith(f"qk-norm {c.model.qk_norm}") for label, c in jobs("qk-norm").items())
    assert {c.model.canon for c in jobs("canon").values()} == {"ABCD"}
    presets = jobs("presets")
    assert {label: c.pos.name for label, c in presets.items()} == {p: p for p in PRESETS}
    assert presets["gpt-oss"].model.attn_sinks  # the preset switches the learned sinks on itself
    assert not presets["gemma4"].model.attn_sinks and not presets["fope"].model.attn_sinks
    for label, cfg in jobs("streaming").items():
        assert (cfg.eval.protocol, cfg.eval.sinks) == ("streaming", 4)  # StreamingLLM's kept tokens, fixed
        assert cfg.model.attn_sinks == (", sinks True," in label)
    # Every option row differs from its baseline only in that option (and the gate's width): the same training.
    base = jobs("baseline")["rope"]
    for stage in ("sinks", "gate-elementwise", "gate-headwise", "qk-norm", "canon", "presets", "streaming"):
        for cfg in jobs(stage).values():
            assert cfg.train == base.train and cfg.data == base.data and cfg.tokenizer == base.tokenizer


@functools.cache
def n_params(model: str, pos: str) -> int:
    """Parameters of the model a job trains, keyed by the reprs of its model and pos configs (built once each)."""
    cfg = next(c for c in planned()[1].values() if repr(c.model) == model and repr(c.pos) == pos)
    return sum(p.numel() for p in build_model(cfg, BYTE_VOCAB_SIZE).parameters())


def count(cfg: Config) -> int:
    return n_params(repr(cfg.model), repr(cfg.pos))


@pytest.mark.integration  # builds a shipped sweep's models
def test_every_job_has_its_baselines_parameters_within_two_percent() -> None:
    plans, configs = planned()
    baselines = {label: count(cfg) for label, cfg in jobs("baseline").items()}
    assert len(set(baselines.values())) == 1  # none of the three has position parameters
    off = {}
    for plan in plans:
        for job in plan.jobs:
            cfg = configs[job.key]
            base = baselines[cfg.pos.name if cfg.pos.name in BASELINES else "rope"]
            off[job.label] = count(cfg) / base - 1
    assert {label: round(x, 4) for label, x in off.items() if abs(x) > TOLERANCE} == {}
    # What the sweep file's header states, so a change of width shows here.
    assert off["rope + gate elementwise (d 168)"] == pytest.approx(-0.013, abs=0.001)
    assert off["rope + canon ABCD"] == pytest.approx(0.017, abs=0.001)
