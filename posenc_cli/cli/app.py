"""The Typer app, consoles and conventions shared by every command.

Conventions: positional arguments with `=` are Hydra-style overrides, those without are paths or names;
`--config-dir DIR` adds a user's config directory to the search path. A `UserError` anywhere below a command
becomes one red line on stderr and exit code 2.

Commands load lazily: `lazy_commands` (called by `posenc_cli.cli`) names each command, the module that defines it
and its one-line summary; the root group lists the summaries for `posenc --help` and imports a command's module only
when that command runs or shows its own help, so `posenc --help` and `posenc train --help` load no torch
(tests/cli/test_lazy_commands.py). Modules import what they use at their top.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import typer.core
import typer.main
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperCommand, TyperGroup, TyperOption

try:  # typer >= 0.24 carries its own copy of click; its exceptions are the ones raised
    from typer import _click as click
    from typer.exceptions import Abort
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]
    from click.exceptions import Abort  # type: ignore[no-redef,assignment]

from posenc_cli.api.option_ranges import option_problem
from posenc_cli.config import check_config_dir
from posenc_cli.errors import Stopped, UserError, disk_error_message, is_disk_error, sigterm_raises


class _FlagOption(TyperOption):
    """Options that take no value (`--eval`, `--truncate/--no-truncate`) show no type in `--help` (typer 0.29
    printed `<bool>`, which reads as if `--eval true` were expected)."""

    def display_type_rich(self, ctx: click.Context) -> str | None:
        return None if self.is_flag else super().display_type_rich(ctx)

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        """The parsed value, refused (one line, exit 2) outside the option's range (`api/option_ranges.py`); a
        number with no declared range still has to be finite."""
        value = super().process_value(ctx, value)
        numbers = [v for v in (value if isinstance(value, list | tuple) else [value]) if isinstance(v, int | float)]
        if not numbers or isinstance(value, bool):
            return value
        for number in numbers:
            problem = option_problem(ctx.command.name, self.opts[0], number)
            if problem is not None:
                raise click.exceptions.UsageError(f"{self.opts[0]} {problem}", ctx=ctx)
        return value


class LazyCommand(TyperCommand):
    """A command whose module is not imported yet: its name and summary, all that `posenc --help` shows of it."""

    def __init__(self, name: str, module: str, summary: str) -> None:
        super().__init__(name, help=summary)
        self.module = module

    def load(self) -> click.Command:
        """Import the module (which registers the command on `app`) and build the command Typer makes of it."""
        importlib.import_module(self.module)
        command = typer.main.get_group(app).commands.get(self.name or "")
        if command is None or isinstance(command, LazyCommand):
            raise RuntimeError(f"{self.module} registers no command '{self.name}'")
        return command


_LAZY: dict[str, LazyCommand] = {}  # by name, in `posenc --help` order


def lazy_commands(commands: Sequence[tuple[str, str, str]]) -> None:
    """Declare the commands as (name, module, summary), in `posenc --help` order; the summary is the first paragraph
    of the command's own help (tests/cli/test_lazy_commands.py holds the two equal)."""
    _LAZY.clear()
    _LAZY.update({name: LazyCommand(name, module, summary) for name, module, summary in commands})


class PosencGroup(TyperGroup):
    """Typer's group, but click's own usage errors (unknown option or command, a value given to a flag, a missing
    argument) are one line on stderr and exit code 2, like every other posenc error, instead of a boxed panel; and
    the commands declared with `lazy_commands` are listed by name and summary, their module imported only when one
    is resolved (run, or asked for its own help or completion)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        built = dict(self.commands)  # those whose module is already imported (tests import them)
        self.commands = {name: built.pop(name, lazy) for name, lazy in _LAZY.items()} | built

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        command = self.commands.get(args[0]) if args else None
        if isinstance(command, LazyCommand):
            self.commands[args[0]] = command.load()
        return super().resolve_command(ctx, args)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()
            sys.exit(e.exit_code)
        except click.exceptions.ClickException as e:
            err_console.print(f"[bold red]error:[/] {escape(usage_error_line(e))}", highlight=False)
            sys.exit(2 if isinstance(e, click.exceptions.UsageError) else e.exit_code)
        except Abort:
            err_console.print("[bold red]error:[/] aborted", highlight=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def usage_error_line(e: click.ClickException) -> str:
    """'No such option: --bogus (see posenc train --help)': click's message on one line, with where to look."""
    message = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    return f"{message} (see {ctx.command_path} --help)" if ctx is not None else message


