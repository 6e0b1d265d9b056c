"""The scaling registry's part of `posenc extend`'s command line, read through `api.extension`: one `--<method>`
shorthand per RoPE scaling method and one flag per method parameter (`--beta-fast`, `--truncate/--no-truncate`,
...), each in its method's help panel.

`with_scaling_options` adds them to a command's signature, so Typer builds them like the written-out options; a new
method file in `posenc_cli/rope_scaling/` brings its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from posenc_cli.api.extension import scaling_methods, scaling_params

__all__ = ["with_scaling_options"]


def _scaling_options() -> tuple[dict[str, str], list[inspect.Parameter]]:
    """({parameter name: method} of the shorthands, the generated parameters)."""
    aliases, params = {}, []
    for name in scaling_methods():
        arg = f"use_{name}"
        aliases[arg] = name
        option = typer.Option(f"--{name}", help=f"Shorthand for --method {name}.", rich_help_panel="Method")
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=False,
                                        annotation=Annotated[bool, option]))  # fmt: skip
    for f in scaling_params().values():
        flag = "--" + f.name.replace("_", "-")
        decl = f"{flag}/--no-{flag[2:]}" if f.type is bool else flag
        panel = scaling_methods()[f.method].title
        option = typer.Option(decl, help=f.help, metavar=f.metavar, rich_help_panel=panel)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                        annotation=Annotated[f.type, option]))  # fmt: skip
    return aliases, params


def with_scaling_options(func: Callable[..., None]) -> Callable[..., None]:
    """`func(..., chosen=[methods named by shorthands], scaling={parameter: value})` as a command that also takes
    the generated options (inserted before `--factor`)."""
    aliases, generated = _scaling_options()
    names = {p.name for p in generated}

    def command(**kwargs: Any) -> None:
        chosen = [method for arg, method in aliases.items() if kwargs.pop(arg)]
        scaling = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        func(**kwargs, chosen=chosen, scaling=scaling)

    own = [p for p in inspect.signature(func, eval_str=True).parameters.values() if p.name not in ("chosen", "scaling")]
    at = next(i for i, p in enumerate(own) if p.name == "method")
    params = [*own[:at], *generated[: len(aliases)], *own[at : at + 3], *generated[len(aliases) :], *own[at + 3 :]]
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    )
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__, command.__qualname__ = func.__name__, func.__qualname__
    titles = ", ".join(m.title for m in scaling_methods().values())
    command.__doc__ = (func.__doc__ or "").replace("{methods}", titles)  # one line per paragraph: handles_errors
    return command
