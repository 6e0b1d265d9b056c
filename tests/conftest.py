"""Shared test setup: one thread per test worker, no writes outside tmp dirs, headless plots; the corpus fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from corpus_utils import write_files

import posenc_cli.data.sources.stdlib

# The tests mirror the package (tests/<package>/test_<module>.py; basenames unique): a test module may import another
# folder's test helpers by module name (`from test_perplexity import fake_run`), whatever order pytest collects in.
_FOLDERS = (d for d in Path(__file__).parent.iterdir() if d.is_dir() and not d.name.startswith((".", "_")))
sys.path[1:1] = sorted(str(d) for d in _FOLDERS)

os.environ.setdefault("MPLBACKEND", "Agg")
# Rich sizes its consoles from COLUMNS when stdout is not a terminal (CI, xdist workers): keep tables unwrapped.
os.environ["COLUMNS"] = "200"


def _shared_basenames(root: Path) -> list[str]:
    """Test module basenames that more than one folder uses (pytest would import only the first of them)."""
    seen: dict[str, list[Path]] = {}
    for path in root.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(path.relative_to(root))
    return sorted(f"{name} ({', '.join(map(str, sorted(paths)))})" for name, paths in seen.items() if len(paths) > 1)


def pytest_configure(config: pytest.Config) -> None:
    if shared := _shared_basenames(Path(__file__).parent):
        raise pytest.UsageError(f"test module basenames must be unique (tests/conftest.py): {'; '.join(shared)}")
    # Parallel workers must share the cores, not fight for them: one intra-op thread per worker.
    import torch

    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Token caches and the machine's precision decision go to a session temp dir unless a test sets
    POSENC_CACHE_DIR / POSENC_PRECISION_CACHE itself (the suite never writes ~/.cache/posenc)."""
    if "POSENC_CACHE_DIR" not in os.environ:
        os.environ["POSENC_CACHE_DIR"] = str(tmp_path_factory.mktemp("posenc-cache"))
    if "POSENC_PRECISION_CACHE" not in os.environ:
        os.environ["POSENC_PRECISION_CACHE"] = str(tmp_path_factory.mktemp("precision") / "precision.json")


@pytest.fixture
def fake_stdlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 122-file stand-in for the standard library (plus files `data=stdlib` must skip), patched in as its root."""
    files = {f"pkg{i % 7}/mod_{i:03d}.py": f"# pkg{i % 7}/mod_{i:03d}.py\nx = {i}  # é\n" for i in range(120)}
    files |= {
        "abc.py": "# abc.py\nimport os\n",
        "pkg0/__init__.py": "",
        "site-packages/third.py": "# third party\n",
        "lib/dist-packages/other.py": "# other\n",
        "__pycache__/cached.py": "# cached\n",
        "README.txt": "not python\n",
    }
    root = write_files(tmp_path / "stdlib", files)
    monkeypatch.setattr(posenc_cli.data.sources.stdlib, "stdlib_root", lambda: root)
    return root


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    """30 .txt documents, one nested, one hidden and one .md, for `data=text`."""
    files = {f"doc_{i:02d}.txt": f"document {i}: ünïcode ✓\nsecond line {i}\n" for i in range(30)}
    files |= {"sub/nested.txt": "nested document\n", "sub/.hidden.txt": "hidden\n", "notes.md": "markdown doc\n"}
    return write_files(tmp_path / "corpus", files)
