"""`posenc eval-extrapolate` end to end on tiny trained runs: table, files, n/a, reuse, data overrides, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_utils import train_scheme_runs
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.data.sources.text import TextDataConfig
from posenc_cli.evaluation.perplexity.measuring import evaluate_model
from posenc_cli.evaluation.results import cell_group, load_results
from posenc_cli.evaluation.tasks import extrapolate as extrapolate_task  # where the measuring functions are called
from posenc_cli.evaluation.tasks.extrapolate import evaluate_paths

runner = CliRunner()
SCHEMES = ("alibi", "learned", "rope")


def corpus_text(n: int, offset: int = 0) -> str:
    lines = (f"Entry {i}: {i * 7 % 13} apples and {i % 5} pears went to market.\n" for i in range(offset, offset + n))
    return "".join(lines)


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep-like directory with three tiny runs (seq_len 16, 10 steps) trained on a small text corpus."""
    root = tmp_path_factory.mktemp("eval-runs")
    corpus = root / "corpus.txt"
    corpus.write_text(corpus_text(1500))
    data = TextDataConfig(paths=[str(corpus)], val_fraction=0.1)
    train_scheme_runs(root / "sweep", SCHEMES, data, seq_len=16, batch_size=4, steps=10, warmup_steps=2, log_every=5)
    return root


def invoke(*args: object) -> object:
    return runner.invoke(app, ["eval-extrapolate", *map(str, args)], terminal_width=200)


def test_table_json_plots_and_na(runs_root: Path, tmp_path: Path) -> None:
    plot, out_json = tmp_path / "p" / "ppl.png", tmp_path / "all.json"
    result = invoke(runs_root / "sweep", "--lengths", "0.5,1,2", "--tokens", 64, "--plot", plot, "--json", out_json)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "nonoverlap" in out and "trained at 16 tokens" in out
    for scheme in SCHEMES:  # run dirs named after their scheme are labelled by the name alone
        assert f"│ {scheme} " in out and f"{scheme} ({scheme})" not in out
    assert "n/a" in out and "supports at most 16 positions" in out
    assert plot.stat().st_size > 0 and (tmp_path / "p" / "ppl_per_position.png").stat().st_size > 0

    combined = json.loads(out_json.read_text())
    assert [r["scheme"] for r in combined["runs"]] == list(SCHEMES)
    for run in combined["runs"]:
        stored = load_results(run["path"])
        assert stored["train_length"] == stored["base_length"] == 16
        cells = [e for e in stored["entries"] if e["tokens"] in (64, 72)]
        assert sorted(e["length"] for e in cells) == [8, 16, 32]
        learned = run["scheme"] == "learned"
        assert [e["status"] for e in run["entries"]] == ["ok", "ok", "n/a" if learned else "ok"]
        ok = [e for e in run["entries"] if e["status"] == "ok"]
        assert all(e["ppl"] > 1 and e["bpb"] > 0 and len(e["per_position"]) == e["length"] for e in ok)


def test_runs_are_paired_and_match_own_validation_split(runs_root: Path) -> None:
    """Every run scores the same tokens of its own validation split (same tokenizer, same corpus)."""
    from posenc_cli.config import EvalConfig
    from posenc_cli.data.cache import load_corpus
    from posenc_cli.run.load import load_run

    cfg = EvalConfig(abs_lengths=[16], tokens=48)
    results = evaluate_paths([runs_root / "sweep"], cfg, device="cpu")
    fingerprints = {r["entries"][0]["data"]["fingerprint"] for r in results}
    assert len(fingerprints) == 1 and all(r["entries"][0]["tokens"] == 48 for r in results)
    run = load_run(runs_root / "sweep" / "rope")
    val = load_corpus(run.config.data, run.config.tokenizer, tokenizer=run.tokenizer).val
    direct = evaluate_model(run.model, val, run.tokenizer.token_bytes, length=16, n_tokens=48)
    assert results[2]["entries"][0]["nll"] == pytest.approx(direct["nll"], rel=1e-6)


