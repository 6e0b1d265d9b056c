"""Sweep files expand into the jobs Hydra's basic sweeper would run, named by their swept overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc_cli.config import config_dir
from posenc_cli.errors import ConfigError
from posenc_cli.sweep.hydra_bridge import MAX_NAME_BYTES, job_name, short_name
from posenc_cli.sweep.plan import plan_sweep, validate_plan
from posenc_cli.sweep.spec import find_sweep_file, load_sweep_spec


def write(tmp_path: Path, text: str, name: str = "mine") -> Path:
    (tmp_path / "sweep").mkdir(exist_ok=True)
    path = tmp_path / "sweep" / f"{name}.yaml"
    path.write_text(text)
    return path


TWO_STAGES = """
overrides: [model=tiny, train.steps=5]
stages:
  - name: train
    params: {pos: "rope,alibi", train.seed: "0,1"}
  - name: extend
    action: extend
    parent: train/pos=rope
    params: {extend.factor: "2,4"}
    label: "{parent} → x{extend.factor}"
"""


def test_cartesian_product_and_names(tmp_path: Path) -> None:
    plans = plan_sweep(load_sweep_spec(write(tmp_path, TWO_STAGES)), [])
    train, extend = plans
    assert sorted(j.name for j in train.jobs) == sorted(
        f"pos={p},train.seed={s}" for p in ("rope", "alibi") for s in (0, 1)
    )
    # Seeds are left out of labels so the table can average over them.
    assert {j.label for j in train.jobs} == {"rope", "alibi"}
    # The extend stage runs once per matching parent (two rope seeds) and factor.
    assert len(extend.jobs) == 4
    assert {j.parent for j in extend.jobs} == {"train/pos=rope,train.seed=0", "train/pos=rope,train.seed=1"}
    job = extend.jobs[0]
    assert job.dir(Path("S")) == Path("S/extend") / job.parent.split("/", 1)[1] / job.name
    assert job.label.startswith("rope → x")


def test_user_overrides_replace_or_extend_the_sweep(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, TWO_STAGES))
    train, extend = plan_sweep(spec, ["pos=alibi,nope", "train.steps=9"])
    assert sorted({j.name.split(",")[0] for j in train.jobs}) == ["pos=alibi", "pos=nope"]
    assert all("train.steps=9" in j.overrides and "train.steps=5" not in j.overrides for j in train.jobs)
    assert extend.jobs == []  # no rope run left to extend
    # A swept key the file does not sweep goes to the first stage.
    train, _ = plan_sweep(spec, ["model=tiny,small"])
    assert len(train.jobs) == 8


@pytest.mark.integration  # composes every shipped sweep's jobs
def test_shipped_sweeps_expand_and_validate() -> None:
    root = config_dir()
    counts = {}
    for name in ("extrapolation", "seeds", "rope_scaling", "sizes", "passkey", "context-extension", "tasks"):
        path = find_sweep_file(name, [root])
        assert path.read_text().startswith(f"# posenc sweep {name}")
        plans = plan_sweep(load_sweep_spec(path), [])
        validate_plan(plans, None)
        counts[name] = [len(p.jobs) for p in plans]
    assert counts == {"extrapolation": [5, 2], "seeds": [15], "rope_scaling": [1, 15], "sizes": [10], "passkey": [11],
                      "context-extension": [1, 10, 4, 2, 2, 1, 1], "tasks": [10, 5, 15]}  # fmt: skip


def test_bad_override_is_rejected_before_anything_runs(tmp_path: Path) -> None:
    plans = plan_sweep(load_sweep_spec(write(tmp_path, TWO_STAGES)), ["model.n_layr=3"])
    with pytest.raises(ConfigError, match="unknown config key 'model.n_layr'"):
        validate_plan(plans, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages: []", "non-empty 'stages'"),
        ("stages: [{action: train}]", "needs a 'name'"),
        ("stages: [{name: a, action: fly}]", "action must be train, extend or select"),
        ("stages: [{name: a, action: extend}]", "needs parent"),
        ("stages: [{name: a, colour: red}]", "unknown key 'colour'"),
        ("stages: [{name: a}]\nwhatever: 1", "unknown sweep key 'whatever'"),
    ],
)
def test_malformed_sweep_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_sweep_spec(write(tmp_path, text))


def test_unknown_sweep_name_lists_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no sweep file named 'nope'.*extrapolation"):
        find_sweep_file("nope", [tmp_path, config_dir()])


def test_label_template_reads_a_key_the_user_fixed_instead_of_sweeping() -> None:
    """`extend.finetune_steps=0` on the command line replaces the swept 0,60: the label still names its value."""
    spec = load_sweep_spec(find_sweep_file("extrapolation", [config_dir()]))
    extend = plan_sweep(spec, ["extend.finetune_steps=0"])[1]
    assert [j.label for j in extend.jobs] == ["rope → yarn x4, ft 0"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages: [{name: a, parnet: train}]", "unknown key 'parnet' (did you mean parent?)"),
        ("stage: [{name: a}]\nstages: [{name: a}]", "unknown sweep key 'stage' (did you mean stages?)"),
        (
            "stages: [{name: train}, {name: b, action: extend, parent: trian/pos=rope}]",
            "parent stage 'trian' is not an earlier stage (did you mean train?)",
        ),
    ],
)
def test_sweep_file_typos_suggest_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        plan_sweep(load_sweep_spec(write(tmp_path, text)), [])
    assert message in str(e.value)


def test_sweep_name_and_group_option_typos_suggest_the_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        find_sweep_file("extrapolaton", [tmp_path, config_dir()])
    assert "no sweep file named 'extrapolaton' (did you mean extrapolation?)" in str(e.value)
    spec = load_sweep_spec(find_sweep_file("extrapolation", [config_dir()]))
    typos = (("pos=alibii", "'pos/alibii' (did you mean alibi?)"), ("model=tinny", "(did you mean tiny?)"))
    for override, hint in typos:
        with pytest.raises(ConfigError) as e:
            validate_plan(plan_sweep(spec, [override]), None)
        assert hint in str(e.value) and "(available: " in str(e.value)


def test_one_value_of_a_swept_key_keeps_the_jobs_name(tmp_path: Path) -> None:
    """`posenc sweep extrapolation pos=rope` planned `train/default` (a fixed override names no job); it narrows the
    sweep, so the job keeps the name it has in the full grid, and its extend stage still finds it."""
    plans = plan_sweep(load_sweep_spec(write(tmp_path, TWO_STAGES)), ["pos=rope"])
    train, extend = plans
    assert sorted(j.name for j in train.jobs) == ["pos=rope,train.seed=0", "pos=rope,train.seed=1"]
    assert {j.parent for j in extend.jobs} == {"train/pos=rope,train.seed=0", "train/pos=rope,train.seed=1"}
    spec = load_sweep_spec(find_sweep_file("extrapolation", [config_dir()]))
    (train, *_) = plan_sweep(spec, ["pos=rope"])
    assert [(j.name, j.label) for j in train.jobs] == [("pos=rope", "rope")]
    (train, *_) = plan_sweep(spec, ["train.steps=5"])  # a key no stage sweeps stays fixed: no name
    assert "train.steps=5" not in {line for j in train.jobs for line in j.swept}


def test_a_long_job_name_is_shortened_deterministically() -> None:
    """A swept long list (pos.layers of a deep layout) would name a directory past the 255 bytes a file name may
    have; the name keeps a readable prefix and a hash of the whole, and short names are unchanged."""
    short = ["pos=rope", "train.seed=1"]
    assert job_name(short) == "pos=rope,train.seed=1"
    layers = "[" + ",".join(["rope"] * 30 + ["nope"] * 30) + "]"
    other = "[" + ",".join(["rope"] * 30 + ["nope"] * 29 + ["rope"]) + "]"
    long_a, long_b = job_name([f"pos.layers={layers}", "pos=layout"]), job_name([f"pos.layers={other}", "pos=layout"])
    assert len(f"pos.layers={layers},pos=layout".encode()) > MAX_NAME_BYTES
    assert len(long_a.encode()) == MAX_NAME_BYTES and long_a.startswith("pos.layers=[rope,rope,")
    assert long_a != long_b and long_a == job_name(["pos=layout", f"pos.layers={layers}"])
    assert short_name("é" * 200).encode().decode() == short_name("é" * 200)  # never cut inside a character


def test_label_template_reads_a_group_choice_and_its_keys(tmp_path: Path) -> None:
    """`train=quick` beside a swept `train.lr`: `{train}` is the choice and `{train.lr}` the value (it raised
    AttributeError on the choice's string before); an unknown key is one ConfigError."""
    text = """
overrides: [model=tiny, train=quick]
stages:
  - name: grid
    params: {pos: "rope", train.lr: "3e-4,1e-3"}
    label: "{pos} {train} lr {train.lr}{model.n_layer}"
"""
    (plan,) = plan_sweep(load_sweep_spec(write(tmp_path, text)), [])
    assert sorted(j.label for j in plan.jobs) == ["rope quick lr 0.0003", "rope quick lr 0.001"]
    bad = text.replace("{model.n_layer}", "{colour}")
    with pytest.raises(ConfigError, match="label template .*'colour'"):
        plan_sweep(load_sweep_spec(write(tmp_path, bad, name="bad")), [])
