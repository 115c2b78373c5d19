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


def md_escape(s: str) -> str:
    """Escape text for a Markdown table cell."""
    s = clean_text(s)
    for ch in ("\\", "|", "`", "*", "_", "[", "]", "<", ">"):
        s = s.replace(ch, "\\" + ch)
    return s
