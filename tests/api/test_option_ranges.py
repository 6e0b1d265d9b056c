"""api.option_ranges: every numeric flag's range, read by the CLI while it parses (the walk over every command's
options is tests/cli/test_fuzz_cli.py)."""

from __future__ import annotations

import math

from posenc_cli.api.option_ranges import option_problem


def test_a_declared_range_refuses_with_its_limits() -> None:
    assert option_problem("train", "--steps", 0) == "must be in [1, 10000000], got 0"
    assert option_problem("train", "--steps", 100) is None


def test_a_command_may_give_a_flag_another_range() -> None:
    assert option_problem("eval-tasks", "--tokens-to-generate", 1 << 17) == "must be in [1, 65536], got 131072"
    assert option_problem("eval-passkey", "--tokens-to-generate", 1 << 17) is None  # a token count elsewhere


def test_an_undeclared_flag_still_takes_only_finite_numbers() -> None:
    assert option_problem("train", "--no-such-flag", 1e300) is None
    assert option_problem("train", "--no-such-flag", math.nan) == "must be a finite number, got nan"
