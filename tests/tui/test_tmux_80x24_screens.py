"""Every screen at 80x24 in a real terminal (tmux), read as a user reads it: after two saved sweeps of two
workloads each, `servescope demo` runs a third; the test opens Compose's tabs, the Run screen, the Sessions list,
a session, Compare of the two sweeps, What-if, Help and Export, zooms each pane that zooms (`z` on each pane
`tab` reaches), and reads every zoomed pane: no figure is cut (`…` beside a digit), and each column of figures
in a table names its statistic (p50, p99, mean, max...) or is a rate with its unit. It waits on what the screen
shows (capture-pane, polled), never on a fixed sleep."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import servescope
from tests.support.tmux import open_session, tmux

from .helpers import wait_for_text

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (.ci/run installs it); the terminal test needs it")]

ROOT = Path(servescope.__file__).resolve().parent.parent
WORKLOADS = {"fast": (32, 16), "short-chat": (128, 48)}  # two small workloads: (input, output) tokens
# a figure cut short: a number, then `…` (`167.7…`, `1,526…`), or `…` then a number; not a cut name (`Qwen3.5…`)
CUT_FIGURE = re.compile(r"(?<![\w.,+-])[+-]?[\d,]*\.?\d+…|(?<!\S)…[\d,]*\.?\d")
FIGURE = re.compile(r"^[+-]?[\d,]*\.?\d+%?$")
# what a column of figures says it holds: a statistic, or a rate with its unit, or a share
NAMED = re.compile(r"\b(p\d{2}|mean|median|max|min|peak|total|rate)\b|/s\b|/s\)|%|^#$|^cells$")


def screen(name: str) -> str:
    return tmux("capture-pane", "-p", "-t", name)


def keys(name: str, *ks: str) -> None:
    for k in ks:
        tmux("send-keys", "-t", name, k)


def settled(name: str, cond: Callable[[str], bool], timeout: float, what: str) -> str:
    """The screen once `cond` holds and two captures in a row are the same (a repaint has finished)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        text = screen(name)
        if cond(text) and text == last:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not on screen after {timeout:g} s; the screen was:\n{text}")
        last = text
        time.sleep(0.25)


def footer(text: str) -> str:
    return text.rstrip("\n").split("\n")[-1]


def table_problems(text: str) -> list[str]:
    """A zoomed table's columns of figures whose header names no statistic or rate; in a table of metrics, one per
    row (Compare's), the rows of figures whose metric does not."""
    lines = text.split("\n")
    top = next((i for i, ln in enumerate(lines) if ln.startswith(("┏", "╭"))), None)
    if top is None:
        return []
    body = []
    for ln in lines[top + 1:]:
        if ln.startswith(("┗", "╰")):
            break
        body.append(ln[1:].rstrip("┃│ ▁▂▃▄▅▆▇█"))  # the borders and the scrollbar off, the columns in place
    if not body:
        return []
    header = body[0]
    if " metric " in f" {header} ":  # Compare: from the metric's column on, each row is a metric and its figures
        at = header.index("metric")
        out = []
        for row in body[1:]:
            metric, *values = re.split(r"\s{2,}", row[at:].strip())
            if any(FIGURE.match(v.rstrip(" ★")) for v in values) and not NAMED.search(metric):
                out.append(f"row {metric!r}")
        return out
    head = re.split(r"\s{2,}", header.strip())
    rows = [r for r in (re.split(r"\s{2,}", b.strip()) for b in body[1:] if b.strip()) if len(r) == len(head)]
    out = []
    for j, h in enumerate(head):
        values = [r[j] for r in rows if r[j] not in ("-", "")]
        if values and all(FIGURE.match(v) for v in values) and not NAMED.search(h.rstrip(" ▲▼")):
            out.append(f"column {h!r}")
    return out


def check_zoomed(text: str, where: str) -> None:
    assert not CUT_FIGURE.search(text), f"{where}: a figure cut short when zoomed:\n{text}"
    problems = table_problems(text)
    assert not problems, f"{where}: figures that name no statistic or unit: {problems}\n{text}"


# the focus ring's characters (app.tcss) and their plain forms: a screen's layout, whoever has the focus
UNFOCUSED = str.maketrans("▊┏┓┗┛━┃", "│╭╮╰╯─│")


def layout(text: str) -> str:
    """The screen with the focus ring drawn as an unfocused pane's border: a focus move that is painted late (a
    busy host) is no change of layout, so it is never read as the zoom."""
    return text.translate(UNFOCUSED)


