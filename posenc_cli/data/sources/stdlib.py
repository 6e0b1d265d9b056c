"""`data=stdlib` (default): the running Python's standard-library `.py` files, in sorted relative-path order.

No download. A file goes to validation when sha256(relative path) maps below `data.val_fraction`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc_cli.config import DataConfig
from posenc_cli.data.sources import register
from posenc_cli.data.sources.base import (
    FORMAT_VERSION,
    DataSource,
    ProgressFn,
    Source,
    Table,
    hash_unit,
    report_progress,
    short_hash,
    split_table,
)
from posenc_cli.errors import DataError

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(kw_only=True)
class StdlibDataConfig(DataConfig):
    """`data=stdlib`: no options beyond the common ones (`val_fraction`, `cache_dir`)."""

    source: str = "stdlib"


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[str]:
    """Relative POSIX paths of the `.py` files under `root`, sorted; skips site-/dist-packages and __pycache__."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        rel = Path(dirpath).relative_to(root)
        out.extend((rel / f).as_posix() for f in filenames if f.endswith(".py"))
    return sorted(out)


@register
class StdlibSource(DataSource):
    name = "stdlib"
    config_cls = StdlibDataConfig

    @classmethod
    def open(cls, data: DataConfig, root: Path, progress: ProgressFn | None) -> Source:
        lib = stdlib_root()
        if not lib.is_dir():
            raise DataError(f"the standard library was not found at {lib}; use data=text data.paths=[...] instead")
        rels = stdlib_files(lib)
        if not rels:
            raise DataError(f"no .py files under {lib}; use data=text data.paths=[...] instead")
        digest = hashlib.sha256()
        contents: list[bytes] = []
        for i, rel in enumerate(rels):
            raw = (lib / rel).read_bytes()
            digest.update(rel.encode("utf-8") + b"\0" + len(raw).to_bytes(8, "little"))
            digest.update(raw)
            contents.append(raw)
            report_progress(progress, "reading", i + 1, len(rels))

        def read() -> Iterator[list[str]]:
            for start in range(0, len(contents), 64):
                yield [raw.decode("utf-8", errors="replace") for raw in contents[start : start + 64]]

        table = Table(
            read=read,
            sizes=np.array([len(c) for c in contents], dtype=np.int64),
            scores=np.array([hash_unit(rel.encode("utf-8")) for rel in rels]),
        )
        content = digest.hexdigest()
        info = {
            "source": "stdlib",
            "root": str(lib),
            "files": len(rels),
            "python_version": platform.python_version(),
            "content_sha256": content,
            "val_fraction": data.val_fraction,
        }
        return Source(
            fingerprint=short_hash("stdlib", FORMAT_VERSION, content, data.val_fraction),
            info=info,
            documents=lambda: split_table(table, data.val_fraction, f"the standard library at {lib}"),
        )
