"""The comparison of gathered runs (`analysis.gather`): the table (`comparison`), its caption, and its files.

A row never mixes what a cell measured (`rows.Setting`: corpus name and fingerprint, precision, protocol with its
stride rule, positions mode): a run evaluated on two corpora is two rows, its training corpus first, each labelled
with the parts that vary in the table. Rows average runs (n=K, mean ± std) only over the seeds of one experiment:
one label, saved configs equal but for the seed, distinct seeds (`rows.seed_clusters`); other runs of one label (a
run and its `export`) are told apart by their directories. A row's cells share their scored-token count where the
stored cells allow it (`rows.record_series`); a row that still mixes counts is named under the table and gets no
ratio across them, and the title says the count. Runs with different tokenizers are compared in bits per byte
(`shown_metric`): their per-token perplexities count different units. The files of `--out` are staged and moved
into place together (`report.output_files`). `Comparison` holds it all as data (JSON, CSV, markdown, a pandas
DataFrame); `posenc compare` renders it (`cli.compare`).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.analysis.curves import curve_frame, curve_markdown
from posenc_cli.analysis.longppl_keys import keyed_records
from posenc_cli.analysis.rows import ANSWER_ONLY, RunRecord, labelled_series, positions_text, same_budget
from posenc_cli.analysis.task_results import task_frame, task_markdown, task_rows
from posenc_cli.analysis.task_seeds import seed_frame, seed_rows
from posenc_cli.errors import UserError
from posenc_cli.report.gate import DEFAULT_COMPETENCE
from posenc_cli.report.output_files import staged_files
from posenc_cli.report.tables import (
    LEGEND,
    LONGPPL_LEGEND,
    UNMEASURABLE,
    Cell,
    Column,
    TableRow,
    describe_lengths,
    describe_measurement,
    describe_protocol,
    extrapolation_rows,
    fmt_cell,
    fmt_multiple,
    ratio_keys,
    reason_lines,
    table_legend,
)
from posenc_cli.report.task_seed_report import seed_markdown

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ENTRY_FIELDS",
    "METRICS",
    "Comparison",
    "caption_lines",
    "comparison",
    "records_to_json",
    "shown_metric",
    "to_csv",
    "to_markdown",
    "to_results",
    "write_outputs",
]

# What `compare --metric` can show, and its name in the table's title.
METRICS = {"ppl": "Perplexity", "bpb": "Bits per byte", "nll": "Mean NLL (nats)", "longppl": "LongPPL"}

ENTRY_FIELDS = (
    "protocol",
    "stride",
    "length",
    "multiple",
    "tokens",
    "dtype",
    "device",
    "status",
    "reason",
    "ppl",
    "nll",
    "bpb",
)


def records_to_json(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One record per run, setting and length: the row it is shown in, labels, the entry fields (failed jobs get
    one record with the error)."""
    out = []
    for s in labelled_series([r for r in records if r.status != ANSWER_ONLY]):  # no perplexity by construction
        r = s.record
        base = {
            "row": s.label,
            "label": r.label,
            "stage": r.stage,
            "job": r.job,
            "run_dir": str(r.run_dir),
            "scheme": r.scheme,
            "train_length": r.train_length,
            "base_length": r.base_length,
            "seed": r.seed,
            "job_status": r.status,
            "error": r.error,
        }
        if not s.entries:
            out.append(base)
        out.extend({**base, **e} for e in s.entries)
    return out