def zoom_every_pane(name: str, where: str, at_least: int, max_tabs: int = 12) -> int:
    """`z` on each pane `tab` reaches (the footer offers `z Zoom`), read it zoomed, `z` back; how many."""
    seen: set[str] = set()
    for _ in range(max_tabs):
        before = settled(name, lambda t: bool(footer(t).strip()), 30, f"{where}: a screen with its footer")
        if "z Zoom" in footer(before):
            keys(name, "z")
            shape = layout(before)
            # zoomed: the footer offers `esc Unzoom` (and only then), and the layout changed
            zoomed = settled(name, lambda t, b=shape: "esc Unzoom" in footer(t) and layout(t) != b, 30,
                             f"{where}: the pane zoomed")
            title = zoomed.split("\n")[0].strip() + "|" + zoomed.split("\n")[1].strip()
            keys(name, "z")
            shape = layout(zoomed)
            settled(name, lambda t, z=shape: "esc Unzoom" not in footer(t) and layout(t) != z, 30,
                    f"{where}: the pane back in its place")
            if title in seen:
                break
            seen.add(title)
            check_zoomed(zoomed, f"{where}, zoomed pane {len(seen)}")
        keys(name, "Tab")
    assert len(seen) >= at_least, f"{where}: {len(seen)} panes zoomed, expected {at_least}: {seen}"
    return len(seen)


def sweep(home: Path, name: str) -> None:
    wl = ",".join(str(home / "workloads" / f"{w}.toml") for w in WORKLOADS)
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "-w", wl, "-c", "1,2,4", "-n", "12", "--url",
                        "sim://tiny", "--name", name], cwd=home, capture_output=True, text=True, timeout=600,
                       env={**_env(home)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def _env(home: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "SERVESCOPE_ENGINE")}
    return {**env, "SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)}


def test_every_screen_reads_whole_at_80x24(tmp_path: Path) -> None:
    (tmp_path / "workloads").mkdir()
    for w, (inp, out) in WORKLOADS.items():
        (tmp_path / "workloads" / f"{w}.toml").write_text(
            f'[workload]\nname = "{w}"\napi = "chat"\ninput_tokens = {inp}\noutput_tokens = {out}\n')
    sweep(tmp_path, "first")
    sweep(tmp_path, "second")
    name = f"servescope-80x24-{uuid.uuid4().hex[:8]}"
    open_session(name, [sys.executable, "-m", "servescope", "demo"], ROOT, size=(80, 24),
                 env={"SERVESCOPE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}, linger_s=60)
    try:
        # Run: the demo's sweep, to its end
        wait_for_text(lambda: screen(name), ["cell 1/"], 120, what="the demo's sweep on the Run screen")
        # Compose, each tab, while the sweep runs: the preview's target line is on screen
        keys(name, "F2")
        for key, needle in (("F6", "URL"), ("F7", "fast"), ("F8", "concurrency"), ("F9", "probe questions")):
            keys(name, key)
            text = settled(name, lambda t, n=needle: n in t and "cells" in t, 30, f"Compose {key}")
            assert not CUT_FIGURE.search(text), text
            assert re.search(r"(?m)^ (target|launch) ", text), f"Compose {key}: the preview's target line\n{text}"
        keys(name, "F3")
        settled(name, lambda t: "[completed]" in t, 240, "the demo's sweep completed")
        zoom_every_pane(name, "Run", at_least=5)
        # Sessions: the list, zoomed
        keys(name, "F4")
        settled(name, lambda t: "3 saved sessions" in t and "second" in t and "first" in t, 30, "the Sessions list")
        zoom_every_pane(name, "Sessions", at_least=1)
        # a session of two workloads (`second`, below the demo's)
        keys(name, "Home", "Down", "Enter")
        settled(name, lambda t: "second" in t.split("\n")[0] and "What if" in footer(t), 30, "the session `second`")
        zoom_every_pane(name, "Session", at_least=5)
        # What-if on it
        keys(name, "w")
        settled(name, lambda t: "what if" in t.lower() and "Predict" in footer(t), 30, "What-if")
        zoom_every_pane(name, "What-if", at_least=1)
        keys(name, "Escape")
        settled(name, lambda t: "What if" in footer(t), 30, "back on the session")
        # Export of the session's report
        keys(name, "e")
        text = settled(name, lambda t: "Export a Markdown report" in t and "write to" in t, 30, "Export")
        assert "esc Cancel" in footer(text), text
        keys(name, "Escape")
        settled(name, lambda t: "What if" in footer(t), 30, "back on the session")
        # Compare: `second` and `first`
        keys(name, "Escape")
        settled(name, lambda t: "saved sessions" in t, 30, "the Sessions list")
        keys(name, "Home", "Down", "Space", "Down", "Space", "c")
        settled(name, lambda t: "Base" in footer(t) and "metric" in t, 60, "Compare")
        zoom_every_pane(name, "Compare", at_least=2)
        # Help
        keys(name, "F1")
        text = settled(name, lambda t: "servescope: keys" in t, 30, "Help")
        assert "Compose" in text and "Sessions" in text
        keys(name, "Escape")
        settled(name, lambda t: "servescope: keys" not in t, 30, "Help closed")
    finally:
        tmux("kill-session", "-t", name)
