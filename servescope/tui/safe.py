"""Text from servers, sessions and users is data, never markup: a model named `[/x]` or a tag `a[b]` must show
as typed and must not crash a widget (Textual and Rich parse `[...]` in plain strings as markup)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.content import Content
from textual.markup import escape

from servescope.core.textsafe import clean_text


def plain(text: Any) -> Content:
    """For Static.update / Selection prompts: shown verbatim (control characters removed)."""
    return Content(clean_text(str(text)))


def cell(text: Any) -> Text:
    """For DataTable cells and column labels: shown verbatim."""
    return Text(clean_text(str(text)), end="")


def esc(text: Any) -> str:
    """For the data parts of a string that is markup on purpose (e.g. "[b]{esc(label)}[/b]")."""
    return escape(clean_text(str(text)))
