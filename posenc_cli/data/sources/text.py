"""`data=text data.paths=[...]`: files, directories and globs read by the `datasets` `text` builder, one document
per file; validation by a hash of the document's content, or the files in `data.val_paths`.

An evaluation-only corpus has `data.val_paths` and no `data.paths`: every file is validation, scored whole, and
nothing is left to train on (`posenc eval-extrapolate RUN data=text 'data.paths=[held_out.txt]'` builds one, see
`posenc_cli.evaluation.corpus.data_config_with_overrides`).
"""

from __future__ import annotations

import codecs
import glob
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.config import DataConfig
from posenc_cli.data.sources import register
from posenc_cli.data.sources._datasets import quiet_datasets, scan_dataset
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    Docs,
    ProgressFn,
    Source,
    memory_table,
    report_progress,
    short_hash,
    split_table,
    whole,
)
from posenc_cli.errors import ConfigError, DataError


@dataclass(kw_only=True)
class TextDataConfig(DataConfig):
    """`data=text`: local files, directories or globs (`paths`); `val_paths` hold out whole files (alone: an
    evaluation-only corpus, no training split)."""

    source: str = "text"
    paths: list[str] = field(default_factory=list)
    val_paths: list[str] = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        if not self.paths and not self.val_paths:
            raise ConfigError("data=text needs data.paths=[FILE_OR_DIR_OR_GLOB,...]")

    @property
    def evaluation_only(self) -> bool:
        """Only held-out files: every file is scored whole, there is no training split."""
        return not self.paths and bool(self.val_paths)


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Files named by `patterns` (files, directories searched recursively, globs), resolved, sorted, unique.

    Hidden files and directories inside a directory are skipped. Raises `DataError` naming every pattern that
    matches no file.
    """
    files: list[Path] = []
    missing: list[str] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if any(ch in pattern for ch in "*?["):
            candidates = [Path(p) for p in sorted(glob.glob(str(path), recursive=True))]
        else:
            candidates = [path] if path.exists() else []
        found: list[Path] = []
        for c in candidates:
            if c.is_dir():
                found.extend(
                    f
                    for f in c.rglob("*")
                    if f.is_file() and not any(p.startswith(".") for p in f.relative_to(c).parts)
                )
            elif c.is_file():
                found.append(c)
        if found:
            files.extend(found)
        else:
            missing.append(pattern)
    if missing:
        raise DataError(f"data path{'s' if len(missing) > 1 else ''} not found or empty: {', '.join(missing)}")
    return sorted({f.resolve() for f in files}, key=str)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# What a file of a text corpus may hold (checked on its first `TEXT_SAMPLE_BYTES`, before anything is tokenized):
# no NUL byte (binary formats such as Parquet, zip or a checkpoint hold them; text never does) and at most
# `MAX_INVALID_UTF8` of its characters undecodable as UTF-8 (a stray Latin-1 byte is replaced, a binary file refused).
TEXT_SAMPLE_BYTES = 64 * 1024
MAX_INVALID_UTF8 = 0.01


def not_text_reason(path: Path, sample_bytes: int = TEXT_SAMPLE_BYTES) -> str | None:
    """Why `path` is not a text file (NUL bytes, or more than `MAX_INVALID_UTF8` of its sample's characters
    invalid UTF-8), from its first `sample_bytes`; None when it reads as text."""
    with open(path, "rb") as f:
        sample = f.read(sample_bytes)
    if (nul := sample.find(b"\0")) >= 0:
        return f"{path} holds a NUL byte at offset {nul}: a binary file, not text"
    # final=False: a character cut by the end of the sample is not counted as invalid
    decoded = codecs.getincrementaldecoder("utf-8")("replace").decode(sample, final=False)
    bad = decoded.count("\ufffd") - sample.decode("utf-8", "ignore").count("\ufffd")  # U+FFFD written as text
    if decoded and bad > MAX_INVALID_UTF8 * len(decoded):
        share = bad / len(decoded)
        return f"{path} is not UTF-8 text ({share:.0%} of its first {len(sample):,} bytes' characters are invalid)"
    return None


def check_text_files(files: Sequence[Path]) -> None:
    """DataError naming the first of `files` that is not text (`not_text_reason`)."""
    for f in files:
        if (why := not_text_reason(f)) is not None:
            raise DataError(f"data=text reads text files only: {why}")


def trained_files_among(corpus: TextDataConfig, trained: DataConfig) -> list[Path]:
    """Files of `corpus` whose content is a file `trained` (a run's data config) trains on, wholly or in part: a
    file of its `data.paths` not held out by its `data.val_paths` (a lone file's head is training). Compared by
    size, then sha256; [] when `trained` is not a text corpus or its files are not on this machine."""
    if not isinstance(trained, TextDataConfig) or not trained.paths:
        return []
    try:
        held_out = set(expand_paths(trained.val_paths)) if trained.val_paths else set()
        training = [f for f in expand_paths(trained.paths) if f not in held_out]
        mine = expand_paths(corpus.val_paths) + (expand_paths(corpus.paths) if corpus.paths else [])
    except DataError:
        return []
    sizes: dict[int, list[Path]] = {}
    for f in training:
        sizes.setdefault(f.stat().st_size, []).append(f)
    found = []
    for f in mine:
        same_size = sizes.get(f.stat().st_size, [])
        if same_size and file_sha256(f) in {file_sha256(t) for t in same_size}:
            found.append(f)
    return found


@register
class TextSource(DataSource):
    name = "text"
    config_cls = TextDataConfig

    @classmethod
    def open(cls, data: TextDataConfig, root: Path, progress: ProgressFn | None) -> Source:
        val_files = expand_paths(data.val_paths) if data.val_paths else []
        held_out = set(val_files)
        train_files = [f for f in expand_paths(data.paths) if f not in held_out] if data.paths else []
        if not train_files and not data.evaluation_only:
            raise DataError("every file in data.paths is also in data.val_paths: nothing is left to train on")
        roles = [("train", f) for f in train_files] + [("val", f) for f in val_files]
        check_text_files([f for _, f in roles])  # before hashing or tokenizing anything
        hashes = []
        for i, (role, f) in enumerate(roles):
            hashes.append((role, file_sha256(f)))
            report_progress(progress, "reading", i + 1, len(roles))
        split_rule: Any = "whole files" if data.evaluation_only else "val_paths" if val_files else data.val_fraction
        info = {
            "source": "text",
            "paths": list(data.paths),
            "val_paths": list(data.val_paths),
            "files": len(roles),
            "val_fraction": data.val_fraction,
        }

        def documents() -> tuple[Docs, Docs, str]:
            # deferred: keeps datasets off posenc --help start-up
            import datasets

            data_files = {"train": [str(f) for f in train_files]} if train_files else {}
            if val_files:
                data_files["val"] = [str(f) for f in val_files]
            try:
                with quiet_datasets():
                    dd = datasets.load_dataset(
                        "text",
                        data_files=data_files,
                        sample_by="document",
                        encoding_errors="replace",
                        cache_dir=str(root / "hf"),
                    )
            except OSError as e:
                raise DataError(f"could not read data.paths: {e}") from e
            if not train_files:  # an evaluation-only corpus: the held-out files whole, nothing to train on
                return whole(memory_table([])), whole(scan_dataset(dd["val"], "text", progress)), "whole files"
            train = scan_dataset(dd["train"], "text", progress)
            if val_files:
                return whole(train), whole(scan_dataset(dd["val"], "text", progress)), "data.val_paths"
            return split_table(train, data.val_fraction, "data.paths")

        return Source(
            fingerprint=short_hash("text", FORMAT_VERSION, hashes, split_rule), info=info, documents=documents
        )

    @classmethod
    def describe(cls, data: TextDataConfig) -> str:
        names = [Path(p).name or p for p in (data.val_paths or data.paths)]
        return "text:" + ",".join(names)
