"""Keys that reach the app together (a paste over SSH, tmux send-keys, a fast typist) act in the order they were
typed in Compose's fields: a backspace or an arrow is never overtaken by the characters after it. The same
burst through a real terminal is tests/tui/test_tmux_compose_typing.py."""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.widgets import Input

from servescope.tui.app import make_app
from servescope.tui.screens.dialogs import AskScreen

from .helpers import wait_until

NAMES = {",": "comma", ".": "full_stop", "/": "slash", " ": "space", "=": "equals_sign"}


def key(k: str) -> events.Key:
    """The event the terminal driver posts for one key: a character, or a named key ("backspace", "end")."""
    if len(k) == 1:
        return events.Key(NAMES.get(k, k), k)
    return events.Key(k, None)


def typed(keys: list[str], value: str = "") -> str:
    """What an Input holds after `keys`, typed with its cursor at the end of `value`."""
    text, at = value, len(value)
    for k in keys:
        if k == "backspace":
            text, at = (text[:at - 1] + text[at:], at - 1) if at else (text, at)
        elif k == "delete":
            text = text[:at] + text[at + 1:]
        elif k == "left":
            at = max(0, at - 1)
        elif k == "right":
            at = min(len(text), at + 1)
        elif k == "home":
            at = 0
        elif k == "end":
            at = len(text)
        else:
            text, at = text[:at] + k + text[at:], at + 1
    return text


# the keys (End, 8 backspaces, 1,2,4,8), then an edit in the middle: 1,2,4,8 -> 1,2,6,8
BURST = ["end", *["backspace"] * 8, *"1,2,4,8", "left", "left", "backspace", "6", "end"]


async def test_a_burst_of_keys_acts_in_order_in_a_compose_field(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f8")
        inp = app.screen.query_one("#concurrency", Input)
        assert app.focused is inp and inp.value == "1,4,16"
        want = typed(BURST, inp.value)
        assert want == "1,2,6,8"
        for k in BURST:  # all queued before the app handles the first, as keys read in one go from the terminal
            app.post_message(key(k))
        await wait_until(pilot, lambda: inp.value == want, 10, f"{want!r} in the field (it holds {inp.value!r})")
        await pilot.pause()
        assert inp.value == want
        assert "4 load levels" in str(app.screen.query_one("#preview").render())


async def test_a_burst_of_keys_acts_in_order_in_the_save_dialog(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), 10, "the save dialog")
        inp = app.screen.query_one("#ask-input", Input)
        keys = ["end", *["backspace"] * len("sweep.toml"), *"fast.toml", *["left"] * 5, "backspace", "x", "end"]
        want = typed(keys, inp.value)
        assert want == str(home / "sweeps" / "fasx.toml")
        for k in keys:
            app.post_message(key(k))
        await wait_until(pilot, lambda: inp.value == want, 10, f"{want!r} in the field (it holds {inp.value!r})")
