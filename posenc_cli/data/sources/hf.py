"""`data=hf`: a `datasets` corpus, one document per row of `data.text_column`; validation from `data.val_split` or by
content hash.

Where it comes from: a Hub dataset `data.name` (and `data.config`; the local `datasets` cache when offline), a
`save_to_disk` folder given as `data.name` (read with `load_from_disk`), or local parquet/JSON/CSV/text files
`data.data_files` (a text file's documents are its blank-line-separated paragraphs). With `data.streaming=true` the
rows are read as a stream (`load_dataset(..., streaming=True)`, or a memory-mapped table's `to_iterable_dataset()`),
optionally through a shuffle buffer (`data.shuffle_buffer`, `data.shuffle_seed`), split by document hash as they
come, and the token cache stops at `data.max_tokens`: memory does not grow with the corpus.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from posenc_cli.config import DataConfig
from posenc_cli.data.sources import register
from posenc_cli.data.sources._datasets import quiet_datasets, scan_dataset
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    Docs,
    ProgressFn,
    Source,
    Stream,
    report_progress,
    short_hash,
    split_table,
    whole,
)
from posenc_cli.data.sources.text import expand_paths
from posenc_cli.errors import ConfigError, DataError

# `datasets`' packaged builders for local files, by file suffix (a compression suffix after it is allowed)
BUILDERS = {
    ".parquet": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".arrow": "arrow",
}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
ROWS_PER_READ = 1000  # rows per `datasets` batch while streaming
RELEASE_EVERY = 16  # batches between handing Arrow's freed memory back (mimalloc kept ~220 MB of a 200 MB parquet)


@dataclass(kw_only=True)
class HfDataConfig(DataConfig):
    """`data=hf`: a Hub dataset `name` (and `config`) or a `save_to_disk` folder, or local `data_files`; its `split`
    and optional `val_split`, the column holding the text; `streaming` reads it as a stream, up to `max_tokens`
    tokens, through a shuffle buffer of `shuffle_buffer` rows (0: in order) seeded by `shuffle_seed`."""

    source: str = "hf"
    name: str | None = None
    config: str | None = None
    split: str = "train"
    val_split: str | None = None
    text_column: str = "text"
    data_files: list[str] = field(default_factory=list)
    streaming: bool = False
    max_tokens: int | None = None
    shuffle_buffer: int = 0
    shuffle_seed: int = 0

    def validate(self) -> None:
        super().validate()
        if not self.name and not self.data_files:
            raise ConfigError(
                "data=hf needs data.name=<hub dataset or save_to_disk folder> or data.data_files=[FILE_OR_GLOB,...]"
            )
        if self.data_files and self.name and self.name not in set(BUILDERS.values()):
            raise ConfigError(
                f"data.data_files reads local files; data.name={self.name} must then be empty or one of "
                f"{', '.join(sorted(set(BUILDERS.values())))}"
            )
        if self.data_files and self.val_split:
            raise ConfigError(
                "data.val_split names a split of a dataset; local data.data_files are split by data.val_fraction"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"data.max_tokens must be >= 1 (or null: the whole corpus), got {self.max_tokens}")
        if self.shuffle_buffer < 0:
            raise ConfigError(f"data.shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        if not self.streaming and (self.max_tokens is not None or self.shuffle_buffer):
            raise ConfigError("data.max_tokens and data.shuffle_buffer read a stream: add data.streaming=true")


def hf_offline() -> bool:
    """Whether Hub access is switched off (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, read now, not at import)."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    env = [os.environ.get(k, "") for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")]
    return any(v.upper() in {"1", "ON", "YES", "TRUE"} for v in env) or bool(datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def _offline_mode(offline: bool) -> Iterator[None]:
    """`datasets` reads the offline variables at import; honour them when they were set later (tests, notebooks)."""
    # deferred: keeps datasets and huggingface_hub off posenc --help start-up
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    if offline:
        datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the Hub's endpoint ($HF_ENDPOINT, default huggingface.co:443). Without it, `datasets`
    retries every request with back-off (about 26 s of warnings) before failing, so posenc checks once first."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------------------------
# Where the rows come from: local files, a save_to_disk folder, or the Hub (its local cache offline).


def saved_folder(name: str | None) -> Path | None:
    """`name` as a `save_to_disk` folder (it holds dataset_dict.json or state.json), else None."""
    if not name:
        return None
    path = Path(name).expanduser()
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return path
    return None


def local_files(data: HfDataConfig) -> list[Path] | None:
    """The local files `data` reads (`data.data_files`, or `data.name` naming one file), else None."""
    if data.data_files:
        return expand_paths(data.data_files)
    if data.name and Path(data.name).expanduser().is_file():
        return [Path(data.name).expanduser().resolve()]
    return None


def builder_of(files: list[Path], name: str | None) -> str:
    """The `datasets` builder that reads `files`: `name` when it is one, else the one their suffixes name."""
    if name in set(BUILDERS.values()):
        return str(name)
    kinds: dict[str, str] = {}
    for f in files:
        suffixes = [s.lower() for s in f.suffixes]
        if suffixes and suffixes[-1] in COMPRESSIONS:
            suffixes = suffixes[:-1]
        kinds[f.name] = BUILDERS.get(suffixes[-1] if suffixes else "", "?")
    found = set(kinds.values())
    if found == {"?"} or len(found) > 1:
        shown = ", ".join(f"{n} ({k})" for n, k in list(kinds.items())[:4])
        raise DataError(
            f"data.data_files: cannot tell one format from the file names ({shown}); name it with "
            f"data.name={'|'.join(sorted(set(BUILDERS.values())))}"
        )
    return found.pop()


def _where(data: HfDataConfig, split: str) -> str:
    return f"'{data.name}'" + (f" config '{data.config}'" if data.config else "") + f" split '{split}'"


def _download_hint(data: HfDataConfig, split: str) -> str:
    """What to run, where there is network, to put the dataset where posenc looks (the `datasets` cache)."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    args = ", ".join(repr(a) for a in (data.name, data.config) if a is not None)
    return (
        f'download it where there is network with python -c "import datasets; datasets.load_dataset({args}, '
        f"split='{split}')\" into the datasets cache {datasets.config.HF_DATASETS_CACHE} (HF_DATASETS_CACHE), or "
        "pass a save_to_disk folder as data.name=FOLDER or local files as data.data_files=[FILE,...]"
    )


def load_hub(data: HfDataConfig, split: str, streaming: bool) -> Any:
    """A Hub dataset: streamed from the Hub when online, else read from the local `datasets` cache (memory-mapped;
    streamed from there with `to_iterable_dataset`)."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    where = _where(data, split)
    offline = hf_offline()
    unreachable = not offline and not hub_reachable()  # then read the local cache only, without retries
    online_stream = streaming and not offline and not unreachable
    try:
        with _offline_mode(offline or unreachable):
            if online_stream:
                ds = datasets.load_dataset(data.name, data.config, split=split, streaming=True)
            else:
                ds = datasets.load_dataset(data.name, data.config, split=split)
    except ValueError as e:  # unknown config or split name
        if unreachable:
            raise DataError(
                f"dataset {where} could not be fetched: the Hugging Face Hub is unreachable (no network?) and it is "
                f"not in the local cache; {_download_hint(data, split)}"
            ) from e
        raise DataError(f"dataset {where} could not be loaded: {first_line(e)}") from e
    except Exception as e:
        if "load_from_disk" in str(e):  # a save_to_disk folder that is not where data.name points
            raise DataError(f"dataset {where}: {first_line(e)}") from e
        reason = (
            "offline mode is on (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE) and it is not in the local cache"
            if offline
            else "the Hub is unreachable (no network?) and it is not in the local cache"
            if unreachable
            else first_line(e)
        )
        raise DataError(
            f"dataset {where} could not be fetched from the Hugging Face Hub ({reason}); {_download_hint(data, split)}"
        ) from e
    return ds


def load_saved(folder: Path, split: str) -> Any:
    """A `save_to_disk` folder (`load_from_disk`): a DatasetDict's `split`, or the one table it holds."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    try:
        loaded = datasets.load_from_disk(str(folder))
    except (OSError, ValueError) as e:
        raise DataError(f"{folder}: not a readable save_to_disk folder ({first_line(e)})") from e
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{folder}: no split '{split}' (splits: {', '.join(loaded)})")
        return loaded[split]
    return loaded


def load_files(files: list[Path], builder: str, root: Path, streaming: bool) -> Any:
    """Local files through a packaged `datasets` builder (text: one document per blank-line-separated paragraph)."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    if builder == "text":
        from posenc_cli.data.sources.text import check_text_files

        check_text_files(files)  # a parquet file named .txt would otherwise be read as bytes
    if builder == "parquet" and streaming:
        return parquet_stream(files)
    kwargs: dict[str, Any] = {"sample_by": "paragraph"} if builder == "text" else {}
    try:
        with quiet_datasets():
            return datasets.load_dataset(
                builder,
                data_files={"train": [str(f) for f in files]},
                split="train",
                streaming=streaming,
                cache_dir=str(root / "hf"),
                **kwargs,
            )
    except Exception as e:  # the builders raise anything from ArrowInvalid to JSONDecodeError on a bad file
        raise DataError(f"data.data_files could not be read as {builder}: {first_line(e)}") from e


def _parquet_rows(paths: list[str]) -> Iterator[dict[str, Any]]:
    """The rows of parquet files, one row group in memory at a time."""
    # deferred: keeps pyarrow off posenc --help start-up
    import pyarrow.parquet as pq

    for path in paths:
        reader = pq.ParquetFile(path)
        for i in range(reader.num_row_groups):
            yield from reader.read_row_group(i).to_pylist()


def parquet_stream(files: list[Path]) -> Any:
    """Local parquet files as a `datasets` stream read row group by row group with pyarrow: `datasets`' own parquet
    stream (datasets 5.2, pyarrow 26) held memory that grew with the file (a 1 GB corpus streamed into training
    peaked at 1.2 GB, a 100 MB one at 0.6 GB); reading one row group at a time stays flat."""
    # deferred: keeps datasets and pyarrow off posenc --help start-up
    import datasets
    import pyarrow.parquet as pq

    try:
        features = datasets.Features.from_arrow_schema(pq.read_schema(files[0]))
    except Exception as e:  # pyarrow raises ArrowInvalid (a ValueError) or OSError on a file that is not parquet
        raise DataError(f"data.data_files could not be read as parquet: {first_line(e)}") from e
    paths = [str(f) for f in files]
    return datasets.IterableDataset.from_generator(_parquet_rows, features=features, gen_kwargs={"paths": paths})


def load_hf(data: HfDataConfig, split: str, root: Path | None = None, *, streaming: bool = False) -> Any:
    """The table (or stream) of `split`, its text column checked."""
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    files = local_files(data)
    folder = saved_folder(data.name)
    if files is not None:
        ds = load_files(files, builder_of(files, data.name), root or Path("."), streaming)
        where = "data.data_files"
    elif folder is not None:
        ds = load_saved(folder, split)
        where = f"{folder} split '{split}'"
    else:
        ds = load_hub(data, split, streaming)
        where = f"dataset {_where(data, split)}"
    if streaming and isinstance(ds, datasets.Dataset):
        ds = ds.to_iterable_dataset()  # memory-mapped Arrow, read in order
    elif not streaming and not isinstance(ds, datasets.Dataset):
        raise DataError(f"{where} did not load as a single table (got {type(ds).__name__})")
    check_column(ds, data.text_column, where)
    return ds


def check_column(ds: Any, column: str, where: str) -> None:
    """DataError unless `column` is a text column of `ds` (a stream of unknown features is checked as it is read)."""
    features = getattr(ds, "features", None)
    if features is None:
        return
    if column not in features:
        raise DataError(f"data.text_column='{column}' is not a column of {where} (columns: {', '.join(features)})")
    feature = features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"data.text_column='{column}' of {where} holds {feature}, not text")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------------------------
