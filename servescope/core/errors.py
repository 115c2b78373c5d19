"""The one error type for setup problems a user can act on (bad URL, unknown model, bad TOML...).

Per-request failures are never raised: they are data in a RequestRecord.
"""

from __future__ import annotations

import re


class ServescopeError(Exception):
    """A setup failure with a one-line message that says what was wrong and what to do."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def error_text(e: BaseException) -> str:
    """An exception as a user reads it: its message on one line, never its Python class name (`ValueError: HTTP
    404` read as `HTTP 404`); an OSError's reason without its errno (`Connection reset by peer`); an exception with
    no message named in words (`RemoteProtocolError` -> `remote protocol error`)."""
    if isinstance(e, OSError) and e.strerror:
        text = e.strerror + (f": {e.filename}" if e.filename else "")
    else:
        text = str(e)
    text = " ".join(text.split())
    name = type(e).__name__
    if text and text != name:
        return text
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower().replace("_", " ")
