"""Small modal dialogs: a yes/no question (delete a session), a choice of a few keys (leave a sweep running or
stop it) and a one-line answer (rename it)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

from servescope.tui.keyorder import FormInput
from servescope.tui.safe import plain


class ConfirmScreen(ModalScreen[bool]):
    """`question`, answered with y (True) or n / esc (False)."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm", classes="dialog"):
            yield Static(plain(self.question), classes="pane-title")
            if self.detail:
                yield Static(plain(self.detail), classes="hint")
            yield Static("y: yes   n / esc: no", classes="hint")
        yield Footer(compact=True)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ChoiceScreen(ModalScreen[str | None]):
    """`question` with a few answers, each a key: `choices` is [(key, label, value)]; esc answers None."""

    def __init__(self, question: str, detail: str, choices: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.choices = choices
        for key, label, value in choices:
            self._bindings.bind(key, f"answer({value!r})", label)
        self._bindings.bind("escape", "answer(None)", "Cancel")

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm", classes="dialog"):
            yield Static(plain(self.question), classes="pane-title")
            if self.detail:
                yield Static(plain(self.detail), classes="hint")
            yield Static(plain("   ".join(f"{k}: {label}" for k, label, _ in self.choices) + "   esc: cancel"),
                         classes="hint")
        yield Footer(compact=True)

    def action_answer(self, value: str | None) -> None:
        self.dismiss(value)


class AskScreen(ModalScreen[str | None]):
    """One text field: enter answers with its value, esc cancels (None)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "", label: str = "name") -> None:
        super().__init__()
        self.question = question
        self.value = value
        self.label = label

    def compose(self) -> ComposeResult:
        with Vertical(id="ask", classes="dialog"):
            yield Static(plain(self.question), classes="pane-title")
            yield Horizontal(Label(self.label, classes="field-label"), FormInput(self.value, id="ask-input"),
                             classes="field-row")
            yield Static("enter: save   esc: cancel", classes="hint")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#ask-input", Input).focus()

    @on(Input.Submitted, "#ask-input")
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
