"""Rich tables: values, best-per-column bold, n/a, ratio column, aggregation (mean ± std) and groups."""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest
from rich.console import Console

from posenc_cli.report import tables as report


def entry(length: int, ppl: float | None, base: int = 16, reason: str | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "protocol": kw.get("protocol", "nonoverlap"),
        "stride": kw.get("stride"),
        "length": length,
        "multiple": length / base,
        "tokens": 256,
        "dtype": "fp32",
        "data": {"name": "stdlib", "fingerprint": "x"},
        "status": "ok" if ppl is not None else "n/a",
        "reason": reason,
        "ppl": ppl,
        "nll": None,
        "bpb": None,
        "per_position": [],
    }


def result(run: str, scheme: str, ppls: dict[int, float | None], base: int = 16, **kw: Any) -> dict[str, Any]:
    entries = [entry(n, p, base, None if p else f"{scheme} cannot serve {n}", **kw) for n, p in ppls.items()]
    return {"run": run, "scheme": scheme, "train_length": base, "base_length": base, "entries": entries}


RESULTS = [
    result("r0", "rope", {8: 12.0, 16: 10.0, 32: 30.0}),
    result("r1", "alibi", {8: 13.0, 16: 9.5, 32: 9.0}),
    result("r2", "learned", {8: 11.0, 16: 10.5, 32: None}),
]


def render(table: Any, width: int = 160) -> str:
    console = Console(width=width, record=True, force_terminal=True, color_system="standard")
    console.print(table)
    return console.export_text(styles=True)


def test_fmt_number() -> None:
    assert report.fmt_number(3.14159) == "3.142"
    assert report.fmt_number(12.345) == "12.35"
    assert report.fmt_number(123.45) == "123.5"
    assert report.fmt_number(12345.6) == "12,346"
    assert report.fmt_number(2.5e7) == "2.5e+07"


def test_rows_columns_and_ratio() -> None:
    columns, rows = report.extrapolation_rows(RESULTS)
    assert [c.key for c in columns] == [0.5, 1.0, 2.0, "ratio"]
    assert columns[0].header == "0.5×\n8" and columns[-1].header == "2× / 1×"
    assert [r.label for r in rows] == ["r0 (rope)", "r1 (alibi)", "r2 (learned)"]
    assert rows[0].cells[2.0].mean == 30.0
    assert rows[0].cells["ratio"].mean == pytest.approx(3.0)
    assert rows[1].cells["ratio"].mean == pytest.approx(9.0 / 9.5)
    assert rows[2].cells[2.0].mean is None and rows[2].cells[2.0].reason == "learned cannot serve 32"
    assert rows[2].cells["ratio"].mean is None


def test_ratio_is_taken_in_the_shown_metric() -> None:
    r = result("r0", "rope", {16: 10.0, 64: 40.0})
    for e in r["entries"]:
        e["bpb"] = 3.0 if e["length"] == 16 else 4.5  # what a bpb table shows: 4.5 / 3.0, not the ppl ratio 4.0
    _, rows = report.extrapolation_rows([r], metric="bpb")
    assert rows[0].cells["ratio"].mean == pytest.approx(1.5)
    _, rows = report.extrapolation_rows([r])
    assert rows[0].cells["ratio"].mean == pytest.approx(4.0)


def test_table_bold_best_dim_na_and_title() -> None:
    table = report.extrapolation_table(RESULTS)
    assert "nonoverlap" in str(table.title) and "trained at 16 tokens" in str(table.title)
    text = render(table)
    assert "\x1b[1m9.000\x1b[0m" in text  # best at 2× (alibi) is bold
    assert "\x1b[1m11.00\x1b[0m" in text  # best at 0.5× (learned)
    assert "\x1b[1m30.00" not in text
    assert re.search(r"\x1b\[2m\s*n/a\x1b\[0m", text)  # dimmed n/a
    assert "learned cannot serve 32" in str(table.caption)
    plain = render(table).replace("\x1b", "")
    assert "r2 (learned)" in plain


