"""The lazy command group (cli/app.py): `posenc --help` and a command's own help load no torch, the root listing
shows each command's own summary, and every command a module of cli/ registers is declared."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest
import typer.main

import posenc_cli.cli
from posenc_cli.cli import app

LAZY = sys.modules["posenc_cli.cli.app"]._LAZY  # `posenc_cli.cli.app` the attribute is the Typer app itself

# Runs the app as `posenc ARGS...` in a fresh interpreter, then says on stderr whether torch was imported.
_PROBE = """
import sys
from posenc_cli.cli import app
try:
    app(sys.argv[1:], prog_name="posenc")
except SystemExit:
    pass
print("torch loaded:", "torch" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["extend", "--help"]], ids=" ".join)
def test_help_imports_no_torch(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    assert "Usage: posenc" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "torch loaded: False"
    if args[0] == "extend":  # the scaling methods' flags, read from their modules
        assert "--yarn" in done.stdout and "--beta-fast" in done.stdout


def _built_commands() -> dict[str, object]:
    """The commands Typer builds once every module of cli/ is imported (each registers its own on `app`)."""
    for info in pkgutil.iter_modules(posenc_cli.cli.__path__):
        importlib.import_module(f"posenc_cli.cli.{info.name}")
    return typer.main.get_group(app).commands


def test_every_registered_command_is_declared() -> None:
    assert set(_built_commands()) == set(LAZY), "declare each command in posenc_cli/cli/__init__.py's lazy_commands"


def test_each_declared_module_registers_its_command() -> None:
    """In a fresh interpreter, loading each command in turn imports only the modules declared so far, so a command
    declared with the wrong module is not found (`LazyCommand.load` raises)."""
    probe = (
        "import sys\nimport posenc_cli.cli\nfor lazy in sys.modules['posenc_cli.cli.app']._LAZY.values(): lazy.load()"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_root_listing_shows_each_commands_own_summary() -> None:
    built = _built_commands()
    for name, lazy in LAZY.items():
        command = built[name]
        own = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
        assert lazy.help == own, f"{name}: the summary in posenc_cli/cli/__init__.py should read {own!r}"


def test_a_lazy_command_loads_its_module_when_resolved() -> None:
    group = typer.main.get_group(app)
    for name in LAZY:
        group.commands[name] = LAZY[name]  # as in a fresh process, before the module is imported
    ctx = group.make_context("posenc", ["train", "--help"], resilient_parsing=True)
    name, command, _ = group.resolve_command(ctx, ["train"])
    assert name == "train"
    assert command is not LAZY["train"]
    assert command is not None and command.params  # the real command, with its options
