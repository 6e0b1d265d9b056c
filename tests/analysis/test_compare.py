"""compare: labels and order wherever a sweep's runs are reached, the sweep's own lengths, n/a vs –, --baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from posenc_cli.analysis import compare
from posenc_cli.analysis import rows as row_setup
from posenc_cli.analysis.gather import gather, labelled_in_order
from posenc_cli.cli import app
from posenc_cli.cli.compare import print_comparison
from posenc_cli.config import Config, EvalConfig, ModelConfig, config_to_yaml
from posenc_cli.evaluation.results import checkpoint_identity, new_results_doc, results_path
from posenc_cli.fsutil import atomic_write_json
from posenc_cli.positional import config_class
from posenc_cli.run.journal import commit_checkpoint
from posenc_cli.run.meta import RunMeta
from posenc_cli.sweep.markers import mark_done as _mark_done

runner = CliRunner()


def entry(length: int, ppl: float | None, base: int = 16) -> dict[str, Any]:
    return {
        "protocol": "nonoverlap",
        "stride": None,
        "length": length,
        "multiple": length / base,
        "tokens": 256,
        "dtype": "fp32",
        "device": "cpu (Test CPU)",
        "data": {"name": "text", "fingerprint": "x"},
        "status": "ok" if ppl is not None else "n/a",
        "reason": None if ppl is not None else "scheme 'learned' supports at most 16 positions",
        "ppl": ppl,
        "nll": None,
        "bpb": None,
        "per_position": [],
        "created": "2025-01-01T00:00:00+00:00",
        "checkpoint": {"step": 1, "model_sha256": None},  # what `fake_run`'s meta.json names
    }


def fake_run(
    run_dir: Path,
    scheme: str,
    ppls: dict[int, float | None],
    lengths: list[float],
    *,
    seed: int = 0,
    steps: int = 400,
    entries: list[dict[str, Any]] | None = None,
    loss_on: str = "all",
) -> None:
    """A run directory with a config (eval.lengths = `lengths`, train.seed, train.steps) trained on corpus "x",
    and stored results (`entries`, else one per `ppls` length), without any weights."""
    cfg = Config(model=ModelConfig(), pos=config_class(scheme)(name=scheme), eval=EvalConfig(lengths=lengths))
    cfg.train.seed, cfg.train.steps, cfg.train.loss_on = seed, steps, loss_on
    commit_checkpoint(
        run_dir,
        {"config.yaml": config_to_yaml(cfg).encode()},
        {
            "kind": "posenc-run",
            "schema_version": 1,
            "step": 1,
            "train_length": 16,
            "base_length": 16,
            "status": "complete",
            "data": {"fingerprint": "x"},
        },
    )
    doc = new_results_doc(run_dir.name, scheme, 16, 16)
    doc["entries"] = entries if entries is not None else [entry(n, p) for n, p in ppls.items()]
    atomic_write_json(results_path(run_dir), doc)
    _mark_done(run_dir, run_dir.name)  # a sweep job counts only with its done marker


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """A sweep planned as [rope, alibi, learned] (not alphabetical), each evaluated at 1×, 2×, 4×; the alibi run
    was later also evaluated ad hoc at 3× (48 tokens); an extend output below it was evaluated at 0.5×..4×."""
    out = tmp_path / "sweep"
    lengths = [1.0, 2.0, 4.0]
    fake_run(out / "train/pos=rope", "rope", {16: 10.0, 32: 12.0, 64: 20.0}, lengths)
    fake_run(out / "train/pos=alibi", "alibi", {16: 9.0, 32: 9.0, 48: 9.1, 64: 12.0}, lengths)
    fake_run(out / "train/pos=learned", "learned", {16: 11.0, 32: None, 64: None}, lengths)
    fake_run(out / "train/pos=rope-yarnx2", "rope", {8: 12.0, 16: 11.0, 32: 11.0, 64: 12.0}, [0.5, 1, 2, 4])
    jobs = [
        {"stage": "train", "name": f"pos={s}", "dir": f"train/pos={s}", "label": s, "parent": None, "swept": {}}
        for s in ("rope", "alibi", "learned")
    ]
    (out / "sweep.json").write_text(json.dumps({"schema_version": 1, "sweep": "t", "jobs": jobs}))
    return out


def labels(records: list[row_setup.RunRecord]) -> list[str]:
    return [r.label for r in records]


def test_one_label_and_order_however_the_runs_are_reached(sweep_dir: Path) -> None:
    expected = ["rope", "alibi", "learned", "train/pos=rope-yarnx2"]
    assert labels(gather([sweep_dir])) == expected
    assert labels(gather([sweep_dir / "train"])) == expected  # was pos=alibi, pos=learned, ... sorted
    assert labels(gather([sweep_dir / "train/pos=alibi"])) == ["alibi"]
    results = [{"path": str(sweep_dir / "train" / d), "scheme": s} for d, s in (("pos=alibi", "alibi"),
               ("pos=learned", "learned"), ("pos=rope", "rope"), ("pos=rope-yarnx2", "rope"))]  # fmt: skip
    assert [r["label"] for r in labelled_in_order(results)] == expected


def test_outside_a_sweep_runs_keep_their_names(tmp_path: Path) -> None:
    fake_run(tmp_path / "runs" / "b", "rope", {16: 10.0}, [1.0])
    fake_run(tmp_path / "runs" / "a-alibi", "alibi", {16: 9.0}, [1.0])
    assert labels(gather([tmp_path / "runs"])) == ["a-alibi", "b (rope)"]


def test_a_sweep_shows_its_own_lengths_unless_asked(sweep_dir: Path) -> None:
    columns, _, _ = compare.comparison(gather([sweep_dir]))
    assert [c.key for c in columns] == [1.0, 2.0, 4.0, "ratio"]  # no 3× of alibi, no 0.5× of the extend output
    assert {e["multiple"] for e in compare.records_to_json(gather([sweep_dir]))} == {1.0, 2.0, 4.0}
    columns, _, _ = compare.comparison(gather([sweep_dir / "train"]))
    assert [c.key for c in columns] == [1.0, 2.0, 4.0, "ratio"]
    columns, _, _ = compare.comparison(gather([sweep_dir], all_lengths=True))
    assert [c.key for c in columns] == [0.5, 1.0, 2.0, 3.0, 4.0, "ratio"]


def test_write_outputs_never_adds_columns_the_sweep_did_not_measure(sweep_dir: Path, tmp_path: Path) -> None:
    compare.write_outputs(gather([sweep_dir]), sweep_dir)
    rows = json.loads((sweep_dir / "results.json").read_text())
    assert sorted({r["multiple"] for r in rows}) == [1.0, 2.0, 4.0]
    header = (sweep_dir / "results.csv").read_text().splitlines()[0]
    assert "dtype" in header and "device" in header
    assert {r["device"] for r in rows} == {"cpu (Test CPU)"}


def render(records: list[row_setup.RunRecord], *, fmt: str = "table", **kw: Any) -> str:
    console = Console(width=200, record=True)
    print_comparison(compare.Comparison(records, **kw), fmt, to=console)
    return console.export_text()


def test_cannot_and_not_measured_look_different(sweep_dir: Path) -> None:
    text = render(gather([sweep_dir], all_lengths=True))
    learned = next(line for line in text.splitlines() if line.startswith("│ learned"))
    cells = [c.strip() for c in learned.split("│")[2:-1]]
    assert cells == ["–", "11.00", "n/a", "–", "n/a", "n/a"]  # 0.5× and 3× never measured; 2×, 4× cannot
    flat = " ".join(text.split())  # the caption wraps at the table's width
    assert "n/a = the scheme cannot read that many tokens (reasons below); – = not measured" in flat
    assert "n/a for learned at 32, 64: scheme 'learned' supports at most 16 positions" in flat
    assert "Measured in fp32 on cpu (Test CPU)." in flat
    markdown = " ".join(render(gather([sweep_dir], all_lengths=True), fmt="markdown").split())
    assert "| learned | – | 11.00 | n/a | – | n/a | n/a |" in markdown and "– = not measured" in markdown


def test_baseline_divides_the_ratio_column_too(sweep_dir: Path) -> None:
    records = gather([sweep_dir])
    columns, rows, title = compare.comparison(records, baseline="alibi")
    assert columns[-1].header == "4× / 1×\n÷ alibi" and "relative to alibi" in title
    rope = next(r for r in rows if r.label == "rope")
    assert rope.cells["ratio"].mean == pytest.approx((20.0 / 10.0) / (12.0 / 9.0))  # was rope's own 2.0
    assert rope.cells[4.0].mean == pytest.approx(20.0 / 12.0)
    alibi = next(r for r in rows if r.label == "alibi")
    assert alibi.cells["ratio"].mean == pytest.approx(1.0)


def test_compare_cli_all_lengths(sweep_dir: Path) -> None:
    result = runner.invoke(app, ["compare", str(sweep_dir), "--format", "markdown"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "3×" not in result.output and "0.5×" not in result.output
    result = runner.invoke(app, ["compare", str(sweep_dir), "--all-lengths", "--format", "markdown"])
    assert result.exit_code == 0 and "3× 48" in result.output


def _checkpoint(run_dir: Path, step: int, weights: bytes) -> dict[str, Any]:
    """Commit fake weights as the run's checkpoint at `step`; its identity, as evaluation records it."""
    meta = {"kind": "posenc-run", "schema_version": 1, "step": step, "train_length": 16, "status": "complete"}
    return checkpoint_identity(RunMeta.from_json(commit_checkpoint(run_dir, {"model.safetensors": weights}, meta)))


