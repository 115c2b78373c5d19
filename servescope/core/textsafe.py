"""Text from servers and users is data: strip terminal control sequences before it is shown or stored."""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(s: str) -> str:
    """Remove ANSI escape sequences and control characters (newlines become spaces)."""
    s = _CSI.sub("", s)
    s = s.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    return _CTRL.sub("", s).strip()


MASK = "\u2022\u2022\u2022\u2022"  # what a secret is replaced with wherever it would be shown or stored


def redact(s: str, secret: str | None) -> str:
    """`s` with every occurrence of `secret` (an API key) replaced by MASK; `s` unchanged without a secret."""
    if not secret or secret not in s:
        return s
    return s.replace(secret, MASK)


def clean_secret_text(s: str, secret: str | None, limit: int = 500) -> str:
    """Server text about to be stored: the secret masked before and after control characters are removed (a
    server could split the echoed key with them), then cut to `limit` characters."""
    return redact(clean_text(redact(s, secret)), secret)[:limit]


def md_escape(s: str) -> str:
    """Escape text for a Markdown table cell."""
    s = clean_text(s)
    for ch in ("\\", "|", "`", "*", "_", "[", "]", "<", ">"):
        s = s.replace(ch, "\\" + ch)
    return s


def slug(text: str) -> str:
    """A file-name-safe form of a name people gave (a session's, a workload's): letters, digits, `_.-`, at most 40."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "session"
