"""The whole command tree for tests that walk it: `posenc_cli.cli` declares commands lazily (cli/app.py), so a
command's options exist only once its module is imported."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer.main

from posenc_cli.cli import app


def full_command_tree() -> Any:
    """The root click group with every declared command's module imported: real commands, no placeholders."""
    for lazy in sys.modules["posenc_cli.cli.app"]._LAZY.values():
        importlib.import_module(lazy.module)
    return typer.main.get_command(app)
