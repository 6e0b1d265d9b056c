"""`posenc eval-passkey` end to end on tiny runs trained on data=passkey: table, files, n/a, reuse, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_utils import train_scheme_runs
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.data.sources.passkey import PasskeyDataConfig
from posenc_cli.errors import ConfigError

runner = CliRunner()
SCHEMES = ("learned", "nope")


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny runs (seq_len 128, 4 steps) on 60 passkey episodes."""
    root = tmp_path_factory.mktemp("passkey-runs")
    data = PasskeyDataConfig(passkey_episodes=60, val_fraction=0.2)
    train_scheme_runs(root / "sweep", SCHEMES, data, seq_len=128, batch_size=2, steps=4, warmup_steps=1, log_every=2)
    return root


def invoke(*args: object) -> object:
    return runner.invoke(app, ["eval-passkey", *map(str, args)], terminal_width=200)


def test_table_json_plot_and_na(runs_root: Path, tmp_path: Path) -> None:
    plot, out_json = tmp_path / "p" / "passkey.png", tmp_path / "all.json"
    args = ("--lengths", "1,2", "--depths", "0,1", "--trials", 2, "--device", "cpu")
    result = invoke(runs_root / "sweep", *args, "--plot", plot, "--json", out_json)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Passkey retrieval accuracy" in out and "trained at 128 tokens" in out
    assert "length \\ depth" in out and "100%" in out and "2× · 256" in out
    assert "n/a for learned at 256: scheme 'learned' supports at most 128 positions" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"

    combined = json.loads(out_json.read_text())
    assert [r["scheme"] for r in combined["runs"]] == list(SCHEMES)
    for run in combined["runs"]:
        stored = json.loads((Path(run["path"]) / "eval" / "passkey.json").read_text())
        assert stored["schema_version"] == 1 and stored["train_length"] == stored["base_length"] == 128
        assert [(e["length"], e["depth"]) for e in stored["entries"]] == [
            (128, 0.0),
            (128, 1.0),
            (256, 0.0),
            (256, 1.0),
        ]
        learned = run["scheme"] == "learned"
        assert [e["status"] for e in run["entries"]] == ["ok", "ok"] + (["n/a"] * 2 if learned else ["ok"] * 2)
        for e in run["entries"]:
            if e["status"] == "ok":
                assert e["trials"] == 2 and e["correct"] in (0, 1, 2) and e["accuracy"] == e["correct"] / 2

    again = invoke(runs_root / "sweep", *args)
    assert again.exit_code == 0 and "8 of 8 cells reused" in again.output


def test_abs_lengths_too_short_for_a_prompt(runs_root: Path) -> None:
    result = invoke(runs_root / "sweep" / "nope", "--abs-lengths", "64", "--trials", 1, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "shorter than a prompt without filler" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give at least one run directory"),
        (("{missing}",), "no such directory"),
        (("{run}", "--depths", "0,1.5"), "--depths must be fractions in [0, 1]"),
        (("{run}", "--depths", "a,b"), "expected comma-separated numbers"),
        (("{run}", "--lengths", "1", "--abs-lengths", "128"), "either --lengths"),
        (("{run}", "--trials", "0"), "--trials"),
        (("{run}", "--dtype", "fp16"), "--dtype must be"),
        (("{run}", "data=text"), "unexpected argument data=text"),
    ],
)
def test_user_errors_exit_2(runs_root: Path, tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    names = {"missing": tmp_path / "nope-not-here", "run": runs_root / "sweep" / "nope"}
    result = invoke(*[a.format(**names) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_data_command_summarises_the_passkey_corpus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    result = runner.invoke(app, ["data", "data=passkey", "data.passkey_episodes=50"])
    assert result.exit_code == 0, result.output
    assert "passkey: 50 episodes" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--lengths", "1000000"), "--lengths 1e+06 --trials 10: 128,000,000 tokens per prompt for "),
        (("--abs-lengths", "1e12"), "--abs-lengths 1000000000000 --trials 10: 1,000,000,000,000 tokens per prompt"),
        (("--trials", "1000000", "--lengths", "100"), "--trials 1000000: 12,800 tokens per prompt for "),
    ],
)
def test_impossible_grids_are_refused_before_allocating(
    runs_root: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], message: str
) -> None:
    """These ended in allocation tracebacks: the prompts of one length are built at once."""
    import posenc_cli.evaluation.passkey as pk
    from posenc_cli.run import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 16 * 2**30)
    monkeypatch.setattr(pk, "build_prompts", lambda *a, **k: pytest.fail("allocated prompts"))
    result = invoke(runs_root / "sweep" / "nope", *args, "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert message in result.output and "16.0 GiB is available" in result.output
    assert "Traceback" not in result.output


def test_lengths_beyond_the_scheme_are_na_not_refused(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc_cli.run import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 16 * 2**30)
    args = ("--lengths", "1000000", "--depths", "0", "--trials", 1, "--device", "cpu")
    result = invoke(runs_root / "sweep" / "learned", *args)  # a table of 128 positions: nothing to allocate
    assert result.exit_code == 0, result.output
    assert "supports at most 128 positions" in result.output


def test_grid_bound_is_a_lower_bound_per_run() -> None:
    from posenc_cli.evaluation.grid import check_grid_fits, grid_bytes
    from posenc_cli.evaluation.passkey import PasskeyConfig

    cfg = PasskeyConfig(lengths=[1, 2, 4, 8], trials=10)
    assert grid_bytes(cfg, 1024, d_model=64, vocab=512) == 5 * 10 * 1024 * 8 + 1024 * 2 * (64 + 512)
    check_grid_fits(cfg, available=2**30)  # an ordinary grid fits in 1 GiB
    with pytest.raises(ConfigError, match="--lengths 8 --trials 10: at least 16 tokens per prompt for any run"):
        check_grid_fits(cfg, available=grid_bytes(cfg, 16) - 1)  # any run: a base length of at least 2


def test_the_competence_gate_from_the_command_line(runs_root: Path) -> None:
    args = ("--lengths", "1,2", "--depths", "0,1", "--trials", 2, "--device", "cpu")
    kept = invoke(runs_root / "sweep", *args, "--competence", "0")  # every accuracy passes a threshold of 0
    assert kept.exit_code == 0, kept.output
    assert "≤L" in kept.output and "below 0%" in " ".join(kept.output.split())
    rows = [line for line in kept.output.splitlines() if "1× · 128" in line]
    assert len(rows) == 2 and not any("not learned" in r or "not trained" in r for r in rows)
    refused = invoke(runs_root / "sweep", *args, "--competence", "1.5")
    assert refused.exit_code == 2 and "--competence must be an accuracy in [0, 1]" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
