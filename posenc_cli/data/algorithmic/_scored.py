"""Helpers of the tasks scored at many positions (`mqar`, `flipflop*`): their documents as (text, scored) pieces."""

from __future__ import annotations

from collections.abc import Iterable

from posenc_cli.data.algorithmic.base import Example


def pieces_of(header: str, tokens: Iterable[tuple[str, bool]]) -> tuple[tuple[str, bool], ...]:
    """`header` then each (symbol, scored) as ' symbol', runs of unscored symbols joined into one piece:
    'H', [('a', False), ('b', False), ('c', True)] -> (('H a b', False), (' c', True))."""
    pieces: list[tuple[str, bool]] = [(header, False)]
    for symbol, scored in tokens:
        if scored or pieces[-1][1]:
            pieces.append((f" {symbol}", scored))
        else:
            pieces[-1] = (pieces[-1][0] + f" {symbol}", False)
    return tuple(pieces)


def scored_example(pieces: tuple[tuple[str, bool], ...], length: int) -> Example:
    """The example whose document is `pieces` (the last one scored): prompt = every piece but the last, answer =
    the last."""
    if not pieces[-1][1]:
        raise ValueError("the last piece of a scored example must be scored")
    return Example("".join(text for text, _ in pieces[:-1]), pieces[-1][0], length, scored=pieces)
