"""The Export dialog: where to write a Markdown report. The session detail view and the Compare screen
open it with a default path in the sessions folder; the user may type another (a folder takes the default
file name). It renders, writes and dismisses with the path written, or shows the problem under the field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.tui.safe import esc
from servescope.tui.widgets.panels import short_path


def report_target(typed: str, default: Path) -> Path:
    """The file to write: `typed` (~ expanded, relative to the working directory), a folder meaning
    `folder/<default name>`, a name without a suffix getting `.md`; empty means `default`."""
    typed = typed.strip()
    if not typed:
        return default
    p = Path(typed).expanduser()
    if p.is_dir() or typed.endswith(("/", "\\")):
        return p / default.name
    return p if p.suffix else p.with_suffix(".md")


def write_report(path: Path, render: Callable[[], str]) -> Path:
    """Render and write (the parent folder must exist); ServescopeError with a line the user can act on."""
    if not path.parent.is_dir():
        raise ServescopeError(f"no folder {short_path(path.parent)}: create it or type another path")
    text = render()
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ServescopeError(f"cannot write {short_path(path)}: {e.strerror or e}") from None
    return path


class ExportScreen(ModalScreen[Path | None]):
    """Ask where to write the report (enter writes, esc cancels); dismisses with the path written."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("enter", "write", "Write report", priority=True),
    ]

    def __init__(self, what: str, default: Path, render: Callable[[], str]) -> None:
        super().__init__()
        self.what = what
        self.default = default
        self.render_report = render

    def compose(self) -> ComposeResult:
        with Vertical(id="export"):
            yield Static(f"[b]Export a Markdown report[/b]: {esc(self.what)}", markup=True)
            yield Horizontal(Label("write to", classes="field-label"),
                             Input(short_path(self.default), id="export-path"), classes="field-row")
            yield Static("", id="export-error", classes="field-error", markup=False)
            yield Static("a folder takes the default file name; enter writes, esc cancels", classes="hint")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#export-path", Input).focus()

    @on(Input.Submitted, "#export-path")
    def _submitted(self) -> None:
        self.action_write()

    def action_write(self) -> None:
        typed = self.query_one("#export-path", Input).value
        err = self.query_one("#export-error", Static)
        try:
            path = write_report(report_target(typed, self.default), self.render_report)
        except ServescopeError as e:
            err.update(clean_text(e.message))
            err.add_class("-visible")
            return
        except Exception as e:  # a broken session: say so, keep the app
            err.update(f"could not render the report: {type(e).__name__}: {clean_text(str(e))[:200]}")
            err.add_class("-visible")
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
