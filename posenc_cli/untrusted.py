"""Reading JSON and YAML files that posenc did not write itself, or that may have been edited since.

Every file a user can hand posenc (a run's `meta.json`, a transformers `config.json`, a `--config-dir` group file, a
sweep file) goes through here, so that a hostile or broken one gives one line naming the path, never a hang, a
traceback or a multi-gigabyte read:

- only regular files are opened (a FIFO or a device would block `open()` or `read()` forever): the path is checked
  with `stat` before opening, and opened with `O_NONBLOCK` and checked again with `fstat` (the path may change in
  between);
- at most `max_bytes + 1` bytes are read, and a longer file is refused;
- nesting deeper than `max_depth` is refused (CPython's JSON decoder and PyYAML's composer recurse per level, so
  200,000 nested brackets would otherwise end in `RecursionError`), and so is a document of more than `max_nodes`
  containers and values (YAML aliases can make a small file expand into a huge tree when walked);
- YAML is read with PyYAML's safe loader only: a `!!python/object` tag is refused, nothing is constructed from it.

Errors are `UserError` subclasses (`ConfigError` unless the caller passes `error=`), one line, naming the path.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from posenc_cli.errors import ConfigError, UserError

MAX_BYTES = 16 * 1024 * 1024
"""Default size limit: run metadata, configs and sweep files are kilobytes; 16 MiB leaves room for big
tokenizer-free JSON such as a LongRoPE factor file, and refuses anything that is obviously not such a file."""
MAX_DEPTH = 64
"""Default nesting limit: posenc's own files nest at most 4 levels; transformers configs at most 3."""
MAX_NODES = 2_000_000
"""Default limit on containers plus values in one document (after YAML alias expansion)."""

try:  # the libyaml parser when present (same safe semantics, faster); the pure-Python one otherwise
    _SafeLoader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the PyYAML build
    _SafeLoader = yaml.SafeLoader


def read_bytes(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = MAX_BYTES,
    error: type[UserError] = ConfigError,
) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them; `error` (one line naming `path` and
    `what`, e.g. "run metadata") for a missing, unreadable, non-regular or too big file."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{p}: {what} not found") from None
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {_strerror(e)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p}: {what} is not a regular file ({_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise error(_too_big(p, what, max_bytes))
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {_strerror(e)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between stat() and open()
            raise error(f"{p}: {what} is not a regular file ({_kind(st.st_mode)})")
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {_strerror(e)}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # the file grew after stat()
        raise error(_too_big(p, what, max_bytes))
    return data


def loads_json(
    data: bytes | str,
    *,
    source: str | os.PathLike[str],
    what: str,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    error: type[UserError] = ConfigError,
) -> Any:
    """Parse JSON already in memory (e.g. a checkpoint header); errors name `source` as if it were the path."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise error(f"{source}: {what} is nested deeper than {max_depth} levels") from None
    except UnicodeDecodeError:
        raise error(f"{source}: {what} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}: {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise error(f"{source}: {what} is not valid JSON ({_first_line(e)})") from None
    check_shape(obj, source=source, what=what, max_depth=max_depth, max_nodes=max_nodes, error=error)
    return obj


def load_json(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    error: type[UserError] = ConfigError,
) -> Any:
    """The JSON document in the file at `path` (see the module docstring for what is refused)."""
    data = read_bytes(path, what=what, max_bytes=max_bytes, error=error)
    return loads_json(data, source=path, what=what, max_depth=max_depth, max_nodes=max_nodes, error=error)


def loads_yaml(
    data: bytes | str,
    *,
    source: str | os.PathLike[str],
    what: str,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    error: type[UserError] = ConfigError,
) -> Any:
    """Parse YAML already in memory with the safe loader; an empty document is `None`."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{source}: {what} is not UTF-8 text") from None
    try:
        # The event stream is produced without recursion: measure the nesting before the recursive composer runs.
        depth = 0
        for event in yaml.parse(data, Loader=_SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > max_depth:
                    raise error(f"{source}: {what} is nested deeper than {max_depth} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        obj = yaml.load(data, Loader=_SafeLoader)  # the safe loader: no python/* tags
    except RecursionError:
        raise error(f"{source}: {what} is nested deeper than {max_depth} levels") from None
    except yaml.YAMLError as e:
        raise error(f"{source}: {what} is not valid YAML ({yaml_problem(e)})") from None
    except ValueError as e:  # an integer of more than 4,300 digits (Python's int-from-string limit)
        raise error(f"{source}: {what} holds a value that cannot be read ({_first_line(e)[:80]})") from None
    check_shape(obj, source=source, what=what, max_depth=max_depth, max_nodes=max_nodes, error=error)
    return obj


def load_yaml(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    error: type[UserError] = ConfigError,
) -> Any:
    """The YAML document in the file at `path`, read with the safe loader (see the module docstring)."""
    data = read_bytes(path, what=what, max_bytes=max_bytes, error=error)
    return loads_yaml(data, source=path, what=what, max_depth=max_depth, max_nodes=max_nodes, error=error)


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line error as one short phrase: "could not determine a constructor for the tag
    'tag:yaml.org,2002:python/object:os.system' at line 3"."""
    if isinstance(e, yaml.MarkedYAMLError):
        problem = e.problem or e.context or "syntax error"
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        return _first_line(problem) + where
    return _first_line(e)


def check_shape(
    obj: Any,
    *,
    source: str | os.PathLike[str],
    what: str,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    error: type[UserError] = ConfigError,
) -> None:
    """Refuse a parsed document nested deeper than `max_depth` or with more than `max_nodes` entries (walked
    without recursion, so shared YAML aliases are counted each time they are reached)."""
    for nodes, depth in enumerate(_depths(obj), start=1):
        if depth > max_depth:
            raise error(f"{source}: {what} is nested deeper than {max_depth} levels")
        if nodes > max_nodes:
            raise error(f"{source}: {what} has more than {max_nodes} entries")


def _depths(obj: Any) -> Iterator[int]:
    """The container depth of every node of `obj` (a scalar at top level is depth 0)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        yield depth
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _too_big(path: Path, what: str, max_bytes: int) -> str:
    return f"{path}: {what} is larger than {_size(max_bytes)}, the limit for such a file"


def _size(n: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _strerror(e: OSError) -> str:
    return os.strerror(e.errno) if e.errno is not None else _first_line(e)


def _first_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
