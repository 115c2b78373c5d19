"""The one error type for setup problems a user can act on (bad URL, unknown model, bad TOML...).

Per-request failures are never raised: they are data in a RequestRecord.
"""

from __future__ import annotations


class ServescopeError(Exception):
    """A setup failure with a one-line message that says what was wrong and what to do."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