def to_csv(
    rows_json: list[dict[str, Any]], task_rows: Sequence[dict[str, Any]] = (), task_extra: Sequence[str] = ()
) -> str:
    """results.csv: the entry fields flattened, the corpus as `data` (its name) and `data_fingerprint`; then the
    stored task cells (`analysis.task_results.task_rows`: one row per run × task × scoring × length, its score, and
    the run's in-distribution accuracy and competence-gate state on the task, "not learned" rows kept and flagged).
    `task_extra`: further columns of the task rows (the seed counts of `Comparison.seed_mean`'s rows)."""
    columns = ["label", "stage", "job", "scheme", "job_status", "error", "train_length", "base_length", "row", "seed",
               "data", "data_fingerprint", "positions", *ENTRY_FIELDS, "task", "scoring", "score", "in_distribution",
               "competence", *task_extra]  # fmt: skip
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for rec in rows_json:
        data = rec.get("data") or {}
        flat = {**rec, "data": data.get("name"), "data_fingerprint": data.get("fingerprint")}
        if "protocol" in rec:  # an entry: its positions as text ("sequential" for 0..L-1)
            flat["positions"] = positions_text(rec) or "sequential"
        writer.writerow({k: flat.get(k) for k in columns})
    for rec in task_rows:
        writer.writerow({k: rec.get(k) for k in columns})
    return buf.getvalue()


def to_results(records: list[RunRecord]) -> list[dict[str, Any]]:
    """Series as eval-extrapolate result docs (one setting each), labelled by their row, for the report and plot
    functions. A job that failed or has no results becomes an entry-less row marked in its label."""
    out = []
    for s in labelled_series([r for r in records if r.status != ANSWER_ONLY]):  # no perplexity by construction
        r = s.record
        label = s.label if r.status == "ok" else f"{s.label} [{r.status}]"
        out.append(
            {
                "run": label,
                "label": label,
                "base_label": r.label,
                "run_dir": str(r.run_dir),
                "scheme": r.scheme,
                "train_length": r.train_length,
                "base_length": r.base_length,
                "setting": s.setting,
                "train_fingerprint": r.train_fingerprint,
                "entries": s.entries,
            }
        )
    return out


def comparison(
    records: list[RunRecord], *, metric: str = "ppl", baseline: str | None = None
) -> tuple[list[Any], list[Any], str]:
    """(columns, rows, title) of the comparison table: one row per label (`labelled_series`), mean ± std over its
    seeds; with several settings, one section per setting in order of first appearance. LongPPL shows the cells of
    one evaluator's key tokens only (`longppl_keys.keyed_records`)."""
    metric = shown_metric(records, metric)
    results = to_results(keyed_records(records) if metric == "longppl" else records)
    settings = list(dict.fromkeys(r["setting"] for r in results if r["setting"] is not None))
    group = None
    if len(settings) > 1:
        group = lambda r: str(settings.index(r["setting"]) if r["setting"] is not None else 0)  # noqa: E731
    columns, rows = extrapolation_rows(
        results,
        metric=metric,
        label=lambda r: r["label"],
        aggregate_by=lambda r: r["label"],
        group_by=group,
        ratio=metric != "longppl",  # LongPPL has no value at 1× (nothing beyond the training length to key on)
    )
    if any(c.key == "ratio" for c in columns):
        _no_ratio_across_token_counts(rows, results)
    if baseline is not None:
        refs = _baseline_rows(rows, results, baseline)
        setting_of = {r["label"]: r["setting"] for r in results}
        means = {s: {key: cell.mean for key, cell in ref.cells.items()} for s, ref in refs.items()}  # before dividing
        for row in rows:  # each row against the baseline's row of the same corpus, precision, protocol, positions
            setting = setting_of.get(row.label)
            if setting not in refs:
                for cell in row.cells.values():
                    cell.values, cell.reason = [], cell.reason or f"{baseline} has no row measured like this one"
            else:
                relative_to_row([row], refs[setting], means[setting])
        shown = next(iter(refs.values())).label if len(refs) == 1 else baseline
        columns = [Column(c.key, f"{c.header}\n÷ {shown}", best=None) if c.key == "ratio" else c for c in columns]
    measured = [r for r in results if r["entries"]]
    what = METRICS[metric]
    title = f"{what}{' relative to ' + baseline if baseline else ''} by evaluation length"
    if measured:
        title += f" · {describe_protocol(measured)} · base length {describe_lengths(measured, 'base_length')} tokens"
        title += f" · {describe_token_counts(measured)}"
    return columns, rows, title


# ----------------------------------------------------------------------------------------------------------------
# Measures that do not mix: scored-token counts within a row, tokenizers within a column.