# Streaming.


def stream_reader(ds: Any, data: HfDataConfig) -> Callable[[], Iterator[list[str]]]:
    """Batches of the text of a `datasets.IterableDataset` (through its shuffle buffer), read anew on each call."""
    column = data.text_column
    if data.shuffle_buffer:
        ds = ds.shuffle(seed=data.shuffle_seed, buffer_size=data.shuffle_buffer)

    def read() -> Iterator[list[str]]:
        # deferred: keeps pyarrow off posenc --help start-up
        import pyarrow

        pool = pyarrow.default_memory_pool()
        try:
            for i, batch in enumerate(ds.select_columns([column]).iter(batch_size=ROWS_PER_READ)):
                if i % RELEASE_EVERY == RELEASE_EVERY - 1:
                    pool.release_unused()  # Arrow's allocator kept what earlier row groups freed
                texts = batch[column]
                if any(t is not None and not isinstance(t, str) for t in texts):
                    raise DataError(f"data.text_column='{column}' holds {type(texts[0]).__name__}, not text")
                yield [t or "" for t in texts]
        except (KeyError, ValueError) as e:  # a column missing from a stream of unknown features
            raise DataError(f"data.text_column='{column}' could not be read: {first_line(e)}") from e

    return read


def origin(data: HfDataConfig) -> list[Any]:
    """What a stream reads, cheaply: local files by path, size and modification time; a save_to_disk folder by its
    tables' `datasets` fingerprints; a Hub dataset by name and config."""
    files = local_files(data)
    if files is not None:
        stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return ["files", builder_of(files, data.name), stats]
    folder = saved_folder(data.name)
    if folder is not None:
        states = sorted(str(p.relative_to(folder)) + ":" + p.read_text() for p in folder.rglob("state.json"))
        return ["disk", str(folder.resolve()), states]
    return ["hub", data.name, data.config]


