"""posenc_cli.registry: the one registry shape behind schemes, data sources, evaluation tasks and retrieval tasks."""

from __future__ import annotations

import pytest

from posenc_cli.errors import ConfigError
from posenc_cli.registry import Registry


class _Entry:
    name = "one"


def test_entries_load_the_package_and_sort_by_name() -> None:
    reg = Registry("posenc_cli.data.ruler", "retrieval task")
    names = list(reg.entries())  # importing posenc_cli.data.ruler's modules registers into *its* registry, not this one
    assert names == sorted(names)
    reg.register(_Entry)
    assert reg.entries()["one"] is _Entry


def test_unknown_name_is_a_config_error_listing_what_exists() -> None:
    reg: Registry[type[_Entry]] = Registry("posenc_cli.data.ruler", "thing")
    reg.register(_Entry)
    with pytest.raises(ConfigError, match="no such thing 'two' among one"):
        reg.get("two", "no such thing '{name}' among {available}")


def test_a_second_class_under_one_name_is_refused() -> None:
    reg: Registry[type[_Entry]] = Registry("posenc_cli.data.ruler", "thing")
    reg.register(_Entry)
    reg.register(_Entry)  # the same class again is harmless (a module imported twice)
    other = type("Other", (), {"name": "one"})
    with pytest.raises(RuntimeError, match="thing 'one' registered twice"):
        reg.register(other)
