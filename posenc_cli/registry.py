"""One registry per extension point: named classes from one package, whose modules register them on first use.

`positional/` (schemes), `sources/` (data sources), `tasks/` (evaluation tasks) and `ruler/` (retrieval tasks) each
keep one `Registry`: a class decorated with its `register` becomes selectable by its `name`, and every module of the
package (but the skipped ones and `_`-prefixed helpers) is imported the first time the registry is read, so adding an
entry takes one new file and no edit anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from posenc_cli.errors import ConfigError

C = TypeVar("C", bound=type[Any])


class Registry(Generic[C]):
    """Classes of package `package` by their `name`; `what` names an entry in errors ('data source')."""

    def __init__(self, package: str, what: str, skip: Iterable[str] = ("base",)) -> None:
        self.package, self.what, self.skip = package, what, frozenset(skip)
        self._entries: dict[str, C] = {}
        self._loaded = False

    def register(self, cls: C) -> C:
        """Class decorator: add `cls` under `cls.name` (a second class under one name is a bug)."""
        if cls.name in self._entries and self._entries[cls.name] is not cls:
            raise RuntimeError(f"{self.what} '{cls.name}' registered twice")
        self._entries[cls.name] = cls
        return cls

    def entries(self) -> dict[str, C]:
        """Every registered class by name, sorted (so the order never depends on import order)."""
        if not self._loaded:
            path = importlib.import_module(self.package).__path__
            for info in pkgutil.iter_modules(path):
                if info.name not in self.skip and not info.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{info.name}")
            self._loaded = True
        return dict(sorted(self._entries.items()))

    def get(self, name: str, message: str) -> C:
        """The class registered as `name`; else `ConfigError(message)`, formatted with {name} and {available}."""
        entries = self.entries()
        if name not in entries:
            raise ConfigError(message.format(name=name, available=", ".join(entries)))
        return entries[name]