def test_sliding_title_and_abs_length_columns() -> None:
    res = [result("r0", "rope", {8: 5.0, 16: 4.0}, protocol="sliding")]
    for e in res[0]["entries"]:
        e["stride"] = e["length"] // 2
    assert report.describe_protocol(res) == "sliding, stride L/2"
    for e in res[0]["entries"]:
        e["stride"] = 4
    assert report.describe_protocol(res) == "sliding, stride 4"
    columns, rows = report.extrapolation_rows(res, by="length")
    assert [c.header for c in columns] == ["8", "16", "16 / 8"]  # was "16 / 1×": 1× over itself
    assert rows[0].cells["ratio"].mean == pytest.approx(4.0 / 5.0)


def test_ratio_column_is_between_measured_columns() -> None:
    # --abs-lengths 32,64 on runs trained at 16: the ratio was "64 / 1×", always n/a (1× was never measured).
    columns, rows = report.extrapolation_rows([result("r0", "rope", {32: 5.0, 64: 15.0})], by="length")
    assert columns[-1].header == "64 / 32" and rows[0].cells["ratio"].mean == pytest.approx(3.0)
    # Lengths 1× and 2×: 2× over 1×; lengths up to 1×: 1× over the shortest, never "1× / 1×".
    columns, _ = report.extrapolation_rows([result("r0", "rope", {8: 5.0, 16: 4.0})])
    assert columns[-1].header == "1× / 0.5×"
    columns, _ = report.extrapolation_rows([result("r0", "rope", {16: 4.0})])
    assert [c.key for c in columns] == [1.0]  # one length: no ratio column at all


def test_cannot_and_not_measured_render_differently_with_a_legend() -> None:
    res = [result("a", "learned", {16: 5.0, 32: None}), result("b", "alibi", {16: 6.0, 48: 6.5})]
    columns, rows = report.extrapolation_rows(res, ratio=False)
    assert [report.fmt_cell(rows[0].cells.get(k, report.Cell())) for k in (1.0, 2.0, 3.0)] == ["5.000", "n/a", "–"]
    assert report.table_legend(columns, rows) == (
        "n/a = the scheme cannot read that many tokens (reasons below); – = not measured"
    )
    table = report.extrapolation_table(res)
    caption = str(table.caption)
    assert caption.startswith("n/a = the scheme") and "Measured in fp32 on an unrecorded device." in caption
    res[0]["entries"][0]["device"] = "cpu (Test CPU)"
    for e in res[1]["entries"]:
        e.update(dtype="bf16", device="cuda (Test GPU)")
    assert report.describe_measurement(res) == "bf16 + fp32 on cpu (Test CPU) + cuda (Test GPU)"


def test_aggregate_mean_std_groups_and_partial_na() -> None:
    seeds = [
        result("rope-s0", "rope", {16: 10.0, 32: 20.0}),
        result("rope-s1", "rope", {16: 12.0, 32: 22.0}),
        result("alibi-s0", "alibi", {16: 9.0, 32: None}),
        result("alibi-s1", "alibi", {16: 11.0, 32: 15.0}),
    ]
    columns, rows = report.extrapolation_rows(seeds, aggregate_by=lambda r: r["scheme"], group_by=lambda r: r["scheme"])
    rope, alibi = rows
    assert rope.members == 2 and rope.cells[1.0].values == [10.0, 12.0]
    assert rope.cells[1.0].std == pytest.approx(statistics.stdev([10.0, 12.0]))
    assert report.fmt_cell(rope.cells[1.0]) == "11.00 ± 1.414"
    assert rope.cells["ratio"].mean == pytest.approx((2.0 + 22 / 12) / 2)  # mean of per-run ratios
    assert alibi.cells[2.0].mean is None  # one seed missing: n/a rather than a one-seed mean
    table = report.render_table(columns, rows, title="t", label_header="scheme")
    assert table.rows[0].end_section  # one section per group
    assert "(n=2)" in render(table)


def test_run_names_survive_a_narrow_terminal() -> None:
    lengths = {16 * 2**k: 10.0 + k for k in range(5)}
    seeds = [result(f"rope-s{i}", "rope", {n: v + i for n, v in lengths.items()}) for i in range(3)]
    columns, rows = report.extrapolation_rows(seeds, aggregate_by=lambda r: r["scheme"], group_by=lambda r: r["scheme"])
    text = render(report.render_table(columns, rows), width=80)  # the numbers alone are wider than 80 columns
    assert "rope (n=3)" in re.sub(r"\x1b\[[0-9;]*m", "", text)  # rich had squeezed the name column to nothing