def mixed_tokenizers(records: list[RunRecord]) -> dict[str, str]:
    """Tokenizer name -> the labels of the measured runs using it, when the measured runs use more than one known
    tokenizer (`rows.run_tokenizer`); {} otherwise."""
    measured = [r for r in records if r.status == "ok" and r.entries and r.tokenizer]
    if len({r.tokenizer for r in measured}) < 2:
        return {}
    names: dict[str, str] = {}
    for fingerprint in dict.fromkeys(r.tokenizer for r in measured):
        of = [r for r in measured if r.tokenizer == fingerprint]
        name = of[0].tokenizer_name or "tokenizer"
        name = name if name not in names else f"{name} {str(fingerprint)[:8]}"  # two BPEs of one vocabulary size
        names[name] = ", ".join(dict.fromkeys(r.label for r in of))
    return names


def shown_metric(records: list[RunRecord], metric: str) -> str:
    """The metric the table shows: bits per byte instead of a per-token one (perplexity, NLL) when the runs'
    tokenizers differ, since a token of one is not a token of the other; `metric` otherwise."""
    return "bpb" if metric in ("ppl", "nll") and mixed_tokenizers(records) else metric


def tokenizer_line(records: list[RunRecord], metric: str) -> list[str]:
    """Why the table shows bits per byte where `metric` was asked (`shown_metric`), naming each tokenizer."""
    if shown_metric(records, metric) == metric:
        return []
    which = "; ".join(f"{name}: {labels}" for name, labels in mixed_tokenizers(records).items())
    return [
        f"Bits per byte, not {METRICS[metric].lower()}: the runs' tokenizers differ ({which}), so a per-token "
        "score counts different units; per byte compares them."
    ]


def describe_token_counts(results: list[dict[str, Any]]) -> str:
    """'16,384 scored tokens per cell'; '1,008–1,024 ...' when the counts differ only by whole-window rounding of one
    budget (`rows.same_budget`); 'scored tokens per cell vary (below)' otherwise."""
    cells = _measured([e for r in results for e in r["entries"]])
    counts = sorted({int(e["tokens"]) for e in cells})
    if not counts:
        return "no token scored"
    if len(counts) == 1:
        return f"{counts[0]:,} scored tokens per cell"
    if _one_budget(cells):
        return f"{counts[0]:,}–{counts[-1]:,} scored tokens per cell (one budget in whole windows)"
    return "scored tokens per cell vary (below)"


def _measured(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("status") == "ok" and int(e.get("tokens") or 0) > 0]


def _one_budget(entries: list[dict[str, Any]]) -> bool:
    return all(same_budget(a, b) for i, a in enumerate(entries) for b in entries[i + 1 :])


def _row_cells(results: list[dict[str, Any]]) -> dict[str, dict[float, list[dict[str, Any]]]]:
    """Row label -> multiple -> its members' measured cells there."""
    out: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for r in results:
        row = out.setdefault(r["label"], {})
        for e in _measured(r["entries"]):
            row.setdefault(round(float(e["multiple"]), 6), []).append(e)
    return out


def _no_ratio_across_token_counts(rows: list[Any], results: list[dict[str, Any]]) -> None:
    """Empty the ratio cell (n/m, with the reason) of every row whose two ratio columns scored different token
    counts (not one budget, `rows.same_budget`): a ratio over two samples of different sizes says nothing of length."""
    keys = sorted({round(float(e["multiple"]), 6) for r in results for e in r["entries"]})
    pair = ratio_keys(keys, "multiple", {r["base_length"] for r in results})
    if pair is None:
        return
    by_row = _row_cells(results)
    for row in rows:
        cells = [by_row.get(row.label, {}).get(k, []) for k in pair]
        if all(cells) and not _one_budget(cells[0] + cells[1]) and "ratio" in row.cells:
            shown = " vs ".join("/".join(f"{n:,}" for n in sorted({int(e["tokens"]) for e in c})) for c in cells)
            cell = row.cells["ratio"]
            cell.values, cell.kind = [], UNMEASURABLE
            cell.reason = f"no ratio across different scored-token counts ({shown} tokens)"


