from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from textual.pilot import Pilot


async def wait_until(pilot: Pilot[Any], cond: Callable[[], bool], limit_s: float = 30.0, what: str = "") -> None:
    """Poll `cond` while the app keeps processing messages (for thread workers posting from outside)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:g} s waiting for {what or cond}")
        await pilot.pause(0.05)
        await asyncio.sleep(0)


def wait_for_text(read: Callable[[], str], needles: Sequence[str], timeout: float, pattern: str | None = None,
                  what: str = "") -> str:
    """Poll `read()` (a tmux pane's text, say) until every needle, and `pattern` (a regex) if given, is in it;
    the text. Returns as soon as it holds: the limit can be generous."""
    rx = re.compile(pattern) if pattern else None
    deadline = time.monotonic() + timeout
    while True:
        text = read()
        if all(n in text for n in needles) and (rx is None or rx.search(text)):
            return text
        if time.monotonic() > deadline:
            want = [*needles, *([f"/{pattern}/"] if pattern else [])]
            raise AssertionError(f"{what or want} not on screen after {timeout:g} s; the screen was:\n{text}")
        time.sleep(0.1)


def poll_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `cond()` (a process state, a file) until it is true; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


async def set_input(pilot: Pilot[Any], selector: str, value: str) -> None:
    """Focus a text field, clear it and type the value the way a user would."""
    from textual.widgets import Input

    inp = pilot.app.screen.query_one(selector, Input)
    inp.focus()
    await pilot.pause()
    inp.value = ""
    await pilot.press(*list(value) if value else [])
    await pilot.pause()


def text_of(widget: Any) -> str:
    """The plain text a Static (or any widget) shows."""
    r = widget.render()
    return str(getattr(r, "plain", r))


def row_text(table: Any, i: int) -> list[str]:
    """A table row as plain strings: every column of a FitTable (also those left out at this width, uncut),
    else the DataTable row as shown."""
    if hasattr(table, "full_row"):
        return list(table.full_row(i))
    return [str(getattr(v, "plain", v)) for v in table.get_row_at(i)]


def cell_status(table: Any, i: int) -> str:
    """A finished-cells table's status of row i, without the client verdict the column may add (a cell whose
    client was the limit reads "done, client BOUND")."""
    return row_text(table, i)[3].split(",")[0]


def drawn(widget: Any) -> list[str]:
    """The lines a widget draws inside its border (its content region), as plain text."""
    return [widget.render_line(y).text for y in range(widget.size.height)]


def full_row(table: Any, i: int) -> list[str]:
    """Every column's value of a FitTable's i-th row, also the columns left out at this width."""
    return list(table.full_row(i))


async def open_compare(pilot: Pilot[Any]) -> Any:
    """From anywhere: the Sessions screen (F4), the first two sessions marked, Compare (c)."""
    from servescope.tui.screens.compare import CompareScreen

    await pilot.press("f4")
    await pilot.pause()
    await pilot.press("space", "down", "space", "c")
    await pilot.pause()
    scr = pilot.app.screen
    assert isinstance(scr, CompareScreen), scr
    return scr
