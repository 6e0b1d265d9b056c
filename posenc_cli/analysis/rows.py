"""Rows of a comparison: which cells may stand in one row, and how a row is labelled.

A row never mixes what a cell measured (`Setting`: corpus name and fingerprint, precision, protocol with its stride
rule, positions mode), and averages runs only over the seeds of one experiment (`seed_clusters`: one label, saved
configs equal but for the seed, `config_identity`, and distinct seeds). `labelled_series` gives every run's cells
under each setting (`Series`) the label of its row. A run's cells of one setting share their scored-token count
where the stored cells allow it (`record_series`: the count most lengths were measured with, `same_budget`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.config import NOT_IDENTITY_KEYS, Config, config_to_dict, flatten
from posenc_cli.errors import UserError
from posenc_cli.evaluation.results import cell_group
from posenc_cli.run.export import EXPORT_INFO_FILE
from posenc_cli.run.hf_run import TOKENIZER_FILES
from posenc_cli.run.load import read_config
from posenc_cli.run.meta import RunMeta, is_hf_dir, read_meta

# A run trained on answer tokens only (`train.loss_on=answer`): its perplexity over every token of a text would
# measure tokens it never trained to predict, so the perplexity table leaves it out, saying so; its task tables stay.
ANSWER_ONLY = "answer-only"


@dataclass(kw_only=True)
class RunRecord:
    """One run (or one failed sweep job) with its evaluation entries."""

    label: str
    run_dir: Path
    stage: str = ""
    job: str = ""
    status: str = "ok"  # ok | failed | missing | answer-only (ANSWER_ONLY: no perplexity by construction)
    error: str = ""
    scheme: str = ""
    train_length: int | None = None
    base_length: int | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)
    identity: str | None = None  # the saved config minus seed and bookkeeping (`config_identity`); None: unknown
    seed: int | None = None
    train_fingerprint: str | None = None  # the training corpus's, from meta.json
    tokenizer: str | None = None  # its fingerprint (`run_tokenizer`); None: unknown
    tokenizer_name: str = ""  # 'byte', 'bpe, vocab 300', 'transformers tokenizer.json'


def config_identity(cfg: Config, meta: RunMeta) -> str:
    """The resolved config without `config.NOT_IDENTITY_KEYS` (speed, logging, seeds, bookkeeping: runs that differ
    only there are the seeds of one experiment), plus the training corpus's fingerprint, as canonical JSON."""
    flat = {k: v for k, v in flatten(config_to_dict(cfg)).items() if not k.startswith(NOT_IDENTITY_KEYS)}
    flat["data.fingerprint"] = (meta.record.get("data") or {}).get("fingerprint")
    return json.dumps(flat, sort_keys=True, default=str)


def run_identity(run_dir: Path) -> tuple[str | None, int | None, str | None]:
    """(config identity, seed, training corpus fingerprint) of a posenc run; Nones for a transformers directory
    or a run whose config cannot be read (such a run is never averaged with another)."""
    if is_hf_dir(run_dir):
        return None, None, None
    try:
        meta = read_meta(run_dir)
        cfg = read_config(run_dir, meta)
    except UserError:
        return None, None, None
    run_meta = RunMeta.from_json(meta)
    fingerprint = (run_meta.record.get("data") or {}).get("fingerprint")
    return config_identity(cfg, run_meta), cfg.train.seed, str(fingerprint) if fingerprint else None


def run_tokenizer(run_dir: Path) -> tuple[str | None, str]:
    """(fingerprint, name) of a run's tokenizer: a posenc run's from meta.json ('byte', 'bpe, vocab 300'); a
    transformers directory's from the bytes of its tokenizer file; (None, "") when neither is readable. Runs whose
    fingerprints differ count tokens differently, so their per-token scores (perplexity, NLL) do not compare."""
    if is_hf_dir(run_dir):
        source = _export_source(Path(run_dir))  # a posenc export tokenizes as the run it came from
        if source is not None:
            return run_tokenizer(source)
        for name in TOKENIZER_FILES:
            if (path := Path(run_dir) / name).is_file():
                return "hf:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16], f"transformers {name}"
        return None, ""
    try:
        record = (RunMeta.from_json(read_meta(run_dir)).record.get("tokenizer")) or {}
    except UserError:
        return None, ""
    if not record.get("fingerprint"):
        return None, ""
    kind = str(record.get("kind") or "tokenizer")
    name = f"{kind}, vocab {record['vocab_size']}" if kind != "byte" and record.get("vocab_size") else kind
    return str(record["fingerprint"]), name