def test_cells_of_an_earlier_checkpoint_are_not_measured(tmp_path: Path) -> None:
    fake_run(tmp_path / "runs" / "alibi", "alibi", {16: 9.0, 32: 9.0, 64: 12.0}, [1.0, 2.0, 4.0])
    run = tmp_path / "runs" / "rope"
    old = _checkpoint(run, 1, b"weights at step 1")
    doc = new_results_doc("rope", "rope", 16, 16)
    doc["entries"] = [{**entry(n, p), "checkpoint": old} for n, p in {16: 10.0, 32: 12.0, 64: 20.0}.items()]
    atomic_write_json(results_path(run), doc)
    new = _checkpoint(run, 2, b"weights at step 2")  # trained further: every stored cell is of step 1

    rope = next(r for r in gather([tmp_path / "runs"]) if r.run_dir == run)
    assert (rope.status, rope.entries) == ("missing", [])
    assert "earlier checkpoint, not on step 2" in rope.error

    later = "2025-02-01T00:00:00+00:00"
    doc["entries"].append({**entry(16, 8.0), "checkpoint": new, "created": later})  # 1× measured again
    doc["entries"].append({**entry(32, 5.0), "checkpoint": {**new, "model_sha256": "0" * 64}, "created": later})
    doc["entries"].append({k: v for k, v in entry(64, 4.0).items() if k != "checkpoint"})  # checkpoint unknown
    atomic_write_json(results_path(run), doc)
    text = render(gather([tmp_path / "runs"]))
    row = next(line for line in text.splitlines() if line.startswith("│ rope"))
    assert [c.strip() for c in row.split("│")[2:-1]] == ["8.000", "–", "–", "–"]
    assert "[missing]" not in text