def stream_fingerprint(data: HfDataConfig) -> str:
    """Same origin, split rule, budget and shuffle (seed included) => same fingerprint, so the same token cache."""
    shuffle = [data.shuffle_buffer, data.shuffle_seed] if data.shuffle_buffer else None
    parts = [origin(data), data.split, data.val_split, data.text_column, data.val_fraction, data.max_tokens, shuffle]
    return short_hash("hf-stream", FORMAT_VERSION, parts)


def _info(data: HfDataConfig) -> dict[str, Any]:
    info: dict[str, Any] = {
        "source": "hf",
        "name": data.name or ",".join(Path(p).name or p for p in data.data_files),  # local files: their names
        "config": data.config,
        "split": data.split,
        "val_split": data.val_split,
        "text_column": data.text_column,
        "val_fraction": data.val_fraction,
    }
    if data.data_files:
        info["data_files"] = list(data.data_files)
    if data.streaming:
        info |= {"streaming": True, "max_tokens": data.max_tokens, "shuffle_buffer": data.shuffle_buffer}
        if data.shuffle_buffer:
            info["shuffle_seed"] = data.shuffle_seed
    return info


@register
class HfSource(DataSource):
    name = "hf"
    config_cls = HfDataConfig

    @classmethod
    def open(cls, data: HfDataConfig, root: Path, progress: ProgressFn | None) -> Source:
        report_progress(progress, "reading", 0, 1)
        if data.streaming:
            return cls._open_stream(data, root)
        ds = load_hf(data, data.split, root)
        val_ds = load_hf(data, data.val_split, root) if data.val_split else None
        parts = [data.name, data.config, data.split, data.val_split, data.text_column, data.val_fraction]
        if data.data_files:
            parts.append(data.data_files)
        parts += [getattr(d, "_fingerprint", None) for d in (ds, val_ds) if d is not None]
        parts += [d.num_rows for d in (ds, val_ds) if d is not None]
        info = _info(data) | {"rows": ds.num_rows + (val_ds.num_rows if val_ds is not None else 0)}
        what = f"dataset '{data.name}'" if data.name else "data.data_files"

        def documents() -> tuple[Docs, Docs, str]:
            train = scan_dataset(ds, data.text_column, progress)
            if val_ds is not None:
                return whole(train), whole(scan_dataset(val_ds, data.text_column, progress)), "data.val_split"
            return split_table(train, data.val_fraction, what)

        return Source(fingerprint=short_hash("hf", FORMAT_VERSION, parts), info=info, documents=documents)

    @classmethod
    def _open_stream(cls, data: HfDataConfig, root: Path) -> Source:
        ds = load_hf(data, data.split, root, streaming=True)
        val_ds = load_hf(data, data.val_split, root, streaming=True) if data.val_split else None
        stream = Stream(
            read=stream_reader(ds, data),
            val_fraction=data.val_fraction,
            max_tokens=data.max_tokens,
            read_val=stream_reader(val_ds, data) if val_ds is not None else None,
        )
        method = "data.val_split" if val_ds is not None else "document hash (streamed)"

        def documents() -> tuple[Docs, Docs, str]:
            return stream.split(False), stream.split(True), method  # type: ignore[return-value]  # Docs' interface

        return Source(fingerprint=stream_fingerprint(data), info=_info(data), documents=documents, stream=stream)

    @classmethod
    def describe(cls, data: HfDataConfig) -> str:
        if data.data_files or (data.name and Path(data.name).expanduser().exists()):
            return "hf:" + ",".join(Path(p).name or p for p in (data.data_files or [str(data.name)]))
        return f"hf:{data.name}" + (f"/{data.config}" if data.config else "")
