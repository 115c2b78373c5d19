"""`?` / F1: every key of every screen, taken from the bindings themselves so it cannot drift."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def _keys(binding: Any) -> str:
    b = binding if isinstance(binding, Binding) else Binding(*binding)
    return ", ".join(k.replace("question_mark", "?") for k in b.key.split(","))


def help_text() -> str:
    from servescope.tui.app import ServescopeApp
    from servescope.tui.screens.compare import CompareScreen
    from servescope.tui.screens.compose import ComposeScreen, WorkloadFormScreen
    from servescope.tui.screens.export import ExportScreen
    from servescope.tui.screens.run import RunScreen
    from servescope.tui.screens.sessions import SessionScreen, SessionsScreen

    sections: list[tuple[str, Any]] = [("Everywhere", ServescopeApp), ("Compose (F2)", ComposeScreen), ("Run (F3)", RunScreen),
                ("Sessions (F4)", SessionsScreen), ("A saved session", SessionScreen),
                ("Compare (c on marked sessions)", CompareScreen), ("Export dialog", ExportScreen),
                ("New workload form", WorkloadFormScreen)]
    lines = []
    for title, cls in sections:
        lines.append(f"[b]{title}[/b]")
        for b in cls.BINDINGS:
            bb = b if isinstance(b, Binding) else Binding(*b)
            lines.append(f"  {_keys(bb):<18} {bb.description}")
        lines.append("")
    lines.append("Tab / shift+tab move between fields; arrows move in lists and tables; space toggles a "
                 "workload. In a text field, printable keys type: use F1 there for help.")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f1,question_mark", "close", "Close help")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static("[b]servescope: keys[/b]  (esc closes)\n\n" + help_text())

    def action_close(self) -> None:
        self.dismiss(None)
