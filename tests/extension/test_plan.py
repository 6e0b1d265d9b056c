"""extension/plan.py: one plan for every way into an extension (the CLI's request, a sweep's `extend` group),
validated once, and one `execute` that writes LongRoPE's factors file whoever asked for the search."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus

from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.longrope_search import FACTORS_FILE
from posenc_cli.extension.plan import (
    ExtendRequest,
    Remap,
    Scale,
    SearchThenScale,
    execute,
    one_method,
    plan_extension,
    plan_from_config,
)
from posenc_cli.rope_scaling import method_names
from posenc_cli.rope_scaling.longrope import read_factors_file
from posenc_cli.run.train import train

RUN = Path("/nowhere/rope")  # planning reads no run


def test_a_request_becomes_one_of_three_plans_with_the_default_directories() -> None:
    scale = plan_extension(ExtendRequest(run=RUN, factor=2.0, finetune_steps=3))
    assert isinstance(scale, Scale) and scale.ext.method == "yarn" and scale.ext.finetune_steps == 3
    assert scale.out == RUN.with_name("rope-yarnx2-ft3")
    search = plan_extension(ExtendRequest(run=RUN, search=True, search_budget=5))
    assert isinstance(search, SearchThenScale) and search.ext.method == "longrope" and search.budget == 5
    remap = plan_extension(ExtendRequest(run=RUN, method="rerope", window=8, logn=False))
    assert isinstance(remap, Remap) and remap.remap.window == 8 and remap.logn is False
    assert remap.out == RUN.with_name("rope-rerope-w8-nologn")
    given = plan_extension(ExtendRequest(run=RUN, method="llama3", params={"high_freq_factor": 8.0}, out=Path("x")))
    assert isinstance(given, Scale) and given.ext.params.high_freq_factor == 8.0  # type: ignore[attr-defined]
    assert given.out == Path("x")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (ExtendRequest(run=RUN, method="yarn", window=4), "--window belongs to --method self-extend or rerope"),
        (ExtendRequest(run=RUN, method="rerope", window=4, factor=2.0), "--factor does not apply to --method rerope"),
        (ExtendRequest(run=RUN, method="rerope", window=4, params={"beta_fast": 8.0}), "--beta-fast does not apply"),
        (ExtendRequest(run=RUN, method="self-extend", window=4), "--method self-extend needs --group G"),
        (ExtendRequest(run=RUN, method="rerope"), "--method rerope needs --window W"),
        (ExtendRequest(run=RUN, method="linear", search=True), "--search belongs to LongRoPE"),
        (ExtendRequest(run=RUN, method="longrope"), "LongRoPE needs its factors"),
        (ExtendRequest(run=RUN, method="foo"), "unknown scaling method 'foo'"),
        (ExtendRequest(run=RUN, factor=1.0), "extend.factor must be > 1"),
        (ExtendRequest(run=RUN, method="linear", params={"beta_fast": 8.0}), r"--beta-fast belongs to YaRN \(--yarn\)"),
        (ExtendRequest(run=RUN, params={"long_factor": [2.0]}), r"--long-factor belongs to LongRoPE \(--longrope\)"),
    ],
)
def test_bad_requests_are_refused_in_one_line(request_: ExtendRequest, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        plan_extension(request_)
    assert "\n" not in str(e.value)


def test_one_method_among_the_flags() -> None:
    assert one_method([]) is None and one_method(["yarn", "yarn"]) == "yarn"
    with pytest.raises(ConfigError, match="give one scaling method, got linear, yarn"):
        one_method(["linear", "yarn"])
    with pytest.raises(ConfigError, match="give one method, got yarn, rerope"):
        one_method(["yarn", "rerope"])


def test_a_sweep_group_plans_the_same_kinds_and_keeps_its_settings_whole() -> None:
    remap = plan_from_config(ExtendConfig(remap="self-extend", remap_window=8, remap_group=2), RUN, "job")
    assert isinstance(remap, Remap) and remap.remap.group == 2 and remap.out == Path("job")
    ext = ExtendConfig(method="longrope", longrope_search=3, longrope_search_seed=7)
    search = plan_from_config(ext, RUN, "job", threads=1)
    assert isinstance(search, SearchThenScale) and (search.budget, search.seed, search.threads) == (3, 7, 1)
    assert search.ext is ext  # recorded in the child's config as the sweep planned it
    assert isinstance(plan_from_config(ExtendConfig(method="ntk"), RUN, "job"), Scale)
    with pytest.raises(ConfigError, match="LongRoPE needs its factors"):  # all-ones factors: plain RoPE, mislabelled
        plan_from_config(ExtendConfig(method="longrope"), RUN, "job")


@pytest.mark.parametrize("layers", ["global", "all"])
def test_a_sweep_remapping_and_the_command_plan_the_same_layers(layers: str) -> None:
    """One planner: `extend.layers` reaches a sweep's remapping as `--layers` reaches the command's (before, the
    sweep's remapping always changed the global layers)."""
    ext = ExtendConfig(remap="rerope", remap_window=8, layers=layers)  # type: ignore[arg-type]
    from_sweep = plan_from_config(ext, RUN, "job")
    request = ExtendRequest(run=RUN, out=Path("job"), method="rerope", window=8, layers=layers)
    assert from_sweep == plan_extension(request)
    assert isinstance(from_sweep, Remap) and from_sweep.layers == layers


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan-runs")
    train(tiny_config(write_corpus(root), pos="rope", steps=2), root / "rope")
    return root / "rope"


def test_a_sweep_search_writes_the_factors_file_as_the_command_does(rope_run: Path, tmp_path: Path) -> None:
    ext = ExtendConfig(method="longrope", factor=2.0, longrope_search=2)
    outcome = execute(plan_from_config(ext, rope_run, tmp_path / "job"))
    assert outcome.search is not None and outcome.factors_file == tmp_path / "job" / FACTORS_FILE
    factors = read_factors_file(outcome.factors_file)
    assert factors["long_factor"] == outcome.search.long_factor
    assert json.loads(outcome.factors_file.read_text())["search"]["budget"] == 2
    again = execute(plan_from_config(ext, rope_run, tmp_path / "job"))  # recognised: no search, nothing rewritten
    assert again.result.status == "already_complete" and again.search is None and again.factors_file is None


# Plans a request in a fresh interpreter, runs it, and prints the refusal and whether torch was imported.
_REFUSED = """
import sys
from pathlib import Path
from posenc_cli.config import ExtendConfig
from posenc_cli.errors import UserError
from posenc_cli.extension.plan import ExtendRequest, execute, plan_extension, plan_from_config
run, kind = Path(sys.argv[1]), sys.argv[2]
remap = {"rerope": {"method": "rerope", "window": 8}, "self-extend": {"method": "self-extend", "window": 8}}
try:
    if kind == "sweep":
        execute(plan_from_config(ExtendConfig(method="linear", factor=2.0), run, run.with_name("job")))
    elif kind == "sweep-remap":
        execute(plan_from_config(ExtendConfig(remap="rerope", remap_window=8), run, run.with_name("job")))
    elif kind in remap:
        execute(plan_extension(ExtendRequest(run=run, **remap[kind])))
    elif kind == "method":
        execute(plan_extension(ExtendRequest(run=run, method=sys.argv[3])))
    else:
        execute(plan_extension(ExtendRequest(run=run, search=kind == "search", factor=float(sys.argv[3]))))
except UserError as e:
    print(e)
print("torch loaded:", "torch" in sys.modules)
"""


@pytest.mark.parametrize(
    ("parent", "kind", "factor", "message"),
    [
        ("missing", "scale", "4", "run directory {run} does not exist"),
        ("missing", "search", "4", "run directory {run} does not exist"),
        ("missing", "sweep", "0", "run directory {run} does not exist"),
        ("empty", "scale", "4", "{run} is not a posenc run directory (no meta.json)"),
        ("missing", "scale", "1", "extend.factor must be > 1, got 1.0"),
        ("missing", "rerope", "", "run directory {run} does not exist"),
        ("missing", "sweep-remap", "", "run directory {run} does not exist"),
        ("empty", "rerope", "", "{run} is not a posenc run directory (no meta.json)"),
        ("missing", "self-extend", "", "--method self-extend needs --group G"),
        ("missing", "method", "foo", "unknown scaling method 'foo' (available: {methods})"),
    ],
)
def test_a_refusal_that_needs_no_checkpoint_comes_before_torch(
    tmp_path: Path, parent: str, kind: str, factor: str, message: str
) -> None:
    """A scaling, a search or a remapping (from the command or a sweep) of a parent that is not there or not a run,
    or with a bad setting or an unknown method, is refused in one line without importing torch (which takes
    seconds; a remapping's plan, and an unknown method's, imported it until its settings moved to `config`)."""
    run = tmp_path / parent
    if parent == "empty":
        run.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED, str(run), kind, factor], capture_output=True, text=True, timeout=120
    )
    expected = message.format(run=run, methods=", ".join(method_names()))
    assert done.stdout.splitlines() == [expected, "torch loaded: False"], done.stderr
