"""Keys that reach the app together (a paste over SSH, tmux send-keys, a fast typist) act in the order they were
typed in Compose's fields: a backspace or an arrow is never overtaken by the characters after it, and the keys
after a Tab, shift+Tab or Enter go where that key moved the focus (the next field, the dialog it opened). The
same bursts through a real terminal are tests/tui/test_tmux_compose_typing.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events
from textual.widgets import Input

from servescope.tui.app import make_app
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.dialogs import AskScreen

from .helpers import wait_until

# the --fast lane leaves this module out: 3 tests, ~5 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

NAMES = {",": "comma", ".": "full_stop", "/": "slash", " ": "space", "=": "equals_sign", "_": "underscore",
         "-": "minus"}


def key(k: str) -> events.Key:
    """The event the terminal driver posts for one key: a character, or a named key ("backspace", "end")."""
    if len(k) == 1:
        return events.Key(NAMES.get(k, k), k)
    return events.Key(k, "\r" if k == "enter" else None)


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


# The Load pane filled in one go: fields, Tab and shift+Tab between them, Enter on "Save sweep" and in its dialog,
# then shift+Tab back into the form. A field takes focus with its whole value selected, so the first character
# typed there replaces it, as for a user.
FORM = [
    "end", *["backspace"] * 6, *"2,8",  # concurrency: 1,4,16 -> 2,8
    "tab", "tab", *"40",  # past rates, requests: 100 -> 40
    "tab", "tab", "1",  # past duration, warmup: 0 -> 1
    "shift+tab", *"5s",  # back to duration
    "tab", "tab", "2",  # repeat: 1 -> 2
    "tab", *"ttft_ms=3000,tpot_ms=50",  # SLOs
    "tab", *"quant=GPTQ-Int4,gpu=RTXPro6000",  # tags
    "tab", *"burst",  # name
    "tab", *"burst.toml",  # sweep file
    "shift+tab", "shift+tab", "end", *",node=a",  # back to tags, add one
    "tab", "tab", "tab", "enter",  # to "Save sweep (ctrl+s)", press it: the dialog opens on the sweep file
    "end", *["backspace"] * len("burst.toml"), *"saved.toml", "enter",  # save as saved.toml
    "shift+tab", *"last.toml",  # from the button back to the sweep file field
]
FILLED = {"concurrency": "2,8", "rates": "", "requests": "40", "duration": "5s", "warmup": "1", "repeat": "2",
          "slos": "ttft_ms=3000,tpot_ms=50", "tags": "quant=GPTQ-Int4,gpu=RTXPro6000,node=a", "name": "burst",
          "sweep-file": "last.toml"}
SAVED = ("concurrency = [\n    2,\n    8,\n]", "requests = 40", 'duration = "5s"', "warmup = 1", "repeat = 2",
         "ttft_ms = 3000", "tpot_ms = 50", 'quant = "GPTQ-Int4"', 'gpu = "RTXPro6000"', 'node = "a"', 'name = "burst"')


async def test_a_burst_with_tab_shift_tab_and_enter_fills_every_field_of_the_form(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f8")
        assert app.focused is app.screen.query_one("#concurrency", Input)
        for k in FORM:  # all queued before the app handles the first, as keys read in one go from the terminal
            app.post_message(key(k))

        def values() -> dict[str, str]:
            return {fid: app.screen.query_one(f"#{fid}", Input).value for fid in FILLED}

        await wait_until(pilot, lambda: isinstance(app.screen, ComposeScreen) and values().get("sweep-file") == "last.toml", 20,
                         "the last key typed into the sweep file field")
        await pilot.pause()
        assert values() == FILLED
        saved = (home / "saved.toml").read_text()
        assert all(line in saved for line in SAVED), saved
        assert not (home / "burst.toml").exists()