def _export_source(hf_dir: Path) -> Path | None:
    """The posenc run a `posenc export` directory was written from (its posenc_export.json), if still readable."""
    try:
        source = Path(json.loads((hf_dir / EXPORT_INFO_FILE).read_text())["source_run"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if source.is_dir() and not is_hf_dir(source) else None


# ----------------------------------------------------------------------------------------------------------------
# Rows: one per run and setting; runs share a row only when they differ by the seed alone.


@dataclass(frozen=True)
class Setting:
    """What a cell was measured on and how, besides its length and checkpoint: a row never mixes two settings.

    `data`/`fingerprint`: the corpus (`perplexity.evaluate_run`'s `data` record); `dtype`: the precision of the
    forward; `protocol`: the windowing, with its stride rule ("sliding, stride L/2"); `positions`: the positions mode
    when an entry records one (empty otherwise)."""

    data: str
    fingerprint: str
    dtype: str
    protocol: str
    positions: str = ""
    group: tuple[Any, ...] = field(default=(), repr=False)  # `results.cell_group` with the stride rule for the stride


@dataclass(kw_only=True)
class Series:
    """One row member: a run's newest entry per length under one `Setting` (none for a failed or missing job)."""

    record: RunRecord
    setting: Setting | None
    entries: list[dict[str, Any]]
    label: str = ""


def protocol_texts(entries: list[dict[str, Any]]) -> list[str]:
    """The windowing of each entry as one setting: sliding entries of one evaluation share a stride rule although
    their stored strides differ per length (L/2, or min(S, L)), so the rule is recovered from the run's entries:
    a stride below L/2 names S itself; L//2 is "L/2" unless S = L//2 was asked elsewhere; a stride capped at L
    belongs to the smallest asked S >= L (none: "stride >= L", the same windows as any such S)."""
    sliding = [e for e in entries if e["protocol"] == "sliding"]
    asked = {int(e["stride"]) for e in sliding if int(e["stride"]) < int(e["length"]) and not _is_half(e)}
    out = []
    for e in entries:
        protocol = str(e["protocol"])
        if protocol == "streaming":
            cache = f"window {e.get('window')}, {e.get('sinks')} sinks, blocks of {e['stride']}"
            out.append(f"streaming, {cache}, {e.get('decode', 'recompute')}")  # no decode: re-encoded (older)
        elif protocol == "fixed-target":
            out.append(f"fixed-target, target {e['stride']}")
        elif protocol != "sliding":
            out.append(protocol)
        elif int(e["stride"]) < int(e["length"]):
            half = _is_half(e) and int(e["stride"]) not in asked
            out.append("sliding, stride L/2" if half else f"sliding, stride {e['stride']}")
        else:
            above = [s for s in asked if s >= int(e["length"])]
            out.append(f"sliding, stride {min(above)}" if above else "sliding, stride >= L")
    return out


def _is_half(entry: dict[str, Any]) -> bool:
    return int(entry["stride"]) == max(1, int(entry["length"]) // 2) and int(entry["stride"]) < int(entry["length"])


def entry_setting(entry: dict[str, Any], protocol: str) -> Setting:
    data = entry.get("data") or {}
    return Setting(
        data=str(data.get("name") or "unrecorded corpus"),
        fingerprint=str(data.get("fingerprint") or ""),
        dtype=str(entry.get("dtype") or "unknown precision"),
        protocol=protocol,
        positions=positions_text(entry),
        group=cell_group({**entry, "stride": protocol}),  # whatever else evaluation keys a row by
    )


def positions_text(entry: dict[str, Any]) -> str:
    """'' for position ids 0..T-1 (also what an entry without the field was fed), else e.g. 'random positions
    [0, 64), seed 0' (the same distinction as `results.positions_key`)."""
    positions = entry.get("positions") or {}
    mode = positions.get("mode", "sequential") if isinstance(positions, dict) else str(positions)
    if mode == "sequential":
        return ""
    if mode == "random":
        return f"random positions [0, {positions.get('range')}), seed {positions.get('seed')}"
    return f"{mode} positions"


def record_series(record: RunRecord) -> list[Series]:
    """A run's entries split by setting, one entry per length in each; the run's own training corpus first, the
    others in the order they were stored. A failed or missing job is one series without entries.

    The entries of a setting share their scored-token count where the stored cells allow it (`row_token_count`):
    at each length the newest entry of that count, else the newest entry (a mixed row). A later
    evaluation of a few lengths with another `--tokens` therefore changes no cell of the row."""
    if record.status != "ok":
        return [Series(record=record, setting=None, entries=[])]
    chosen: dict[Setting, dict[float, dict[int, dict[str, Any]]]] = {}
    for e, protocol in zip(record.entries, protocol_texts(record.entries), strict=True):
        by_count = chosen.setdefault(entry_setting(e, protocol), {}).setdefault(round(float(e["multiple"]), 6), {})
        count = int(e.get("tokens") or 0)
        if count not in by_count or _newer(e, by_count[count]):
            by_count[count] = e
    own = record.train_fingerprint
    order = sorted(chosen, key=lambda s: bool(own) and s.fingerprint != own)  # stable
    out = []
    for setting in order:
        by_length = chosen[setting]
        count = row_token_count(by_length)
        ref = next((counts[count] for counts in by_length.values() if count in counts), None)
        out.append(
            Series(record=record, setting=setting, entries=[_pick(by_length[k], ref) for k in sorted(by_length)])
        )
    return out


def _pick(by_count: dict[int, dict[str, Any]], ref: dict[str, Any] | None) -> dict[str, Any]:
    """The entry of one length to show beside `ref`: of `ref`'s count, else of one budget with it
    (`same_budget`), else the newest."""
    if ref is not None:
        if int(ref["tokens"]) in by_count:
            return by_count[int(ref["tokens"])]
        alike = [e for e in by_count.values() if same_budget(e, ref)]
        if alike:
            return _newest(alike)
    return _newest(by_count.values())


def window_tokens(entry: dict[str, Any]) -> int:
    """Tokens one window of `entry` scores: the stride (sliding) or target (fixed-target), else the length."""
    if entry["protocol"] in ("sliding", "fixed-target") and entry.get("stride"):
        return int(entry["stride"])
    return int(entry["length"])


def same_budget(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two cells' scored-token counts can come from one `--tokens` budget: evaluation scores whole windows,
    rounding the budget up (`planning.plan_windows`), so a count T of windows of u tokens stands for any budget in
    (T - u, T]; 1,008 tokens at 16 per window and 1,024 at 32 are both --tokens 1000."""
    ta, tb = int(a.get("tokens") or 0), int(b.get("tokens") or 0)
    if ta == tb:
        return True
    if ta <= 0 or tb <= 0:
        return False
    return ta - window_tokens(a) < tb and tb - window_tokens(b) < ta


def row_token_count(by_length: dict[float, dict[int, dict[str, Any]]]) -> int | None:
    """The scored-token count a row shows: the one most lengths were measured with (cells that scored nothing
    aside), ties to the count measured most recently; None when no length scored a token."""
    lengths = Counter(c for counts in by_length.values() for c in counts if c > 0)
    if not lengths:
        return None
    latest = {c: max(str(e.get("created", "")) for counts in by_length.values() for n, e in counts.items() if n == c)
              for c in lengths}  # fmt: skip
    return max(lengths, key=lambda c: (lengths[c], latest[c]))


def _newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return str(a.get("created", "")) >= str(b.get("created", ""))


def _newest(entries: Any) -> dict[str, Any]:
    return max(entries, key=lambda e: str(e.get("created", "")))


def labelled_series(records: list[RunRecord]) -> list[Series]:
    """Every record's series, labelled so that one label is one row.

    Runs of one label are the seeds of one experiment (`seed_clusters`); runs of one label that are not (a run and
    its export, two experiments in directories of one name) are told apart by the end of their directory paths.
    A label then says the setting parts that vary in the table (corpus, precision, protocol, positions), so the
    series sharing a label, averaged as mean ± std, share their setting and differ by the seed alone.
    """
    tails = _cluster_tails(seed_clusters(records))
    series = [s for r in records for s in record_series(r)]
    settings = [s.setting for s in series if s.setting is not None]
    corpus_names = _corpus_names(settings)
    vary = [f for f in ("data", "dtype", "protocol", "positions") if len({getattr(s, f) for s in settings}) > 1]
    if "data" not in vary and len(corpus_names) > 1:
        vary.insert(0, "data")  # one name, two texts
    for s in series:
        label = " · ".join([s.record.label, tails[id(s.record)]] if id(s.record) in tails else [s.record.label])
        s.label = label if s.setting is None else _with_setting(label, s.setting, vary, corpus_names)
    _tell_apart_unshown_settings(series)
    return series


def _tell_apart_unshown_settings(series: list[Series]) -> None:
    """Settings that differ only in a part no label shows (a key field evaluation added later) get "variant k"."""
    settings: dict[str, list[Setting]] = {}
    for s in series:
        if s.setting is not None and s.setting not in settings.setdefault(s.label, []):
            settings[s.label].append(s.setting)
    for s in series:
        found = settings.get(s.label, [])
        if len(found) > 1 and s.setting is not None:
            s.label = f"{s.label} · variant {found.index(s.setting) + 1}"


def seed_clusters(records: list[RunRecord], statuses: Collection[str] = ("ok",)) -> list[list[RunRecord]]:
    """The measured records grouped as the seeds of one experiment: one label, one saved config but for the seed
    (`config_identity`), distinct seeds. A run without a readable config (a transformers directory) is alone, and
    so is a run repeating a seed of its cluster. Records whose status is not in `statuses` join no cluster (by
    default failed or unmeasured jobs; a task table also clusters runs without perplexity cells)."""
    clusters: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        if r.status not in statuses:
            continue
        key = (r.label, r.identity or str(r.run_dir))
        if any(m.seed == r.seed for m in clusters.get(key, [])):  # the same seed twice is no spread over seeds
            key = (r.label, str(r.run_dir))
        clusters.setdefault(key, []).append(r)
    return list(clusters.values())


def cluster_labels(clusters: list[list[RunRecord]]) -> list[str]:
    """Each cluster's row label: its runs' label, and where another cluster shares the label, its sweep stage when
    each such cluster is of one stage and the stages differ ('rope · seeds', 'rope · long'), else the end of its
    first directory ('rope · lr=0.001/rope')."""
    tails = _cluster_tails(clusters)
    stages = [{r.stage for r in c} for c in clusters]
    by_label: dict[str, list[int]] = {}
    for i, c in enumerate(clusters):
        by_label.setdefault(c[0].label, []).append(i)
    for shared in (ix for ix in by_label.values() if len(ix) > 1):
        names = [next(iter(stages[i])) if len(stages[i]) == 1 else "" for i in shared]
        if all(names) and len(set(names)) == len(names):
            tails.update((id(clusters[i][0]), name) for i, name in zip(shared, names, strict=True))
    return [" · ".join([c[0].label, tails[id(c[0])]]) if id(c[0]) in tails else c[0].label for c in clusters]


def _cluster_tails(clusters: list[list[RunRecord]]) -> dict[int, str]:
    """id(record) -> the end of its cluster's first directory, for clusters sharing a label with another."""
    by_label: dict[str, list[list[RunRecord]]] = {}
    for cluster in clusters:
        by_label.setdefault(cluster[0].label, []).append(cluster)
    out: dict[int, str] = {}
    for clashing in by_label.values():
        if len(clashing) > 1:
            for cluster, tail in zip(clashing, distinct_tails([c[0].run_dir for c in clashing]), strict=True):
                out.update((id(r), tail) for r in cluster)
    return out


def _corpus_names(settings: list[Setting]) -> dict[tuple[str, str], str]:
    """(name, fingerprint) -> shown name: the name, with the fingerprint's start where one name has two texts."""
    pairs = list(dict.fromkeys((s.data, s.fingerprint) for s in settings))
    names = Counter(name for name, _ in pairs)
    return {(n, fp): f"{n}@{fp[:8]}" if names[n] > 1 else n for n, fp in pairs}


def _with_setting(label: str, setting: Setting, vary: list[str], corpus_names: dict[tuple[str, str], str]) -> str:
    parts = [corpus_names[(setting.data, setting.fingerprint)] if f == "data" else getattr(setting, f) for f in vary]
    return " · ".join([label, *[p or "positions 0..L-1" for p in parts]])


def distinct_tails(paths: list[Path]) -> list[str]:
    """The shortest path endings that tell the directories apart ('runs/rope', 'exported/rope')."""
    parts = [Path(p).resolve().parts for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        tails = ["/".join(p[-k:]) for p in parts]
        if len(set(tails)) == len(tails):
            return tails
    return [str(p) for p in paths]
