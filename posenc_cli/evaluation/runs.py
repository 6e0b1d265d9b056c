"""Finding the runs an evaluation command names, checking them before anything is measured, and loading them in
turn (one model in memory at a time). Shared by every evaluation command (`perplexity`, `passkey`, the tasks).

`find_runs` resolves run, sweep and transformers directories; `checked_runs` reads every run cheaply first
(`check_run_files`: meta.json, config, weights file listed and present), so a folder holding a leftover broken run
says so at once, naming it, instead of failing after the good runs were measured: a run found by a search is left
out with a warning, a run named on the command line is a one-line error. `evaluate_each_run` then loads each in
turn (posenc's or an exported Hugging Face one; one model in memory at a time) and hands it to an evaluation: every
evaluation command and a sweep job share it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc_cli.errors import CheckpointError, UserError
from posenc_cli.run.device import resolve_device
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.hf_run import inspect_hf_dir, load_hf_run
from posenc_cli.run.journal import committed_file
from posenc_cli.run.load import load_run, read_config
from posenc_cli.run.meta import NotARunError, is_hf_dir, read_meta

if TYPE_CHECKING:
    import torch

    from posenc_cli.config import Config
    from posenc_cli.run.load import LoadedRun

__all__ = ["check_run_files", "checked_runs", "evaluate_each_run", "find_runs", "locate_runs", "named_error"]


def find_runs(paths: Iterable[Path | str]) -> list[Path]:
    """Run directories named by `paths`: each is a run (or a transformers model directory, see `hf_run`), or a
    directory searched recursively for posenc runs. A named run whose meta.json is corrupt, and a search that finds
    only such runs, raise `read_meta`'s error (naming the file) rather than "no run"."""
    located, _broken = locate_runs(paths)
    return [path for path, _named in located]


def locate_runs(paths: Iterable[Path | str]) -> tuple[list[tuple[Path, bool]], list[tuple[Path, CheckpointError]]]:
    """`find_runs` with where each run came from: ([(run, named: given itself rather than found by a search)],
    [(run found by a search, the error of its unreadable meta.json)]); the same errors as `find_runs`."""
    found: list[tuple[Path, bool]] = []
    broken: list[tuple[Path, CheckpointError]] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CheckpointError(f"{path}: no such directory")
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a directory (expected a run or sweep directory)")
        if is_hf_dir(path) or _is_run(path):
            found.append((path, True))
            continue
        below, bad = _runs_below(path)
        if not below and bad:
            raise bad[0][1]
        if not below:
            raise CheckpointError(f"{path}: not a run directory and contains none (no meta.json of kind posenc-run)")
        found.extend((p, False) for p in below)
        broken.extend(bad)
    unique: dict[Path, tuple[Path, bool]] = {}
    for p, named in found:
        first = unique.setdefault(p.resolve(), (p, named))
        unique[p.resolve()] = (first[0], first[1] or named)
    return list(unique.values()), broken


def _is_run(path: Path) -> bool:
    """True for a posenc run; False for a directory that is none; `read_meta`'s error for a broken run."""
    try:
        read_meta(path)
    except NotARunError:
        return False
    return True


def _runs_below(path: Path) -> tuple[list[Path], list[tuple[Path, CheckpointError]]]:
    """Runs found below `path` (hidden directories, such as a checkpoint's `.pending/`, are not searched), sorted,
    and the posenc runs below it that cannot be read, with their errors."""
    runs: list[Path] = []
    broken: list[tuple[Path, CheckpointError]] = []
    for meta in sorted(path.rglob("meta.json")):
        if any(part.startswith(".") for part in meta.relative_to(path).parts):
            continue
        try:
            if _is_run(meta.parent):
                runs.append(meta.parent)
        except CheckpointError as e:
            broken.append((meta.parent, e))
    return runs, broken


def check_run_files(path: Path) -> None:
    """Cheap checks of a run before anything is measured: its meta.json, its config (checksum and contents) and a
    weights file where meta.json lists one (a transformers directory: `hf_run.inspect_hf_dir`). Raises the
    `UserError` that loading it would raise, without reading the weights."""
    if is_hf_dir(path):
        inspect_hf_dir(path)
        return
    meta = read_meta(path)
    read_config(path, meta)
    weights = committed_file(path, "model.safetensors")
    if "model.safetensors" not in meta["files"] or not weights.is_file():
        raise CheckpointError(f"{weights}: missing")


def named_error(path: Path, e: UserError) -> UserError:
    """`e` with the run's path at the front of its message when the message does not name it yet."""
    if str(path) in str(e):
        return e
    try:
        return type(e)(f"{path}: {e}")
    except TypeError:  # an error class with its own constructor arguments
        return UserError(f"{path}: {e}")


def checked_runs(
    paths: Sequence[Path | str],
    *,
    check: Callable[[Config, Path], None] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
) -> tuple[list[Path], list[Path]]:
    """The runs below `paths`, every one checked before anything is measured: (runs to evaluate, those of them
    found by a search rather than named).

    A run that cannot be read (`check_run_files`: meta.json, config, weights file) is a one-line error naming it
    when it was named, and left out with `on_skip(run, why)` when a search found it (a sweep directory holding a
    leftover broken run still gives the table of the others); a search that finds no readable run raises the
    first error. `check(config, run)` then raises for settings that do not fit a posenc run (eval-extrapolate's
    `--positions random` on a run without randomized positions, data overrides for its data config): an error
    naming the run, wherever it came from.
    """
    located, broken = locate_runs(paths)
    skipped: list[tuple[Path, UserError]] = list(broken)
    runs: list[Path] = []
    for path, named in located:
        try:
            check_run_files(path)
        except UserError as e:
            if named or on_skip is None:
                raise named_error(path, e) from e
            skipped.append((path, e))
            continue
        runs.append(path)
    if not runs and skipped:
        raise named_error(*skipped[0])
    for path, e in skipped:
        if on_skip is not None:
            on_skip(path, str(named_error(path, e)))
    for path in runs if check is not None else []:
        if is_hf_dir(path):
            continue
        try:
            check(read_config(path, read_meta(path)), path)
        except UserError as e:
            raise named_error(path, e) from e
    searched = {p.resolve() for p, named in located if not named}
    return runs, [p for p in runs if p.resolve() in searched]


def evaluate_each_run(
    run_dirs: Sequence[Path | str],
    evaluate: Callable[[LoadedRun, torch.device], dict[str, Any]],
    *,
    device: str | torch.device = "auto",
    threads: int = 0,
    on_run: Callable[[Path, int, int], None] | None = None,
    skippable: Iterable[Path] = (),
    on_skip: Callable[[Path, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Load each run directory in turn (one model in memory at a time) and collect `evaluate(run, device)`.

    A run of `skippable` (found by a search, not named) that fails to load is left out with `on_skip(run, why)`;
    any other failure to load raises, naming the run.
    """
    device = resolve_device(device)
    may_skip = {Path(p).resolve() for p in skippable}
    results = []
    with use_threads(threads):
        for i, path in enumerate(run_dirs):
            if on_run is not None:
                on_run(Path(path), i, len(run_dirs))
            try:
                run = load_hf_run(path, device=device) if is_hf_dir(path) else load_run(path, device=device)
            except UserError as e:
                if Path(path).resolve() not in may_skip or on_skip is None:
                    raise named_error(Path(path), e) from e
                on_skip(Path(path), str(named_error(Path(path), e)))
                continue
            results.append(evaluate(run, device))
            del run
    return results