def token_count_lines(results: list[dict[str, Any]]) -> list[str]:
    """Under a table whose cells scored different token counts (not one budget): each row's counts per length, a
    row whose own cells differ marked as mixed."""
    by_row = _row_cells(results)
    if _one_budget([e for cells in by_row.values() for es in cells.values() for e in es]):
        return []
    lines = []
    for label, cells in by_row.items():
        groups: dict[tuple[int, ...], list[str]] = {}
        for m in sorted(cells):
            groups.setdefault(tuple(sorted({int(e["tokens"]) for e in cells[m]})), []).append(fmt_multiple(m))
        mixed = not _one_budget([e for es in cells.values() for e in es])
        if len(groups) == 1:
            (ns,) = groups
            lines.append(f"scored tokens for {label}: {'/'.join(f'{n:,}' for n in ns)} per cell")
        else:
            parts = "; ".join(f"{', '.join(ms)}: {'/'.join(f'{n:,}' for n in ns)}" for ns, ms in groups.items())
            what = " (mixed row, no ratio across counts)" if mixed else ""
            lines.append(f"scored tokens for {label}{what}: {parts}")
    return lines


def relative_to_row(rows: list[Any], ref: Any, ref_means: dict[Any, float | None] | None = None) -> None:
    """Divide every cell by the reference row's mean in the same column, the ratio column included: a row's
    "16× / 1×" becomes its ratio over the reference's ratio (how much more it degrades than the reference).
    `ref_means`: the reference's means taken before any row was divided (the reference may be among `rows`)."""
    if ref_means is None:
        ref_means = {key: cell.mean for key, cell in ref.cells.items()}
    for row in rows:
        for key, cell in row.cells.items():
            base = ref_means.get(key)
            if cell.values and not base:
                cell.values, cell.reason = [], cell.reason or f"{ref.label} has no value here"
            cell.values = [v / base for v in cell.values] if base else []


def _baseline_rows(rows: list[Any], results: list[dict[str, Any]], baseline: str) -> dict[Any, Any]:
    """The rows to divide by, one per setting: the row labelled `baseline`, else the rows of the runs labelled
    `baseline` (as `RunRecord.label`: every corpus it was measured on) or of the run directory `baseline`."""
    by_label = {row.label: row for row in rows}
    target = Path(baseline).resolve()
    chosen = [r for r in results if r["label"] == baseline]
    chosen = chosen or [r for r in results if r["base_label"] == baseline]
    chosen = chosen or [r for r in results if Path(r["run_dir"]).resolve() == target]
    refs: dict[Any, Any] = {}
    for r in chosen:
        if r["label"] in by_label and r["setting"] is not None:
            refs.setdefault(r["setting"], by_label[r["label"]])
    if not refs:
        raise UserError(f"--baseline {baseline} matches no row label, run label or run directory")
    return refs


