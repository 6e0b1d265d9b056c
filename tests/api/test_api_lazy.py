"""`posenc_cli.api` imports each function's module on first use, so importing it (as every command does) is light."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

from posenc_cli import api


def test_importing_the_api_loads_no_torch() -> None:
    code = "import sys; from posenc_cli import api; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_public_name_resolves_to_its_module() -> None:
    assert sorted(api.__all__) == sorted(api._HOME)
    for name in api.__all__:
        value = getattr(api, name)
        if callable(value):  # functions and classes; constants such as REFERENCES are data
            assert value.__name__ == name and value.__module__ == api._HOME[name]
    assert set(api.__all__) <= set(dir(api))


def test_no_api_module_is_named_as_a_public_name() -> None:
    """Importing a submodule sets the package attribute of its name: a module `api/bench.py` would turn `api.bench`
    into the module once anything imported it (`api.cost_curve` did)."""
    modules = {info.name for info in pkgutil.iter_modules(api.__path__)}
    assert not modules & set(api.__all__)
    for name in modules:
        importlib.import_module(f"posenc_cli.api.{name}")
    assert callable(api.bench) and api.bench.__module__ == "posenc_cli.api.benchmarking"
