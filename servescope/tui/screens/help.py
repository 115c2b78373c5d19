"""F1 (or `?`): the keys of the screen you were on first, then every other screen's, taken from the
bindings themselves so they cannot drift; type in the search field to keep only the lines that match.

The Compare and What-if screens are imported when the help is built, to keep polars off the app's start-up
(benchmarks/import_cost.py; docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from servescope.tui.safe import esc
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.export import ExportScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen
from servescope.tui.screens.workloadform import WorkloadFormScreen
from servescope.tui.widgets.table import FitTable
from servescope.tui.widgets.zoom import Zoomable

FOOTNOTE = ("Tab / shift+tab move between fields and panes (the focused pane's bar lights up); arrows move in "
            "lists and tables; space toggles a workload. In a text field, printable keys type: use F1 there "
            "for help.")


def _keys(binding: Any) -> str:
    b = binding if isinstance(binding, Binding) else Binding(*binding)
    return ", ".join(k.replace("question_mark", "?").replace("slash", "/") for k in b.key.split(","))


def sections(app_bindings: Iterable[Any]) -> list[tuple[str, type | None, list[tuple[str, str]]]]:
    """(title, screen class or None, [(keys, what)]) for the app ("Everywhere"), each screen and the panes."""
    from servescope.tui.screens.compare import CompareScreen
    from servescope.tui.screens.whatif import WhatIfScreen
    def rows(bindings: Iterable[Any]) -> list[tuple[str, str]]:
        out = []
        for b in bindings:
            bb = b if isinstance(b, Binding) else Binding(*b)
            out.append((_keys(bb), bb.tooltip or bb.description))  # the footer word, or what F1 says in full
        return out

    return [
        ("Everywhere", None, rows(app_bindings)), ("Compose (F2)", ComposeScreen, rows(ComposeScreen.BINDINGS)),
        ("Run (F3)", RunScreen, rows(RunScreen.BINDINGS)), ("Sessions (F4)", SessionsScreen, rows(SessionsScreen.BINDINGS)),
        ("A saved session", SessionScreen, rows(SessionScreen.BINDINGS)),
        ("What if (w on a saved session)", WhatIfScreen, rows(WhatIfScreen.BINDINGS)),
        ("Compare (c on marked sessions)", CompareScreen, rows(CompareScreen.BINDINGS)),
        ("Export dialog", ExportScreen, rows(ExportScreen.BINDINGS)),
        ("New workload form", WorkloadFormScreen, rows(WorkloadFormScreen.BINDINGS)),
        ("Any pane (chart, histogram, panel, table, event log) with focus", None,
         rows(Zoomable.BINDINGS) + [("↑ ↓ pgup pgdn", "scroll the event log / move in a table")]),
        ("Tables", None, rows(FitTable.BINDINGS) + [("click a header", "sort by that column")]),
    ]


def help_text(app_bindings: Iterable[Any], screen: type | None = None, search: str = "") -> str:
    """The keys as markup: the section of `screen` first (marked "this screen"), then "Everywhere" and the
    others; with `search`, only the lines (keys or what they do) that contain it. The app's bindings are
    passed in (the running app's class): this module never imports the app, which imports it."""
    secs = sections(app_bindings)
    secs.sort(key=lambda s: 0 if screen is not None and s[1] is screen else 1)
    q = search.strip().lower()
    lines = []
    for title, cls, rows in secs:
        hits = [(k, d) for k, d in rows if not q or q in k.lower() or q in d.lower() or q in title.lower()]
        if not hits:
            continue
        here = " [i](this screen)[/i]" if screen is not None and cls is screen else ""
        lines.append(f"[b]{esc(title)}[/b]{here}")
        lines += [f"  {esc(k):<18} {esc(d)}" for k, d in hits]
        lines.append("")
    if not lines:
        lines.append(f"no key matches “{esc(search)}”")
    if not q:
        lines.append(FOOTNOTE)
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1", "close", "Close help")]

    def __init__(self) -> None:
        super().__init__()
        try:
            self.for_screen: type | None = type(self.app.screen)
        except Exception:  # no app yet (a test builds the screen alone)
            self.for_screen = None

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("[b]servescope: keys[/b]  (type to search; esc closes)")
            yield Input(placeholder="search keys, e.g. zoom, sort, skip", id="help-search")
            with VerticalScroll(id="help"):
                yield Static(help_text(type(self.app).BINDINGS, self.for_screen))

    def on_mount(self) -> None:
        self.query_one("#help-search", Input).focus()

    @on(Input.Changed, "#help-search")
    def _search(self, event: Input.Changed) -> None:
        self.query_one("#help Static", Static).update(help_text(type(self.app).BINDINGS, self.for_screen, event.value))

    def action_close(self) -> None:
        self.dismiss(None)