def to_markdown(columns: list[Any], rows: list[Any]) -> str:
    header = "| run | " + " | ".join(c.header.replace("\n", " ") for c in columns) + " |"
    lines = [header, "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        cells = [fmt_cell(row.cells.get(c.key, Cell())) for c in columns]  # unmeasured: n/a, as in the rich table
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(records: list[RunRecord], out_dir: Path, competence: float = DEFAULT_COMPETENCE) -> list[Path]:
    """results.json, results.csv, extrapolation.png and per_position.png in `out_dir`, all moved into place together
    at the end (`output_files.staged_files`: a kill leaves none half-written and no temporary the next write keeps).
    results.csv also holds the runs' stored task cells, each flagged by the competence gate at `competence`: one row
    per run, with or without `Comparison.seed_mean` (the mean over seeds is the CSV view's, `Comparison.to_csv`)."""
    # matplotlib (0.7 s of CPU to import, 2-core EPYC) only when plots are drawn: `import posenc_cli.api` stays light
    from posenc_cli.report.plots import per_position_figure, ppl_vs_length_figure, write_figure

    out_dir = Path(out_dir)
    rows_json = records_to_json(records)
    measured = [r for r in to_results(records) if r["entries"]]
    names = ["results.json", "results.csv"] + (["extrapolation.png", "per_position.png"] if measured else [])
    with staged_files(out_dir) as stage:
        stage("results.json").write_text(json.dumps(rows_json, indent=2) + "\n")
        stage("results.csv").write_text(to_csv(rows_json, task_rows(records, competence)))
        if measured:
            metric = shown_metric(records, "ppl")  # bits per byte where the runs' tokenizers differ
            write_figure(ppl_vs_length_figure(measured, metric=metric), stage("extrapolation.png"))
            write_figure(per_position_figure(measured), stage("per_position.png"))
    return [out_dir / name for name in names]


def label_list(labels: list[str]) -> str:
    """Labels joined for a caption: by '; ' where one holds a comma (a sweep's 'path, lr=0.001'), else by ', '."""
    return ("; " if any("," in label for label in labels) else ", ").join(labels)


def caption_lines(records: list[RunRecord], baseline: str | None = None, metric: str = "ppl") -> list[str]:
    """Under the table: the corpus of the cells, where they were measured (precision, device), what n=K averages,
    why each n/a is n/a, failed jobs; with `metric="longppl"`, what its n/a and n/m mean and each cell's key
    tokens (of one evaluator's key set, `longppl_keys.keyed_records`)."""
    all_results = to_results(keyed_records(records) if metric == "longppl" else records)
    results = [r for r in all_results if r["entries"]]
    lines = tokenizer_line(records, metric)
    lines += [corpus_line(results)] if results else []
    positions = {r["setting"].positions for r in results}
    if len(positions) == 1 and (only := next(iter(positions))):  # several: each row names its own
        lines.append(f"Position ids: {only} (each window its own sorted draw).")
    lines += [f"Measured in {describe_measurement(results)}."] if results else []
    lines += seed_lines(all_results)
    lines += token_count_lines(results)
    lines += reason_lines(results, lambda r: r["label"])
    if baseline is not None:
        lines.append(
            f"Every column, the ratio included, is divided by {baseline}'s, measured like the row (same corpus, "
            "precision, protocol and positions); n/a where it has no value."
        )
    if metric == "longppl" and results:
        lines += longppl_lines(results)
    lines += [f"{r.label} [{r.status}]: {r.error}" for r in records if r.status not in ("ok", ANSWER_ONLY)]
    if answer := list(dict.fromkeys(r.label for r in records if r.status == ANSWER_ONLY)):
        lines.append(
            f"No perplexity for {label_list(answer)}: trained on answer tokens only (train.loss_on=answer), so a "
            "perplexity over every token would score tokens they never trained to predict; their task scores follow."
        )
    return lines


def longppl_lines(results: list[dict[str, Any]]) -> list[str]:
    """What LongPPL's empty cells mean, then the key tokens each row's cells scored ('rope: 2× 118, 4× 96'; a row
    of several seeds lists each member's count, '118/121')."""
    evaluators = sorted({evaluator_name(e["longppl_evaluator"], results) for r in results for e in r["entries"]
                         if e.get("longppl_evaluator")})  # fmt: skip
    lines = [f"LongPPL, key tokens chosen by {', '.join(evaluators)}."] if evaluators else []
    lines.append(
        "LongPPL: perplexity over the key tokens alone (tokens whose loss the evaluator's long context lowers by "
        "more than α = 2 against its training-length context), every row scored on the same ones; n/a at or below "
        "the training length, none beyond it where no token was a key token, n/m where a cell was stored without "
        "LongPPL on these key tokens (posenc eval-extrapolate --longppl-evaluator RUN measures it)."
    )
    for label, counts in key_token_counts(results).items():
        cells = ", ".join(f"{fmt_multiple(m)} {'/'.join(map(str, n))}" for m, n in sorted(counts.items()))
        lines.append(f"key tokens for {label}: {cells}")
    return lines


def evaluator_name(stamp: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The evaluator of a cell's key tokens as the table names it: the label of its row when it is one of the runs
    shown, else its directory's name."""
    where = stamp.get("path")
    for r in results:
        if where and Path(r["run_dir"]).resolve() == Path(where):
            return str(r["label"])
    return str(stamp.get("run"))


def key_token_counts(results: list[dict[str, Any]]) -> dict[str, dict[float, list[int]]]:
    """Row label -> multiple -> the `key_tokens` of each member's cell there (cells without the field left out)."""
    out: dict[str, dict[float, list[int]]] = {}
    for r in results:
        for e in r["entries"]:
            if e.get("key_tokens") is not None:
                out.setdefault(r["label"], {}).setdefault(float(e["multiple"]), []).append(int(e["key_tokens"]))
    return {label: counts for label, counts in out.items() if counts}


def corpus_line(results: list[dict[str, Any]]) -> str:
    """'Corpus: text:a.txt (fingerprint 1a2b3c4d5e6f, the training corpus).' or, with several, each name with its
    fingerprint ("training corpus" where a run shown on it was trained on it)."""
    pairs = list(dict.fromkeys((r["setting"].data, r["setting"].fingerprint) for r in results))
    trained = {r["setting"].fingerprint for r in results if r["setting"].fingerprint == r["train_fingerprint"]}
    shown = [
        f"{name} (fingerprint {fp[:12] or 'not recorded'}{', the training corpus' if fp and fp in trained else ''})"
        for name, fp in pairs
    ]
    if len(shown) == 1:
        return f"Corpus: {shown[0]}."
    return f"Corpora (each row names its own): {'; '.join(shown)}."


def seed_lines(results: list[dict[str, Any]]) -> list[str]:
    """'n=3: mean ± std over 3 seeds ...' for each member count a row of several runs has."""
    counts = Counter(r["label"] for r in results)
    lines = []
    for k in sorted(set(counts.values()) - {1}):
        lines.append(
            f"n={k}: mean ± std over {k} seeds (runs whose saved configs differ only in train.seed; same corpus, "
            "precision and protocol)."
        )
    return lines


# ----------------------------------------------------------------------------------------------------------------
# The comparison as data: what `posenc compare` shows, as JSON, CSV, markdown text or a pandas DataFrame.


@dataclass
class Comparison:
    """The runs gathered from disk (`gather`) and how they are compared: `metric` per length, every cell divided by
    `baseline`'s when given. The table is built on first use (`table`), so the JSON and CSV views work whatever
    `baseline` says. `written`: the files `write_outputs` wrote for it, if any. `competence`: the competence gate's
    threshold for the runs' stored task cells (the CSV's task rows, `task_frame`); the perplexity table ignores it.
    `seed_mean`: the task rows of the CSV and markdown views are one per experiment, the mean ± sd over its seeds
    (`analysis.task_seeds`), not one per run; results.csv (`write_outputs`) keeps one per run."""

    records: list[RunRecord]
    metric: str = "ppl"
    baseline: str | None = None
    written: list[Path] = field(default_factory=list)
    competence: float = DEFAULT_COMPETENCE
    seed_mean: bool = False

    @functools.cached_property
    def table(self) -> tuple[list[Column], list[TableRow], str]:
        """(columns, rows, title) as `comparison` builds them."""
        return comparison(self.records, metric=self.metric, baseline=self.baseline)

    @property
    def legend(self) -> dict[str, str]:
        """What each empty-cell mark means in this table (`report.tables.LEGEND`, LongPPL's own for longppl)."""
        return LONGPPL_LEGEND if self.metric == "longppl" else LEGEND

    @property
    def caption(self) -> list[str]:
        return caption_lines(self.records, self.baseline, self.metric)

    def to_json(self) -> list[dict[str, Any]]:
        return records_to_json(self.records)

    def to_csv(self) -> str:
        """`to_csv` of the runs; with `seed_mean`, the task rows are the experiments' (`seed_rows`: score is the mean
        over seeds, then the columns sd, n, measured and n_learned)."""
        if not self.seed_mean:
            return to_csv(self.to_json(), task_rows(self.records, self.competence))
        rows = [{**row, "score": row["mean"]} for row in self.task_seed_rows]
        return to_csv(self.to_json(), rows, task_extra=("sd", "n", "measured", "n_learned"))

    def task_frame(self) -> pd.DataFrame:
        """The runs' stored task cells, one row per run × task × scoring, with the competence gate's in-distribution
        accuracy and state (`analysis.task_results.task_frame`)."""
        return task_frame(self.records, self.competence)

    @functools.cached_property
    def task_seed_rows(self) -> list[dict[str, Any]]:
        """The runs' stored task cells over seeds, one row per experiment × task × scoring × length: mean ± sd, the
        seed counts and the row's gate state (`analysis.task_seeds.seed_rows`)."""
        return seed_rows(self.records, self.competence)

    def task_seed_frame(self) -> pd.DataFrame:
        """`task_seed_rows` as a DataFrame (`analysis.task_seeds.seed_frame`)."""
        return seed_frame(self.task_seed_rows, self.competence)

    def to_markdown(self) -> str:
        """The bold title, the markdown table, then the legend and caption lines (two spaces: markdown breaks); then,
        when the runs stored task cells, their table with the competence gate's marks (`task_results.task_markdown`;
        with `seed_mean`, a table per task over seeds, `report.task_seed_report.seed_markdown`), and the learning
        curves among the runs (`curves.curve_markdown`)."""
        columns, rows, title = self.table
        notes = "".join(f"\n{line}  " for line in [table_legend(columns, rows, self.legend), *self.caption] if line)
        if self.seed_mean:  # one row per experiment: the mean ± sd over its seeds
            tasks = seed_markdown(self.task_seed_rows, self.competence)
        else:  # the stored task cells, gated, after the table
            tasks = task_markdown(self.records, self.competence)
        # no column (every run trained on answer tokens only): no table to draw, its caption says why
        text = f"**{title}**\n\n" + to_markdown(columns, rows) + notes if columns else notes.lstrip("\n")
        text += f"\n\n**Tasks**\n\n{tasks}" if tasks else ""
        curves = curve_markdown(self.records, self.competence)  # runs equal but for their steps, after the tasks
        if curves:
            text += f"\n\n**Learning curves** (in-distribution accuracy against training steps)\n\n{curves}"
        return text

    def curve_frame(self) -> pd.DataFrame:
        """The learning curves among the runs: each task's in-distribution accuracy and gate at every step count of
        runs equal but for their steps (`analysis.curves.curve_frame`); empty when there are none."""
        return curve_frame(self.records, self.competence)

    def to_frame(self) -> pd.DataFrame:
        """One row per table row (index "run", the row label): column "n" (runs averaged), then the mean of each
        table column under its header's first line ("1×", "2×", "2× / 1×"; tokens with abs lengths), NaN where the
        table shows n/a, n/m or –. `attrs`: title, caption, metric, baseline, and for each empty cell its mark and
        reason (`marks`: {(row, column): (mark, reason)}); `std` the seed spread of averaged cells."""
        # deferred: pandas costs seconds of start-up; only the API's callers need it
        import pandas as pd

        columns, rows, title = self.table
        names = [c.header.split("\n")[0] for c in columns]
        data, marks, std = [], {}, {}
        for row in rows:
            values: dict[str, Any] = {"n": row.members}
            for column, name in zip(columns, names, strict=True):
                cell = row.cells.get(column.key, Cell())
                values[name] = cell.mean if cell.mean is not None else float("nan")
                if cell.mean is None:
                    marks[(row.label, name)] = (fmt_cell(cell), cell.reason)
                elif cell.std is not None:
                    std[(row.label, name)] = cell.std
            data.append(values)
        frame = pd.DataFrame(data, index=pd.Index([r.label for r in rows], name="run"), columns=["n", *names])
        frame.attrs.update(
            title=title,
            caption=self.caption,
            metric=shown_metric(self.records, self.metric),  # bpb where the runs' tokenizers differ
            baseline=self.baseline,
            marks=marks,
            std=std,
        )
        return frame
