"""`data=hf data.name=...`: `datasets.load_dataset(name, config, split=...)`, one document per row of
`data.text_column`; validation from `data.val_split` or by content hash.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from posenc_cli.config import DataConfig
from posenc_cli.data.sources import register
from posenc_cli.data.sources._datasets import scan_dataset
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    Docs,
    ProgressFn,
    Source,
    report_progress,
    short_hash,
    split_table,
    whole,
)
from posenc_cli.errors import ConfigError, DataError


@dataclass(kw_only=True)
class HfDataConfig(DataConfig):
    """`data=hf`: a Hugging Face Hub dataset `name` (and `config`), its `split` and optional `val_split`, and the
    column holding the text."""

    source: str = "hf"
    name: str | None = None
    config: str | None = None
    split: str = "train"
    val_split: str | None = None
    text_column: str = "text"

    def validate(self) -> None:
        super().validate()
        if not self.name:
            raise ConfigError("data=hf needs data.name=<hub dataset name>")


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


def load_hf(data: HfDataConfig, split: str) -> Any:
    # deferred: keeps datasets off posenc --help start-up
    import datasets

    where = f"'{data.name}'" + (f" config '{data.config}'" if data.config else "") + f" split '{split}'"
    offline = hf_offline()
    unreachable = not offline and not hub_reachable()  # then read the local cache only, without retries
    try:
        with _offline_mode(offline or unreachable):
            ds = datasets.load_dataset(data.name, data.config, split=split)
    except ValueError as e:  # unknown config or split name
        if unreachable:
            raise DataError(
                f"dataset {where} could not be fetched: the Hugging Face Hub is unreachable (no network?) and it is "
                "not in the local cache; to use local files instead: data=text data.paths=[FILE_OR_DIR,...]"
            ) from e
        raise DataError(f"dataset {where} could not be loaded: {first_line(e)}") from e
    except Exception as e:
        reason = (
            "offline mode is on (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE) and it is not in the local cache"
            if offline
            else "the Hub is unreachable (no network?) and it is not in the local cache"
            if unreachable
            else first_line(e)
        )
        raise DataError(
            f"dataset {where} could not be fetched from the Hugging Face Hub ({reason}); "
            "to use local files instead: data=text data.paths=[FILE_OR_DIR,...]"
        ) from e
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"dataset {where} did not load as a single table (got {type(ds).__name__})")
    column = data.text_column
    if column not in ds.column_names:
        raise DataError(
            f"data.text_column='{column}' is not a column of {where} (columns: {', '.join(ds.column_names)})"
        )
    feature = ds.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"data.text_column='{column}' of {where} holds {feature}, not text")
    return ds


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@register
class HfSource(DataSource):
    name = "hf"
    config_cls = HfDataConfig

    @classmethod
    def open(cls, data: HfDataConfig, root: Path, progress: ProgressFn | None) -> Source:
        report_progress(progress, "reading", 0, 1)
        ds = load_hf(data, data.split)
        val_ds = load_hf(data, data.val_split) if data.val_split else None
        parts = [data.name, data.config, data.split, data.val_split, data.text_column, data.val_fraction]
        parts += [getattr(d, "_fingerprint", None) for d in (ds, val_ds) if d is not None]
        parts += [d.num_rows for d in (ds, val_ds) if d is not None]
        info = {
            "source": "hf",
            "name": data.name,
            "config": data.config,
            "split": data.split,
            "val_split": data.val_split,
            "text_column": data.text_column,
            "rows": ds.num_rows + (val_ds.num_rows if val_ds is not None else 0),
            "val_fraction": data.val_fraction,
        }

        def documents() -> tuple[Docs, Docs, str]:
            train = scan_dataset(ds, data.text_column, progress)
            if val_ds is not None:
                return whole(train), whole(scan_dataset(val_ds, data.text_column, progress)), "data.val_split"
            return split_table(train, data.val_fraction, f"dataset '{data.name}'")

        return Source(fingerprint=short_hash("hf", FORMAT_VERSION, parts), info=info, documents=documents)

    @classmethod
    def describe(cls, data: HfDataConfig) -> str:
        return f"hf:{data.name}" + (f"/{data.config}" if data.config else "")