def test_reuse_without_force_does_no_forward(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = runs_root / "sweep" / "rope"
    assert invoke(run, "--lengths", "1,2", "--tokens", 80).exit_code == 0
    monkeypatch.setattr(extrapolate_task, "evaluate_model", lambda *a, **k: pytest.fail("forward without --force"))
    result = invoke(run, "--lengths", "1,2", "--tokens", 80)
    assert result.exit_code == 0, result.output
    assert "2 of 2 cells reused" in result.output
    calls = []
    monkeypatch.setattr(
        extrapolate_task, "evaluate_model", lambda *a, **k: calls.append(k["length"]) or _fake_result(k)
    )
    assert invoke(run, "--lengths", "1,2", "--tokens", 80, "--force").exit_code == 0
    assert calls == [16, 32]


def _fake_result(kwargs: dict) -> dict:
    n = kwargs["length"]
    return {"tokens": 80, "windows": 5, "stride": n, "nll": 1.0, "ppl": 2.718, "bpb": 1.4, "bytes": 80,
            "per_position": [1.0] * n}  # fmt: skip


def test_sliding_protocol(runs_root: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "s.json"
    result = invoke(runs_root / "sweep" / "alibi", "--protocol", "sliding", "--abs-lengths", "32", "--tokens", 64,
                    "--json", out_json)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "sliding, stride L/2" in result.output
    (entry,) = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert entry["protocol"] == "sliding" and entry["stride"] == 16 and len(entry["per_position"]) == 16


def test_streaming_protocol(runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out_json = tmp_path / "s.json"
    run = runs_root / "sweep" / "rope"
    args = ["--protocol", "streaming", "--window", 6, "--sinks", 2, "--abs-lengths", "16,48", "--tokens", 96]
    result = invoke(run, *args, "--json", out_json)
    assert result.exit_code == 0, result.output
    assert "streaming, window 6, 2 sinks, blocks of 1" in result.output
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert [(e["length"], e["tokens"], e["window"], e["sinks"], e["stride"]) for e in entries] == [
        (16, 96, 6, 2, 1), (48, 96, 6, 2, 1)]  # fmt: skip
    # keyed by window and sinks: another cache is measured, the same one reused without a forward
    assert invoke(run, *args[:5], 0, *args[6:]).exit_code == 0
    monkeypatch.setattr(extrapolate_task, "evaluate_streaming", lambda *a, **k: pytest.fail("recomputed a stored cell"))
    assert invoke(run, *args).exit_code == 0
    monkeypatch.undo()
    stored = [e for e in load_results(run)["entries"] if e["protocol"] == "streaming"]
    assert sorted({e["sinks"] for e in stored}) == [0, 2] and len(stored) == 4
    # learned positions (a table of 16): a cache of 2 + 15 + 2 - 1 positions is beyond them, n/a with the reason
    result = invoke(runs_root / "sweep" / "learned", *args[:2], "--window", 15, "--stride", 2, "--abs-lengths", 32,
                    "--tokens", 32, "--json", out_json)  # fmt: skip
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert entry["status"] == "n/a" and "supports at most 16 positions" in entry["reason"]
    # the default window (16 - 4 sinks - 4 + 1 = 9) keeps the cache within the 16 positions
    result = invoke(runs_root / "sweep" / "learned", *args[:2], "--stride", 4, "--abs-lengths", 64, "--tokens", 64,
                    "--json", out_json)  # fmt: skip
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert (entry["status"], entry["window"], entry["sinks"], entry["stride"]) == ("ok", 9, 4, 4)


def test_data_override_scores_another_corpus(runs_root: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.txt"
    other.write_text(corpus_text(600, offset=5000).upper())
    out_json = tmp_path / "o.json"
    run = runs_root / "sweep" / "rope"
    assert invoke(run, "--lengths", "1", "--tokens", 96).exit_code == 0
    result = invoke(run, "data=text", f"data.paths=[{other}]", "--lengths", "1", "--tokens", 96, "--json", out_json)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert entry["data"]["name"] == "text:other.txt"
    stored = [e for e in load_results(run)["entries"] if e["length"] == 16 and e["tokens"] == 96]
    assert len({e["data"]["fingerprint"] for e in stored}) == 2  # both kept, told apart by fingerprint
    assert entry["ppl"] != pytest.approx(next(e for e in stored if e is not entry)["ppl"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such directory"),
        (["{empty}"], "not a run directory and contains none"),
        (["{file}"], "not a directory"),
        ([], "at least one run directory"),
        (["{run}", "--stride", "4"], "needs eval.protocol (--protocol) sliding or streaming"),
        (["{run}", "--window", "4"], "--protocol streaming only"),
        (["{run}", "--protocol", "streaming", "--sinks", "-1"], "--sinks must be in [0, 4194304], got -1"),
        (["{run}", "--protocol", "diagonal"], "nonoverlap, sliding"),
        (["{run}", "--lengths", "1,two"], "comma-separated"),
        (["{run}", "--lengths", "1", "--abs-lengths", "16"], "not both"),
        (["{run}", "--lenghts", "1"], "unknown option --lenghts"),
        (["{run}", "model=tiny"], "only data overrides"),
        (["{run}", "--tokens", "0"], "--tokens must be in [1, 4194304], got 0"),
    ],
)
def test_errors_exit_2(runs_root: Path, tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "f.txt").write_text("x")
    names = {
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
        "file": tmp_path / "f.txt",
        "run": runs_root / "sweep" / "rope",
    }
    result = invoke(*[a.format(**names) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_held_out_file_is_scored_whole(runs_root: Path, tmp_path: Path) -> None:
    """`data=text 'data.paths=[held_out.txt]'` scored only the file's 2% tail, and called 16x "cannot read"."""
    held = tmp_path / "held_out.txt"
    held.write_text(corpus_text(60, offset=9000))  # about 3,500 bytes: the 2% tail holds about 70 tokens
    out_json = tmp_path / "h.json"
    run = runs_root / "sweep" / "rope"
    result = invoke(run, "data=text", f"data.paths=[{held}]", "--abs-lengths", "16,256", "--tokens", 512,
                    "--json", out_json)  # fmt: skip
    assert result.exit_code == 0, result.output
    entries = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert [(e["length"], e["status"], e["tokens"]) for e in entries] == [(16, "ok", 512), (256, "ok", 512)]
    assert entries[0]["data"]["name"] == "text:held_out.txt"


def test_too_few_tokens_is_its_own_state_not_the_schemes_limit(runs_root: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text(corpus_text(3, offset=100))  # about 170 tokens: no window of 256
    out_json = tmp_path / "s.json"
    result = invoke(runs_root / "sweep" / "rope", "data=text", f"data.paths=[{short}]", "--abs-lengths", "16,256",
                    "--tokens", 32, "--json", out_json)  # fmt: skip
    assert result.exit_code == 0, result.output
    (_, entry) = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert entry["status"] == "too_few_tokens" and entry["tokens"] == 0 and "one window needs 257" in entry["reason"]
    assert "n/a" not in result.stdout and "cannot read" not in result.stdout  # not the scheme's legend
    assert "n/m for rope at 256: validation split has" in result.stdout and "scored whole" in result.stdout
    # the scheme's own limit still reads n/a
    result = invoke(runs_root / "sweep" / "learned", "--abs-lengths", "16,32", "--tokens", 32)
    assert result.exit_code == 0 and "n/a = the scheme cannot read" in result.stdout


def test_two_corpora_on_one_run_are_two_cells_both_kept(runs_root: Path, tmp_path: Path) -> None:
    run = runs_root / "sweep" / "alibi"
    files = []
    for name, offset in (("a.txt", 20000), ("b.txt", 30000)):
        files.append(tmp_path / name)
        files[-1].write_text(corpus_text(300, offset=offset))
    for args in ([], ["data=text", f"data.paths=[{files[0]}]"], ["data=text", f"data.paths=[{files[1]}]"]):
        assert invoke(run, *args, "--abs-lengths", 32, "--tokens", 64).exit_code == 0
    stored = [
        e for e in load_results(run)["entries"] if (e["protocol"], e["length"], e["tokens"]) == ("nonoverlap", 32, 64)
    ]
    assert sorted(e["data"]["name"] for e in stored) == ["text:a.txt", "text:b.txt", "text:corpus.txt"]
    assert len({e["data"]["fingerprint"] for e in stored}) == 3
    assert len({cell_group(e) for e in stored}) == 3  # three rows for compare, never one mixed row
    for name in ("text:a.txt", "text:b.txt", "text:corpus.txt"):  # one cell of each corpus at length 32
        assert [e["length"] for e in stored if e["data"]["name"] == name] == [32]


def test_data_tasks_composes_for_evaluation(runs_root: Path, tmp_path: Path) -> None:
    """`train data=tasks` worked while `eval-extrapolate RUN data=tasks` said it was no data config."""
    out_json = tmp_path / "t.json"
    result = invoke(runs_root / "sweep" / "rope", "data=tasks", "data.episodes=60", "--abs-lengths", 16,
                    "--tokens", 32, "--json", out_json)  # fmt: skip
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(out_json.read_text())["runs"][0]["entries"]
    assert entry["status"] == "ok" and entry["data"]["name"].startswith("tasks(")


def test_broken_run_in_a_searched_folder_is_skipped_named_one_refused(runs_root: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "leftovers"
    for name in ("rope", "alibi", "learned"):
        shutil.copytree(runs_root / "sweep" / name, folder / name)
    (folder / "alibi" / "config.yaml").write_text("model: {d_model: 7}\n")  # damaged: checksum mismatch
    weights = folder / "learned" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # damaged weights: found only when loading
    result = invoke(folder, "--abs-lengths", 16, "--tokens", 32)
    assert result.exit_code == 0, result.output
    assert f"skipped {folder / 'alibi'}" in result.stderr and "config.yaml" in result.stderr
    assert f"skipped {folder / 'learned'}" in result.stderr and "checksum mismatch" in result.stderr
    assert "│ rope " in result.stdout and "1 run(s) evaluated" in result.stdout
    result = invoke(folder / "alibi", folder / "rope", "--abs-lengths", 16, "--tokens", 32)
    assert result.exit_code == 2 and str(folder / "alibi") in result.output and "Traceback" not in result.output
    assert "[1/" not in result.output  # refused before anything was measured


def test_plain_progress_lines_when_not_a_terminal(runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc_cli.run import progress

    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # as if the evaluation took longer than the quiet start
    result = invoke(runs_root / "sweep" / "rope", "--abs-lengths", "16,32", "--tokens", 64, "--force")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert any(line.startswith("[1/1] rope: ") for line in lines)
    assert any("[1/1] rope L=32 (windows): 2/2 | elapsed" in line for line in lines)  # each completed cell
    assert "elapsed" not in result.stdout  # the table stays alone on stdout


def test_positions_random_on_a_run_without_them_is_one_line(runs_root: Path) -> None:
    result = invoke(runs_root / "sweep" / "rope", "--positions", "random", "--abs-lengths", 16)
    assert result.exit_code == 2 and "not trained with randomized positions" in result.output
    assert str(runs_root / "sweep" / "rope") in result.output
    result = invoke(runs_root / "sweep" / "rope", "--positions", "shuffled")
    assert result.exit_code == 2 and "random or sequential" in result.output


def test_a_file_the_run_trained_on_is_not_scored_whole(runs_root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "renamed.txt"
    copy.write_bytes((runs_root / "corpus.txt").read_bytes())  # the training corpus under another name
    run = runs_root / "sweep" / "rope"
    for path in (runs_root / "corpus.txt", copy):
        result = invoke(run, "data=text", f"data.paths=[{path}]", "--abs-lengths", 16, "--tokens", 32)
        assert result.exit_code == 2, result.output
        assert f"{path.name} is in the training data of {run}" in result.output and "[1/" not in result.output
    split = invoke(run, "data=text", f"data.paths=[{copy}]", "data.val_fraction=0.1", "--abs-lengths", 16)
    assert split.exit_code == 0, split.output  # its held-out tail, asked for
