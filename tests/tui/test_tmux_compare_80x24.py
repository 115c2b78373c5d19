"""Compare at 80x24 in a real terminal (tmux), read as a user reads it: two sessions of two workloads each,
recorded on the simulator, side by side, the delta table zoomed and read page by page. Every delta is on screen
with its interval, in the table's short form (`-4.5% [-9.5,+0.0]`: the verdict is the ★ beside a value), and it is
the delta the comparison computed; the column once read `+1 column left out (Δ FP8)` at this size, even zoomed."""

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
from servescope.sessions.compare import compare_sessions
from servescope.sessions.store import load_session
from servescope.tui.screens.compare import compact_delta, delta_rows
from tests.support.tmux import open_session, tmux

from .helpers import wait_for_text

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the terminal test needs it")

ROOT = Path(servescope.__file__).resolve().parent.parent
WORKLOADS = {"fast": (32, 16), "short-chat": (128, 48)}  # (input, output) tokens
INTERVAL = re.compile(r"^[+-]\d+(\.\d)?% (\[[+-]\d+(\.\d)?,[+-]\d+(\.\d)?\]|\(no spread\))$")


def screen(name: str) -> str:
    return tmux("capture-pane", "-p", "-t", name)


def table_rows(text: str) -> list[tuple[str, ...]]:
    """The zoomed table's rows as (metric, baseline value, other value, Δ): the fields of each row split where two
    spaces part them, the borders and the scrollbar off."""
    lines = text.split("\n")
    top = next(i for i, ln in enumerate(lines) if ln.startswith("┏"))
    rows = []
    for ln in lines[top + 2:]:  # past the border and the header
        if ln.startswith("┗"):
            break
        fields = re.split(r"\s{2,}", ln[1:].rstrip("┃ ▁▂▃▄▅▆▇█").strip())
        rows.append(tuple(fields[-4:]))
    return rows


def settled(name: str, timeout: float = 30) -> str:
    """The screen once two captures in a row are the same."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        text = screen(name)
        if text == last:
            return text
        assert time.monotonic() < deadline, f"the screen kept changing:\n{text}"
        last = text
        time.sleep(0.2)


def sweep(home: Path, name: str, quant: str) -> Path:
    wl = ",".join(str(home / "workloads" / f"{w}.toml") for w in WORKLOADS)
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "-w", wl, "-c", "1,2", "-n", "8", "--url",
                        "sim://tiny", "--name", name, "--tag", f"quant={quant}"], cwd=home, capture_output=True,
                       text=True, timeout=600, env={**_env(home)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return next((home / "sessions").glob(f"*-{name}"))


def _env(home: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "SERVESCOPE_ENGINE")}
    return {**env, "SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)}


def test_compare_at_80x24_shows_every_delta_with_its_interval(tmp_path: Path) -> None:
    (tmp_path / "workloads").mkdir()
    for w, (inp, out) in WORKLOADS.items():
        (tmp_path / "workloads" / f"{w}.toml").write_text(
            f'[workload]\nname = "{w}"\napi = "chat"\ninput_tokens = {inp}\noutput_tokens = {out}\n')
    first = sweep(tmp_path, "gptq", "GPTQ")
    second = sweep(tmp_path, "fp8", "FP8")
    sessions = {"GPTQ": load_session(first), "FP8": load_session(second)}
    name = f"servescope-compare-{uuid.uuid4().hex[:8]}"
    open_session(name, [sys.executable, "-m", "servescope"], tmp_path, size=(80, 24), env=_env(tmp_path))
    try:
        wait_for_text(lambda: screen(name), ["Load F8"], 60, what="the app")
        tmux("send-keys", "-t", name, "F4")
        wait_for_text(lambda: screen(name), ["2 saved sessions", "gptq", "fp8"], 30, what="the Sessions list")
        for k in ("Home", "Space", "Down", "Space", "c"):
            tmux("send-keys", "-t", name, k)
        text = wait_for_text(lambda: screen(name), [], 60, pattern=r"(GPTQ vs FP8|FP8 vs GPTQ)  \(4 common cells",
                             what="Compare")
        assert "left out (Δ" not in text, text
        labels = text.split("  (")[0].strip().split(" vs ")  # the baseline first, as the screen took them
        cmp_ = compare_sessions([sessions[lb] for lb in labels], label_key="quant")
        assert cmp_.labels == labels and {c.workload for c in cmp_.cells} == set(WORKLOADS)
        # (metric, baseline's value, the other's, Δ) as the table shows them: each delta in its short form
        want = [(r[2], r[3], r[4], compact_delta(r[5])) for r in delta_rows(cmp_)]
        judged = [w for w in want if w[3] != "-" and not w[3].endswith("%")]
        assert len(judged) == 2 * 2 * 9, want  # two workloads, two loads, nine judged metrics
        assert all(INTERVAL.match(w[3]) for w in judged), judged
        tmux("send-keys", "-t", name, "z")
        wait_for_text(lambda: screen(name), [], 30, pattern=r"^┏.*\n┃ ", what="the table zoomed")
        # page through the zoomed table: each page is a run of the rows the comparison gives, and together they
        # are all of them
        seen: set[int] = set()
        tmux("send-keys", "-t", name, "Home")
        page = settled(name)
        for _ in range(20):
            rows = table_rows(page)
            at = [i for i in range(len(want) - len(rows) + 1) if want[i:i + len(rows)] == rows]
            assert at, f"a page of rows the comparison does not give:\n{page}\nwant {want}"
            seen.update(range(at[0], at[0] + len(rows)))
            if len(want) - 1 in seen:
                break
            tmux("send-keys", "-t", name, "PageDown")
            page = settled(name)
        assert seen == set(range(len(want))), f"rows never shown: {sorted(set(range(len(want))) - seen)}"
    finally:
        tmux("kill-session", "-t", name)
