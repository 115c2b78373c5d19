"""End to end at 80x24 in a real terminal (tmux): `servescope demo` runs a sweep; the test skips a cell (`s`)
and stops the sweep (`x`), opens the session, compares it with another session and exports the report,
reading the screen as a user would: no `▲` glued to a number, the skipped cell marked `skipped`, no
negative axis value, a chart legend above its plot."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import servescope

from .fixtures import write_session
from .helpers import wait_for_text

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e test needs it")

ROOT = Path(servescope.__file__).resolve().parent.parent
# a histogram marker with only its own numbers: `▲50`, `99▲`, `▲50,99`, `50,99▲`, `50▲▲99` (side by side at an
# edge), or a bare `▲` (of a pair sharing `▲ ▲50,99`, or a sorted column's mark)
MARKER_WORD = re.compile(r"(?:50|99|50,99)?▲+(?:50|99|50,99)?")
# p50's and p99's markers on screen, with their numbers before or after them
BOTH_MARKERS = r"(?s)(?=.*(?:▲50|50▲|50,99))(?=.*(?:▲99|50,99|99▲))"
NEGATIVE_TICK = re.compile(r"-\d[\d,.]*┤|├-\d")


class Term:
    """A tmux session on its own server socket (other tmux users are never touched)."""

    def __init__(self, home: Path, cmd: list[str], size: tuple[int, int] = (80, 24)) -> None:
        self.sock = f"servescope-e2e-{uuid.uuid4().hex[:8]}"
        self.home = home
        shell = " ".join(f"'{c}'" for c in cmd)
        self.tmux("new-session", "-d", "-s", "t", "-x", str(size[0]), "-y", str(size[1]), "-c", str(ROOT),
                  "-e", f"SERVESCOPE_HOME={home}", "-e", f"PYTHONPATH={ROOT}", "-e", "TERM=xterm-256color",
                  f"{shell}; sleep 30")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=20,
                              check=False).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        """Type `keys` one after another, a short pause between them as a user would."""
        for k in keys:
            self.tmux("send-keys", "-t", "t", k)
            time.sleep(0.05)

    def wait_for(self, needles: list[str], timeout: float, pattern: str | None = None) -> str:
        return wait_for_text(self.screen, needles, timeout, pattern)

    def command(self) -> str:
        """What runs in the pane: the app's python, then the `sleep` that keeps the pane once it has left."""
        return self.tmux("display-message", "-p", "-t", "t", "#{pane_current_command}")

    def close(self) -> None:
        self.tmux("kill-server")


def check_markers(screen: str) -> None:
    """Every word with a `▲` (split on blanks and the panels' borders `│▊┃`) is a marker with only its own
    numbers, never glued to a label (`1▲50`, `▲504`, `▲50▲99`); a histogram's axis that names its markers
    names p50 and p99 once each, p50 first."""
    for line in screen.splitlines():
        for panel in re.split(r"[│▊┃]", line):
            words = [word for word in panel.split() if "▲" in word]
            for word in words:
                assert MARKER_WORD.fullmatch(word), (word, screen)
            names = [n for word in words for n in re.findall(r"\d+", word)]
            assert names in ([], ["50", "99"]), (line, screen)


def check_readable(screen: str) -> None:
    check_markers(screen)
    assert not NEGATIVE_TICK.search(screen), screen


def test_sweep_skip_stop_open_compare_export_at_80x24(tmp_path: Path) -> None:
    # a saved session to compare the demo's with (the same workload and c=1)
    write_session(tmp_path / "sessions", "baseline", "2026-12-01T10:00:00+0000", {"run": "baseline"}, loads=(1, 4))
    term = Term(tmp_path, [sys.executable, "-m", "servescope", "demo"])
    try:
        # the sweep runs: cell 1 finishes, then cell 2 is skipped and cell 3 stopped
        screen = term.wait_for(["cell 1/3", "TTFT ms"], timeout=90, pattern=BOTH_MARKERS)
        check_readable(screen)
        # cell 1's row in the finished-cells table (its "✓ cell 1/3" line soon scrolls out of the 80x24 event log)
        screen = term.wait_for(["cell 2/3", "[running]"], timeout=90, pattern=r"\b1\s+c=1\s+(?:done|bound)\b")
        check_readable(screen)
        lines = screen.splitlines()
        legend = next(i for i, ln in enumerate(lines) if "■ tok/s" in ln)
        # a loaded machine: the client limited c=1 (`bound` is `done, client BOUND` where the pane is narrow)
        if re.search(r"\b1\s+c=1\s+(?:done, client BOUND|bound)\b", screen):
            assert "c=1 client-bound: not plotted" in screen, screen  # left off the curve, and the curve says so
        else:
            assert any("┤" in ln for ln in lines[legend + 1:legend + 4]), screen  # the plot is under its legend
            assert not any("tok/s" in ln.split("▊")[-1] for ln in lines if "┤" in ln), screen  # not over the data
        term.keys("s")
        screen = term.wait_for(["cell 3/3", "[running]"], timeout=60)  # its requests are sent: x stops them
        term.keys("x")
        screen = term.wait_for(["session ("], timeout=60)
        check_readable(screen)
        # the skipped cell in the finished-cells table (once the "sweep interrupted" notice has gone)
        screen = term.wait_for(["skipped", "stopped"], timeout=30)
        check_readable(screen)
        assert "112%" not in screen and not re.search(r"\b1[0-9]{2}%", screen.replace("100%", "")), screen
        # the session: its cell table and charts
        term.keys("F4")
        screen = term.wait_for(["saved sessions", "demo", "baseline"], timeout=30)
        term.keys("Home", "Enter")
        # read once the "sweep interrupted" notice (8 s) has gone: it covers the right end of the histograms' axes
        screen = term.wait_for(["cells", "output tok/s vs load", "skipped", "stopped"], timeout=30,
                               pattern=r"(?s)\A(?!.*sweep interrupted)")
        check_readable(screen)
        term.keys("Escape")
        # compare the demo with the baseline session
        term.wait_for(["saved sessions"], timeout=30)
        term.keys("Home", "space", "Down", "space", "c")
        screen = term.wait_for(["vs", "output tok/s vs load", "mean tok/s/user vs load"], timeout=30)
        check_readable(screen)
        # export the report (the default path in the sessions folder)
        term.keys("e")
        term.wait_for(["Export a Markdown report"], timeout=30)
        term.keys("Enter")
        term.wait_for(["wrote the report"], timeout=30)
        reports = list((tmp_path / "sessions").glob("report-*.md"))
        assert len(reports) == 1 and "# servescope report" in reports[0].read_text()
        term.keys("C-q")  # no sweep runs: the app leaves at once
        wait_for_text(term.command, ["sleep"], 30, what="the app to leave")
    finally:
        term.close()
