"""`?` / F1: every key of every screen, taken from the bindings themselves so it cannot drift."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def _keys(binding: Any) -> str:
    b = binding if isinstance(binding, Binding) else Binding(*binding)
    return ", ".join(k.replace("question_mark", "?") for k in b.key.split(","))


def help_text(app_bindings: Iterable[Any]) -> str:
    """The keys of the app (`app_bindings`: the "Everywhere" section) and of each screen. The app's bindings
    are passed in (the running app's class): this module never imports the app, which imports it."""
    from servescope.tui.screens.compare import CompareScreen
    from servescope.tui.screens.compose import ComposeScreen, WorkloadFormScreen
    from servescope.tui.screens.export import ExportScreen
    from servescope.tui.screens.run import RunScreen
    from servescope.tui.screens.sessions import SessionScreen, SessionsScreen

    sections: list[tuple[str, Iterable[Any]]] = [
        ("Everywhere", app_bindings), ("Compose (F2)", ComposeScreen.BINDINGS), ("Run (F3)", RunScreen.BINDINGS),
        ("Sessions (F4)", SessionsScreen.BINDINGS), ("A saved session", SessionScreen.BINDINGS),
        ("Compare (c on marked sessions)", CompareScreen.BINDINGS), ("Export dialog", ExportScreen.BINDINGS),
        ("New workload form", WorkloadFormScreen.BINDINGS)]
    lines = []
    for title, bindings in sections:
        lines.append(f"[b]{title}[/b]")
        for b in bindings:
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
            yield Static("[b]servescope: keys[/b]  (esc closes)\n\n" + help_text(type(self.app).BINDINGS))

    def action_close(self) -> None:
        self.dismiss(None)