def test_multiple_base_lengths_drop_token_counts_in_headers() -> None:
    res = [result("a", "rope", {16: 3.0}, base=16), result("b", "rope", {32: 4.0}, base=32)]
    columns, _ = report.extrapolation_rows(res)
    assert columns[0].header == "1×"
    assert report.describe_lengths(res) == "16/32"


def test_several_entries_per_length_rejected() -> None:
    doubled = result("r0", "rope", {16: 3.0})
    doubled["entries"].append(entry(16, 4.0, protocol="sliding", stride=8))
    with pytest.raises(ValueError, match="one protocol per row"):
        report.extrapolation_rows([doubled])


def test_run_label() -> None:
    assert report.run_label({"run": "r0", "scheme": "rope"}) == "r0 (rope)"
    assert report.run_label({"run": "r0 (rope)", "scheme": "rope"}) == "r0 (rope)"
    # A name that already says the scheme as a word keeps it once: Hydra job dirs, extend outputs, nested paths.
    for named in ("pos=alibi", "train/pos=alibi", "alibi_s2", "runs/alibi-8k"):
        assert report.run_label({"run": named, "scheme": "alibi"}) == named
    assert report.run_label({"run": "pos=rope-yarnx8", "scheme": "rope"}) == "pos=rope-yarnx8"
    # ... but not as part of another word.
    assert report.run_label({"run": "campfire", "scheme": "fire"}) == "campfire (fire)"
    assert report.run_label({"run": "rope2", "scheme": "rope"}) == "rope2 (rope)"


def test_markdown_marks_unmeasured_cells() -> None:
    from posenc_cli.analysis.compare import to_markdown

    columns, rows = report.extrapolation_rows([result("a", "rope", {8: 5.0, 16: 4.0}), result("b", "alibi", {16: 6.0})])
    lines = to_markdown(columns, rows).splitlines()
    assert lines[3] == "| b (alibi) | – | 6.000 | – |"  # no 0.5× entry: not measured (–), not n/a or empty


def test_reason_lines_name_a_row_once_for_all_its_seeds() -> None:
    seeds = [result(f"learned-s{i}", "learned", {16: 10.0 + i, 32: None}) for i in range(3)]
    lines = report.reason_lines(seeds, label=lambda r: "learned (n=3)")
    assert lines == ["n/a for learned (n=3) at 32: learned cannot serve 32"]


def test_too_few_tokens_is_not_beyond_the_scheme() -> None:
    """A corpus too short for one window (or a length below the fixed target) is "n/m", not the scheme's "n/a";
    a non-finite loss is "nan"; entries from before the states were told apart are read by their reason."""
    res = result("a", "rope", {16: 5.0, 32: None, 64: None, 128: None, 256: None})
    e32, e64, e128, e256 = res["entries"][1:]
    e32.update(status="too_few_tokens", reason="validation split has 40 tokens; one window needs 65")
    e64.update(status="n/a", reason="validation split has 40 tokens; one window needs 129")  # an older file
    e128.update(status="non_finite", reason="non-finite loss (mean NLL nan)")
    e256.update(status="n/a", reason="scheme 'learned' supports at most 128 positions")
    columns, rows = report.extrapolation_rows([res])
    shown = [report.fmt_cell(rows[0].cells[c.key]) for c in columns]
    assert shown == ["5.000", "n/m", "n/m", "nan", "n/a", "n/a"]  # the ratio 16x / 1x: 256 is beyond the scheme
    legend = report.table_legend(columns, rows)
    assert "n/m = not measurable there" in legend and "nan = the loss was not finite" in legend
    lines = report.reason_lines([res], report.run_label)
    assert lines[0] == "n/m for a (rope) at 32: validation split has 40 tokens; one window needs 65"
    assert lines[2].startswith("nan for a (rope) at 128") and lines[3].startswith("n/a for a (rope) at 256")
