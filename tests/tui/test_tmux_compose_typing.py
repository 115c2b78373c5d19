"""In a real terminal (tmux, 80x24): 200 keys typed into a Compose field in bursts, each burst one write to the
terminal as a paste over SSH sends them, come out as typed: the field then shows exactly what an Input holds
after those keys. Backspaces, arrows, home and end go among the characters, since a key the Input binds is
the one that used to be overtaken by the characters after it (End, 8 backspaces and `1,2,4,8` came out as
`1,1,2,`). And the whole Load pane typed in bursts 5 ms apart, Tab, shift+Tab and Enter among the characters,
fills every field as typed and saves through the dialog Enter opened: keys after a Tab used to land in the field
before it (`abc`, Tab, `def` gave `abcdef`). The same bursts through Pilot are tests/tui/test_compose_typing.py."""

from __future__ import annotations

import random
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import servescope
from tests.support.tmux import open_session, tmux

from .helpers import wait_for_text
from .test_compose_typing import FILLED, FORM, SAVED, typed

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e tests need it")

ROOT = Path(servescope.__file__).resolve().parent.parent
TMUX_KEYS = {"backspace": "BSpace", "left": "Left", "right": "Right", "home": "Home", "end": "End", "tab": "Tab",
             "shift+tab": "BTab", "enter": "Enter"}
LABELS = {"concurrency": "concurrency", "rates": "rates", "requests": "requests", "duration": "duration",
          "warmup": "warmup", "repeat": "repeat", "slos": "SLOs", "tags": "tags", "name": "name",
          "sweep-file": "sweep file"}


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def script(start: str, n: int = 200, seed: int = 7) -> list[str]:
    """`n` keys of editing (digits, commas, backspaces, arrows, home, end), the text kept short enough to show
    whole at 80 columns; ends in a digit, so the field never shows its placeholder."""
    rng = random.Random(seed)
    keys = ["end"]  # focus selects the whole value: end leaves the cursor after it, as typed() starts
    ops = ["digit"] * 7 + [","] * 3 + ["backspace"] * 5 + ["left"] * 2 + ["right", "home", "end", "end"]
    while len(keys) < n - 2:
        text = typed(keys, start)
        op = rng.choice(ops)
        if len(text) >= 16:
            op = rng.choice(["backspace", "end"])  # at the end, backspace shortens it
        keys.append(str(rng.randint(1, 9)) if op == "digit" else op)
    return [*keys, "end", str(rng.randint(1, 9))]


def bursts(keys: list[str], seed: int = 11, sizes: tuple[int, int] = (5, 30)) -> Iterator[list[str]]:
    """The keys in bursts of sizes[0] to sizes[1]."""
    rng = random.Random(seed)
    i = 0
    while i < len(keys):
        size = rng.randint(*sizes)
        yield keys[i:i + size]
        i += size


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[str]:
    """The app at 80x24, its working directory and SERVESCOPE_HOME in tmp_path."""
    session = f"servescope-typing-{uuid.uuid4().hex[:8]}"
    open_session(session, [sys.executable, "-m", "servescope", "tui"], tmp_path,
                 env={"SERVESCOPE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    try:
        yield session
    finally:
        tmux("kill-session", "-t", session)


def test_200_keys_in_bursts_arrive_as_typed_at_80x24(compose: str) -> None:
    wait_for_text(lambda: screen(compose), ["Load F8", "1 workload x 3 load levels"], 60)
    tmux("send-keys", "-t", compose, "F8")
    wait_for_text(lambda: screen(compose), [], 20, pattern=r"(?m)^ concurrency\s+1,4,16\s*$")
    keys = script("1,4,16")
    assert len(keys) == 200 and sum(k in TMUX_KEYS for k in keys) > 60
    want = typed(keys, "1,4,16")
    for burst in bursts(keys):  # one write each, one right after another
        tmux("send-keys", "-t", compose, *[TMUX_KEYS.get(k, k) for k in burst])
    shown = wait_for_text(lambda: screen(compose), [], 30, pattern=rf"(?m)^ concurrency\s+{re.escape(want)}\s*$",
                          what=f"the field holding {want!r}")
    assert "Traceback" not in shown


def test_the_load_pane_typed_in_bursts_with_tab_shift_tab_and_enter_fills_every_field(compose: str,
                                                                                     tmp_path: Path) -> None:
    wait_for_text(lambda: screen(compose), ["Load F8", "1 workload x 3 load levels"], 60)
    tmux("send-keys", "-t", compose, "F8")
    wait_for_text(lambda: screen(compose), [], 20, pattern=r"(?m)^ concurrency\s+1,4,16\s*$")
    for burst in bursts(FORM, sizes=(2, 8)):  # one write each, 5 ms apart
        tmux("send-keys", "-t", compose, *[TMUX_KEYS.get(k, k) for k in burst])
        time.sleep(0.005)
    rows = "".join(rf"(?=.*^ {LABELS[f]}\s+{re.escape(v)}\s*$)" for f, v in FILLED.items() if v)
    shown = wait_for_text(lambda: screen(compose), [], 30, pattern=rf"(?ms){rows}", what=f"the fields holding {FILLED}")
    assert re.search(r"(?m)^ rates\s+or open-loop requests/s", shown), shown  # left empty: its hint shows
    saved = (tmp_path / "saved.toml").read_text()
    assert all(line in saved for line in SAVED), saved
    assert not (tmp_path / "burst.toml").exists()
    assert "Traceback" not in shown
