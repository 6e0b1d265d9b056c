"""Exception types shared across posenc.

`UserError` is what a user can fix (bad override, missing file, wrong checkpoint kind, impossible length): the CLI
prints its message on one line and exits with code 2. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; rendered as one line, exit code 2."""


class ConfigError(UserError):
    """A configuration value or key is invalid."""


class CheckpointError(UserError):
    """A run directory or one of its files is missing, corrupt or of the wrong kind."""


class DataError(UserError):
    """A data source cannot be read or fetched."""


class LengthBeyondScheme(UserError):
    """A positional scheme cannot serve the requested sequence length."""

    def __init__(self, scheme: str, limit: int, requested: int) -> None:
        self.scheme = scheme
        self.limit = limit
        self.requested = requested
        super().__init__(f"scheme '{scheme}' supports at most {limit} positions; {requested} were requested")
