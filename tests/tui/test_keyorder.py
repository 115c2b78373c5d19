"""KeysInOrderApp on its own (servescope/tui/keyorder.py): a key that moves the focus or opens a screen is handled
before the keys typed after it are sent anywhere, and a key whose handler never returns does not hold the keys
after it for ever. Compose's whole form typed in one burst is tests/tui/test_compose_typing.py."""

from __future__ import annotations

import asyncio
import time

from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from servescope.tui.keyorder import KeysInOrderApp

from .helpers import wait_until
from .test_compose_typing import key


class Dialog(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        yield Input(id="in-dialog")

    def on_mount(self) -> None:
        self.query_one(Input).focus()


class Stuck(Static, can_focus=True):
    """Enter moves the focus to #b, then its handler waits until the test lets it go (its queue does not move)."""

    def __init__(self, label: str, *, id: str) -> None:
        super().__init__(label, id=id)
        self.release = asyncio.Event()

    async def on_key(self, event: object) -> None:
        if getattr(event, "key", "") == "enter":
            self.app.query_one("#b", Input).focus()
            await self.release.wait()


class Form(KeysInOrderApp[None]):
    def compose(self) -> ComposeResult:
        yield Input(id="a")
        yield Button("open", id="open")
        yield Stuck("stuck", id="stuck")
        yield Input(id="b")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.push_screen(Dialog())


async def test_keys_after_tab_and_enter_go_where_those_keys_moved_the_focus() -> None:
    app = Form()
    async with app.run_test() as pilot:
        app.query_one("#a", Input).focus()
        await pilot.pause()
        for k in ["x", "y", "tab", "enter", *"typed", "backspace"]:  # Enter on the button opens the dialog
            app.post_message(key(k))
        await wait_until(pilot, lambda: isinstance(app.screen, Dialog)
                         and app.screen.query_one("#in-dialog", Input).value == "type", 10, "the dialog's field")
        assert app.query_one("#a", Input).value == "xy"


async def test_a_key_whose_handler_never_returns_lets_the_keys_after_it_go() -> None:
    app = Form()
    async with app.run_test() as pilot:
        stuck = app.query_one("#stuck", Stuck)
        stuck.focus()
        await pilot.pause()
        for k in ["enter", *"qr"]:
            app.post_message(key(k))
        try:
            # the marker does not get past the stuck widget: after about a second the keys go, to the field it focused
            # (polled on the loop: Pilot's pause waits for every queue, the stuck one's too)
            deadline = time.monotonic() + 10
            while app.query_one("#b", Input).value != "qr":
                assert time.monotonic() < deadline, f"the keys never reached #b: {app.query_one('#b', Input).value!r}"
                await asyncio.sleep(0.05)
        finally:
            stuck.release.set()
