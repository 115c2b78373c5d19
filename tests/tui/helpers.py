from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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
    """A DataTable row as the plain strings it shows."""
    return [str(getattr(v, "plain", v)) for v in table.get_row_at(i)]