def _flags_without_type() -> None:
    """Every option typer builds is a `_FlagOption`, so a flag's help row has no `<bool>`."""
    typer.main.TyperOption = _FlagOption  # type: ignore[attr-defined,misc]
    typer.core.TyperOption = _FlagOption  # type: ignore[misc]


_flags_without_type()

app = typer.Typer(
    cls=PosencGroup,
    name="posenc",
    help="Train small causal LMs that differ only in positional scheme, then test them beyond their training length.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=True,
)

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def _checked_config_dir(value: str | None) -> str | None:
    """`--config-dir DIR`, refused in one line (exit 2) unless every YAML file in DIR is a regular file of safe YAML
    (`config.check_config_dir`), before Hydra reads any of it."""
    if value is not None:
        try:
            check_config_dir(Path(value))
        except UserError as e:
            raise typer.BadParameter(str(e), param_hint="'--config-dir'") from None
    return value


ConfigDirOption = Annotated[
    str | None,
    typer.Option(
        "--config-dir",
        help="Extra config directory (your own groups and sweep files).",
        metavar="DIR",
        callback=_checked_config_dir,
    ),
]


def progress_bar(description: str = "{task.description}") -> Progress:
    """A transient bar on stderr (description, bar, done/total, elapsed), shown only on a terminal, so piped
    output stays the result."""
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    )


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one clear line on stderr and return the `typer.Exit` to raise."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code)


def handles_errors(func: F) -> F:
    """Turn `UserError`, a disk-kind `OSError` (full, read-only, no permission), SIGTERM and Ctrl-C outside training
    into one line and an exit code (128 + the signal); keep bugs as tracebacks. Results already stored are kept (every
    evaluation cell is written when measured), so the same command continues from them."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_raises():
                return func(*args, **kwargs)
        except UserError as e:
            raise fail(escape(str(e)).replace("\n", " ")) from None
        except Stopped as e:
            raise fail(
                f"stopped by {signal.Signals(e.signum).name}; results already stored are kept, and the same command "
                "continues from them",
                code=128 + e.signum,
            ) from None
        except KeyboardInterrupt:
            raise fail("interrupted", code=130) from None
        except OSError as e:  # a full, read-only or forbidden location: the user's to fix, not a bug
            if not is_disk_error(e):
                raise
            raise fail(escape(disk_error_message(e))) from None

    wrapper.__doc__ = one_line_paragraphs(func.__doc__ or "")  # the command's --help text
    return wrapper  # type: ignore[return-value]


def one_line_paragraphs(doc: str) -> str:
    """`doc` with each paragraph on one line: Typer keeps a docstring's single line breaks after the first
    paragraph, which a terminal narrower than the source lines (80 columns, a pipe) shows as ragged half-empty
    lines; rich then wraps each paragraph to the width there is."""
    return "\n\n".join(" ".join(part.split()) for part in inspect.cleandoc(doc).split("\n\n"))


def split_args(args: list[str] | None) -> tuple[list[str], list[str]]:
    """Split positional arguments into (names or paths, overrides): an override contains `=`.

    An existing path counts as a path even with `=` in it (sweep job directories are named `pos=rope`).
    """
    names, overrides = [], []
    for a in args or []:
        (overrides if "=" in a and not path_exists(a) else names).append(a)
    return names, overrides


def path_exists(text: str) -> bool:
    """`Path(text).exists()`, False for what cannot be a path at all (a name over 255 bytes, a NUL byte): an
    override's value may be any length and is never turned into a file name."""
    try:
        return Path(text).exists()
    except (OSError, ValueError):
        return False


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()