def test_compare_cli_costs(sweep_dir: Path) -> None:
    """--costs adds each run's cost from its job's profile.json ('–' where a run has none)."""
    profile = {"schema_version": 1, "seconds": {"setup": 1.0, "steps": 9.0, "eval L=16": 0.5, "eval L=64": 2.5}}
    (sweep_dir / "train/pos=rope/profile.json").write_text(json.dumps(profile))
    result = runner.invoke(app, ["compare", str(sweep_dir), "--costs"], terminal_width=200)
    assert result.exit_code == 0, result.output
    rope_row = next(line for line in result.output.splitlines() if "Cost per run" not in line and "│ rope " in line
                    and "(L=64)" in line)  # fmt: skip
    assert "10.0" in rope_row and "2.5 (L=64)" in rope_row
    assert "Cost per run" in result.output


# ----------------------------------------------------------------------------------------------------------------
# Numbers that cannot be mixed up: one row is one corpus, one precision, one protocol, and only seeds are averaged.


def cells(text: str, label: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(f"│ {label} "))
    return [c.strip() for c in row.split("│")[2:-1]]


def test_cells_of_two_corpora_are_two_rows_own_corpus_first(tmp_path: Path) -> None:
    """Two `eval-extrapolate data=text` runs on other files after the run's own: newest-per-length picked cells
    from different texts into one row (16 tokens of b.txt next to 32 of a.txt)."""
    later = "2025-03-01T00:00:00+00:00"
    a = [{**entry(n, p), "data": {"name": "text:a.txt", "fingerprint": "a" * 16}} for n, p in ((16, 5.0), (32, 6.0))]
    b = [{**entry(16, 7.0), "data": {"name": "text:b.txt", "fingerprint": "b" * 16}, "created": later}]
    own = [entry(n, p) for n, p in ((16, 10.0), (32, 12.0))]  # data "text", fingerprint "x": the training corpus
    fake_run(tmp_path / "runs" / "rope", "rope", {}, [1.0, 2.0], entries=[*a, *b, *own])
    records = gather([tmp_path / "runs"])
    _, rows, _ = compare.comparison(records)
    assert [r.label for r in rows] == ["rope · text", "rope · text:a.txt", "rope · text:b.txt"]
    assert [r.group for r in rows] == ["0", "1", "2"]  # a section per corpus
    text = render(records)
    assert cells(text, "rope · text:b.txt")[:2] == ["7.000", "–"]
    assert cells(text, "rope · text:a.txt")[:2] == ["5.000", "6.000"]
    flat = " ".join(text.split())
    assert (
        "Corpora (each row names its own): text (fingerprint x, the training corpus); text:a.txt (fingerprint "
        "aaaaaaaaaaaa); text:b.txt" in flat
    )
    rows_csv = (tmp_path / "runs").parent / "csv"
    compare.write_outputs(records, rows_csv)
    lines = (rows_csv / "results.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert {"data", "data_fingerprint", "dtype", "row"} <= set(header)
    b_line = next(line.split(",") for line in lines if "text:b.txt" in line)
    assert b_line[header.index("data_fingerprint")] == "b" * 16 and b_line[header.index("row")] == "rope · text:b.txt"
    assert b_line[header.index("positions")] == "sequential"


def test_two_texts_of_one_name_are_told_apart_by_fingerprint(tmp_path: Path) -> None:
    one = [{**entry(16, 5.0), "data": {"name": "text:corpus.txt", "fingerprint": "1" * 16}}]
    two = [{**entry(16, 6.0), "data": {"name": "text:corpus.txt", "fingerprint": "2" * 16}}]
    fake_run(tmp_path / "runs" / "rope", "rope", {}, [1.0], entries=[*one, *two])
    _, rows, _ = compare.comparison(gather([tmp_path / "runs"]))
    assert [r.label for r in rows] == ["rope · text:corpus.txt@11111111", "rope · text:corpus.txt@22222222"]


def test_precisions_and_protocols_are_separate_rows(tmp_path: Path) -> None:
    bf16 = [{**entry(16, 10.1), "dtype": "bf16"}]
    sliding = [{**entry(n, 9.0), "protocol": "sliding", "stride": n // 2} for n in (16, 32)]
    fake_run(tmp_path / "runs" / "rope", "rope", {}, [1.0, 2.0], entries=[entry(16, 10.0), *bf16, *sliding])
    _, rows, _ = compare.comparison(gather([tmp_path / "runs"]))
    labels_ = [r.label for r in rows]
    assert labels_ == ["rope · fp32 · nonoverlap", "rope · bf16 · nonoverlap", "rope · fp32 · sliding, stride L/2"]
    assert all(r.members == 1 for r in rows)
    assert [c.mean for c in (rows[2].cells[1.0], rows[2].cells[2.0])] == [9.0, 9.0]  # both lengths, one stride rule


def test_sliding_stride_rules() -> None:
    def e(length: int, stride: int) -> dict[str, Any]:
        return {"protocol": "sliding", "length": length, "stride": stride}

    explicit = [e(16, 16), e(32, 32), e(64, 64), e(128, 64), e(256, 64)]  # stride 64 capped at L below 64
    assert set(row_setup.protocol_texts(explicit)) == {"sliding, stride 64"}
    assert set(row_setup.protocol_texts([e(16, 8), e(32, 16), e(64, 32)])) == {"sliding, stride L/2"}


def test_a_run_and_its_export_are_two_rows(tmp_path: Path) -> None:
    """`compare outputs/runs/rope exported/rope`: one directory name, two precisions, a posenc run and a
    transformers directory; it printed 'rope (n=2) ... ± ...' as if they were two seeds."""
    from posenc_cli.run.hf_run import weights_identity

    run = tmp_path / "outputs" / "runs" / "rope"
    fake_run(run, "rope", {16: 10.0, 32: 12.0}, [1.0, 2.0])
    export = tmp_path / "exported" / "rope"
    export.mkdir(parents=True)
    (export / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "rope_theta": 10000}))
    (export / "model.safetensors").write_bytes(b"weights")
    doc = new_results_doc("rope", "rope", 16, 16)
    ckpt = {"step": 0, "model_sha256": weights_identity(export)}
    doc["entries"] = [{**entry(n, p), "checkpoint": ckpt, "dtype": "bf16"} for n, p in ((16, 10.2), (32, 12.1))]
    atomic_write_json(results_path(export), doc)
    result = runner.invoke(app, ["compare", str(run), str(export)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "n=2" not in result.output and "±" not in result.output
    assert cells(result.output, "rope · runs/rope · fp32")[:2] == ["10.00", "12.00"]
    assert cells(result.output, "rope · exported/rope · bf16")[:2] == ["10.20", "12.10"]
    (export / "eval" / "extrapolate.json").unlink()  # same precision: told apart by directory, not averaged
    doc["entries"] = [{**e, "dtype": "fp32"} for e in doc["entries"]]
    atomic_write_json(results_path(export), doc)
    _, rows, _ = compare.comparison(gather([run, export]))
    assert [(r.label, r.members) for r in rows] == [("rope · runs/rope", 1), ("rope · exported/rope", 1)]


def test_only_seeds_are_averaged(tmp_path: Path) -> None:
    """n=K ± std only over runs whose saved configs differ by the seed alone; the caption says so."""
    runs = tmp_path / "runs"
    for i, (seed, ppl) in enumerate(((0, 10.0), (1, 11.0))):
        fake_run(runs / f"s{i}" / "rope", "rope", {16: ppl}, [1.0], seed=seed)
    fake_run(runs / "longer" / "rope", "rope", {16: 9.0}, [1.0], seed=2, steps=800)  # another experiment
    fake_run(runs / "copy" / "rope", "rope", {16: 10.0}, [1.0], seed=0)  # seed 0 again: not a further seed
    records = gather([runs / "s0", runs / "s1", runs / "longer", runs / "copy"])
    _, rows, _ = compare.comparison(records)
    by_label = {r.label: r for r in rows}
    assert len(rows) == 3 and all(r.members == 1 for r in rows if r.label != "rope · s0/rope")
    pair = by_label["rope · s0/rope"]
    assert pair.members == 2 and pair.cells[1.0].mean == pytest.approx(10.5)
    assert {"rope · longer/rope", "rope · copy/rope"} <= set(by_label)
    flat = " ".join(render(records).split())
    assert "rope · s0/rope (n=2)" in flat and "n=2: mean ± std over 2 seeds" in flat


def test_reference_says_when_posencs_lengths_are_not_the_papers(sweep_dir: Path) -> None:
    result = runner.invoke(app, ["compare", str(sweep_dir), "--reference", "alibi-table2"], terminal_width=250)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "1.200* / 1.06" in flat  # rope: 12 / 10 at 2x, under the paper's 1012 tokens
    assert "posenc measured 2× under the paper's 1.98× (1012 tokens at L = 512)" in flat


def test_baseline_divides_each_corpus_by_its_own(tmp_path: Path) -> None:
    """--baseline alibi with two corpora: each row is divided by alibi's row on the same corpus (it divided every
    row by one row, whatever corpus it came from)."""

    def on(name: str, n: int, ppl: float) -> dict[str, Any]:
        return {**entry(n, ppl), "data": {"name": name, "fingerprint": name}}

    fake_run(tmp_path / "runs" / "rope", "rope", {}, [1.0], entries=[on("x", 16, 10.0), on("other", 16, 30.0)])
    fake_run(tmp_path / "runs" / "alibi", "alibi", {}, [1.0], entries=[on("x", 16, 5.0), on("other", 16, 20.0)])
    fake_run(tmp_path / "runs" / "t5", "t5", {}, [1.0], entries=[on("third", 16, 7.0)])
    _, rows, _ = compare.comparison(gather([tmp_path / "runs"]), baseline="alibi")
    means = {r.label: r.cells[1.0].mean for r in rows}
    assert means["rope · x"] == pytest.approx(2.0) and means["rope · other"] == pytest.approx(1.5)
    assert means["alibi · other"] == pytest.approx(1.0) and means["t5 · third"] is None
    third = next(r for r in rows if r.label == "t5 · third")
    assert third.cells[1.0].reason == "alibi has no row measured like this one"


def test_random_positions_are_a_setting_and_said(tmp_path: Path) -> None:
    """Cells fed randomized position ids (a run trained with train.random_positions) are another row than cells
    fed 0..L-1; alone in a table, the caption says which ids they were fed."""
    random = {"mode": "random", "range": 64, "seed": 0}
    drawn = [{**entry(n, 9.0), "positions": random} for n in (16, 32)]
    fake_run(tmp_path / "runs" / "rope", "rope", {}, [1.0, 2.0], entries=[entry(16, 10.0), *drawn])
    _, rows, _ = compare.comparison(gather([tmp_path / "runs"]))
    assert [r.label for r in rows] == ["rope · positions 0..L-1", "rope · random positions [0, 64), seed 0"]
    fake_run(tmp_path / "only" / "rope", "rope", {}, [1.0, 2.0], entries=drawn)
    flat = " ".join(render(gather([tmp_path / "only"])).split())
    assert "Position ids: random positions [0, 64), seed 0" in flat


def test_streaming_cells_of_another_decode_are_another_row(tmp_path: Path) -> None:
    """Streaming cells stored before the KV cache (re-encoded, no `decode`) never share a row with kv-cache ones;
    a key part no label shows still splits rows ("variant k")."""
    cache = {"protocol": "streaming", "stride": 4, "window": 12, "sinks": 4}
    old = {**entry(32, 9.0), **cache}
    new = {**entry(32, 8.0), **cache, "decode": "kv-cache"}
    fake_run(tmp_path / "runs" / "rope", "rope", {}, [2.0], entries=[old, new])
    _, rows, _ = compare.comparison(gather([tmp_path / "runs"]))
    assert [r.label for r in rows] == [
        "rope · streaming, window 12, 4 sinks, blocks of 4, recompute",
        "rope · streaming, window 12, 4 sinks, blocks of 4, kv-cache",
    ]
    shown = row_setup.entry_setting(entry(16, 5.0), "nonoverlap")
    keyed = [row_setup.Setting(**{**vars(shown), "group": (i,)}) for i in range(2)]  # a key field no label shows
    record = row_setup.RunRecord(label="rope", run_dir=tmp_path)
    series = [row_setup.Series(record=record, setting=k, entries=[], label="rope") for k in keyed]
    row_setup._tell_apart_unshown_settings(series)
    assert [s.label for s in series] == ["rope · variant 1", "rope · variant 2"]


def keyed(step: int = 1, run: str = "alibi") -> dict[str, Any]:
    """The `longppl_evaluator` of a cell scored on the key tokens of evaluator `run` at checkpoint `step` (step 1,
    no weights: what `fake_run`'s meta.json says)."""
    return {"longppl_evaluator": {"run": run, "checkpoint": {"step": step, "model_sha256": None}, "keys": f"k{step}"}}


def test_longppl_cells_say_why_they_are_empty_and_count_key_tokens(tmp_path: Path) -> None:
    """null at <= L is n/a, a cell stored before LongPPL was recorded is n/m, and each cell's key tokens are listed."""
    at_1x = {**entry(16, 10.0), "longppl": None, "key_tokens": 0, **keyed()}
    at_2x = {**entry(32, 12.0), "longppl": 15.0, "key_tokens": 7, **keyed()}
    fake_run(tmp_path / "runs" / "rope", "rope", {}, [1.0, 2.0, 4.0], entries=[at_1x, at_2x, entry(64, 20.0)])
    records = gather([tmp_path / "runs"])
    columns, _, title = compare.comparison(records, metric="longppl")
    assert [c.key for c in columns] == [1.0, 2.0, 4.0] and title.startswith("LongPPL by evaluation length")
    text = render(records, metric="longppl")
    line = next(x for x in text.splitlines() if x.startswith("│ rope"))
    assert [c.strip() for c in line.split("│")[2:-1]] == ["n/a", "15.00", "n/m"]
    flat = " ".join(text.split())
    assert "key tokens for rope: 1× 0, 2× 7" in flat and "n/a at or below the training length, none beyond it" in flat
    assert "n/a = LongPPL cannot be measured at or below the training length" in flat  # not the scheme's limit
    frame = compare.Comparison(records, metric="longppl").to_frame()
    assert list(frame.columns) == ["n", "1×", "2×", "4×"] and frame.loc["rope", "2×"] == 15.0
    assert frame.attrs["marks"][("rope", "1×")][0] == "n/a" and frame.attrs["marks"][("rope", "4×")][0] == "n/m"
    result = runner.invoke(app, ["compare", str(tmp_path / "runs"), "--metric", "longppl"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "LongPPL by evaluation length" in result.output and "key tokens for rope" in result.output
    assert "LongPPL, key tokens chosen by alibi." in " ".join(result.output.split())


def test_longppl_beyond_the_training_length_without_key_tokens_is_none_not_n_a(tmp_path: Path) -> None:
    """ALiBi's cells beyond L with no key token: "none" (nothing to average), not n/a ("at or below L")."""
    at_1x = {**entry(16, 10.0), "longppl": None, "key_tokens": 0, **keyed()}
    at_2x = {**entry(32, 12.0), "longppl": None, "key_tokens": 0, **keyed()}
    fake_run(tmp_path / "runs" / "alibi", "alibi", {}, [1.0, 2.0], entries=[at_1x, at_2x])
    text = render(gather([tmp_path / "runs"]), metric="longppl")
    line = next(x for x in text.splitlines() if x.startswith("│ alibi"))
    assert [c.strip() for c in line.split("│")[2:-1]] == ["n/a", "none"]
    assert "none = beyond the training length but no key token" in " ".join(text.split())


def test_longppl_shows_one_evaluators_cells_never_self_chosen_ones(tmp_path: Path) -> None:
    """A cell an older posenc scored on its own key tokens (no `longppl_evaluator`) is n/m, never a value; cells of
    two evaluators are refused without --longppl-evaluator, which then picks one (the other's cells n/m)."""
    runs = tmp_path / "runs"
    old_kind = {**entry(32, 12.0), "longppl": 1.5, "key_tokens": 9}  # self-chosen: < e² by construction
    fake_run(runs / "nope", "nope", {}, [2.0], entries=[old_kind])
    text = " ".join(render(gather([runs]), metric="longppl").split())
    assert "│ nope │ n/m │" in text and "1.50" not in text and "chosen by" not in text
    stamp = keyed(run="pos=alibi")  # a sweep job's directory name; the caption names the row the evaluator is shown as
    stamp["longppl_evaluator"]["path"] = str((runs / "alibi").resolve())
    fake_run(
        runs / "alibi", "alibi", {}, [2.0], entries=[{**entry(32, 11.0), "longppl": 3.0, "key_tokens": 5, **stamp}]
    )
    other = {**entry(32, 13.0), "longppl": 4.0, "key_tokens": 6, **keyed(step=2, run="rope-eval")}
    fake_run(runs / "rope", "rope", {}, [2.0], entries=[other])
    result = runner.invoke(app, ["compare", str(runs), "--metric", "longppl"], terminal_width=200)
    assert result.exit_code == 2 and "2 evaluators (pos=alibi, rope-eval)" in result.output
    assert len(result.output.strip().splitlines()) == 1
    args = ["compare", str(runs), "--metric", "longppl", "--longppl-evaluator", str(runs / "alibi")]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    cells = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in result.output.splitlines()
             if line.startswith("│ ") and "×" not in line}  # fmt: skip
    assert float(cells["alibi"]) == 3.0 and cells["rope"] == cells["nope"] == "n/m"
    assert "LongPPL, key tokens chosen by alibi." in " ".join(result.output.split())
    for bad, why in ((tmp_path / "absent", "no such directory"), (tmp_path, "not a posenc run directory")):
        args = ["compare", str(runs), "--metric", "longppl", "--longppl-evaluator", str(bad)]
        result = runner.invoke(app, args, terminal_width=200)
        assert result.exit_code == 2 and why in result.output
    result = runner.invoke(app, ["compare", str(runs), "--longppl-evaluator", str(runs / "alibi")])
    assert result.exit_code == 2 and "add --metric longppl" in result.output


def test_reference_nope_mrr_prints_the_ranking(sweep_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc_cli.analysis import mrr

    asked = []
    beyond = {"nope": 0.5, "rope": 0.1, "alibi": 0.3}
    scores = [mrr.QueryScore(scheme=s, seed=0, task="copy", max_length=8, in_distribution=1.0, beyond=b, run=s)
              for s, b in beyond.items()]  # fmt: skip
    table = mrr.mrr_table(scores)
    monkeypatch.setattr(mrr, "nope_mrr", lambda paths, **gate: asked.append((paths, gate)) or table)
    result = runner.invoke(app, ["compare", str(sweep_dir), "--reference", "nope-mrr"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert asked == [([sweep_dir], {"competence": 0.9, "include_unlearned": False})]
    assert "copy 3 included, 0 excluded" in " ".join(result.output.split())  # the gate's count per task
    flags = ["--competence", "0.5", "--include-unlearned"]
    again = runner.invoke(app, ["compare", str(sweep_dir), "--reference", "nope-mrr", *flags], terminal_width=200)
    assert again.exit_code == 0 and asked[-1][1] == {"competence": 0.5, "include_unlearned": True}, again.output
    ranking = result.output[result.output.index("Mean reciprocal rank") :]
    rows = [x.split("│")[1:-1] for x in ranking.splitlines() if x.startswith("│")]
    cells = [[c.strip() for c in r[:3]] for r in rows]  # scheme, paper, mrr: best first
    assert cells == [["nope", "0.690", "1.000"], ["alibi", "0.500", "0.500"], ["rope", "0.330", "0.333"]]
    bad = runner.invoke(app, ["compare", str(sweep_dir), "--reference", "nope"])
    assert bad.exit_code == 2 and "available: alibi-table2, nope-mrr" in bad.stderr


def test_a_task_table_names_the_seed_of_each_run_that_shares_its_label(tmp_path: Path) -> None:
    """A task table shows each run on its own row: the seeds of one sweep job label ("rope") would be rows that
    cannot be told apart, so they name their seed; a label no other run has stays as it is."""
    from posenc_cli.analysis.task_results import stored_task_results
    from posenc_cli.data.ruler.base import GENERATOR_VERSION
    from posenc_cli.run.meta import read_run_meta

    out = tmp_path / "sweep"
    jobs = []
    # the rope seeds trained on answers only (no perplexity: their records read no results file), alibi not
    for name, scheme, seed, loss_on in (
        ("s0", "rope", 0, "answer"),
        ("s1", "rope", 1, "answer"),
        ("a0", "alibi", 0, "all"),
    ):
        fake_run(out / name, scheme, {16: 10.0}, [1.0], seed=seed, loss_on=loss_on)
        cell = {"task": "niah-single", "length": 16, "multiple": 1.0, "depth": 0.0, "trials": 10, "generate": 4,
                "scoring": "contains", "generator": GENERATOR_VERSION, "status": "ok", "score": 1.0,
                "checkpoint": checkpoint_identity(read_run_meta(out / name))}  # fmt: skip
        doc = {"schema_version": 1, "run": name, "scheme": scheme, "train_length": 16, "base_length": 16}
        (out / name / "eval" / "tasks.json").write_text(json.dumps({**doc, "entries": [cell]}))
        jobs.append({"stage": "seeds", "name": name, "dir": name, "label": scheme, "parent": None, "swept": {}})
    (out / "sweep.json").write_text(json.dumps({"schema_version": 1, "sweep": "t", "jobs": jobs}))
    records = gather([out])
    assert [r.label for r in records] == ["rope", "rope", "alibi"]
    assert [r.status for r in records] == ["answer-only", "answer-only", "ok"] and [r.seed for r in records] == [
        0,
        1,
        0,
    ]
    assert [r["run"] for r in stored_task_results(records)] == ["rope · seed 0", "rope · seed 1", "alibi"]
    shown = runner.invoke(app, ["compare", str(out)], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert "rope · seed 1" in shown.output.split("niah-single")[1]
