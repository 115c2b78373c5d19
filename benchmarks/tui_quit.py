"""How fast does the app leave when the user stops a sweep on the way out? ctrl+q during a sweep (which runs in a
runner process of its own) asks "leave it running, or stop it?"; `s` stops it. This prints, over a few runs:

- in the app driven by Pilot: ctrl+q -> the question on screen; `s` -> the app's exit (its return code set);
  `s` -> the app closed (its shutdown done); `s` -> the runner process gone (the session saved as interrupted).
  Target: the app leaves within 1 s of `s`.
- with --terminal, `servescope demo` in a real terminal (tmux, 80x24): `s` -> the app's last line
  ("servescope: stopping the sweep ...") on the pane. Target: within 2.5 s.

    python benchmarks/tui_quit.py [--repeat 5] [--profile tiny] [--terminal]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

APP_TARGET_S = 1.0
TERMINAL_TARGET_S = 2.5


def _wait(cond: object, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {limit_s:g} s waiting for {what}")
        time.sleep(0.005)


async def in_app(url: str, sessions: Path) -> dict[str, float]:
    """The app part of a run: ctrl+q, then `s`; the figures in seconds, and when `s` was pressed (t1)."""
    from servescope.engine.spec import SweepSpec
    from servescope.tui.app import make_app
    from servescope.tui.screens.dialogs import ChoiceScreen
    from servescope.tui.screens.run import RunScreen
    from servescope.tui.widgets import SweepProgress
    from servescope.workloads.spec import Workload, fixed

    slow = Workload("slow", "completions", fixed(32), fixed(400), source="inline")  # requests stay in flight
    spec = SweepSpec(url=url, workloads=(slow,), concurrency=(1, 2), requests=400, name="quit",
                     telemetry_interval_s=None).check("benchmark")
    app = make_app(url=url, sessions_dir=str(sessions))

    async def until(pilot: object, cond: object, limit_s: float, what: str) -> None:
        deadline = time.monotonic() + limit_s
        while not cond():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out after {limit_s:g} s waiting for {what}")
            await pilot.pause(0.005)  # type: ignore[attr-defined]

    async with app.run_test(size=(100, 30)) as pilot:
        app.start_sweep(spec)
        await until(pilot, lambda: isinstance(app.screen, RunScreen), 30, "the Run screen")
        progress = app.screen.query_one(SweepProgress)
        await until(pilot, lambda: progress.done >= 1, 60, "a request")
        t0 = time.monotonic()
        await pilot.press("ctrl+q")
        await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), 30, "the question")
        asked = time.monotonic() - t0
        t1 = time.monotonic()
        await pilot.press("s")
        await until(pilot, lambda: app.return_code is not None, 30, "the app to leave")
        left = time.monotonic() - t1
    closed = time.monotonic() - t1
    return {"ctrl+q -> question": asked, "s -> app exits": left, "s -> app closed": closed, "t1": t1}


def app_run(url: str, sessions: Path) -> dict[str, float]:
    """One sweep in the app, stopped through ctrl+q then `s`, and its runner's end; the figures in seconds."""
    from servescope.sessions.live import runner_state
    from servescope.sessions.store import load_session

    figures = asyncio.run(in_app(url, sessions))
    t1 = figures.pop("t1")
    path = next(sessions.iterdir())
    _wait(lambda: not runner_state(path).running, 60, "the runner to end")
    figures["s -> runner gone"] = time.monotonic() - t1
    status = load_session(path).status
    if status != "interrupted":
        raise SystemExit(f"the stopped session reads {status!r}, not 'interrupted'")
    return figures


def in_terminal(home: Path) -> float:
    """`servescope demo` in tmux: ctrl+q, then `s`; seconds from `s` to the app's last line on the pane."""
    from tests.support.tmux import open_session, tmux

    name = f"servescope-quit-{uuid.uuid4().hex[:8]}"
    open_session(name, [sys.executable, "-m", "servescope", "demo"], ROOT,
                 env={"SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)})

    def pane() -> str:
        return tmux("capture-pane", "-p", "-J", "-t", name)

    try:
        _wait(lambda: "cell 1/3" in pane(), 90, "the demo's first cell")
        tmux("send-keys", "-t", name, "C-q")
        _wait(lambda: "stop the sweep" in pane(), 30, "the question")
        t0 = time.monotonic()
        tmux("send-keys", "-t", name, "s")
        _wait(lambda: "stopping the sweep" in pane(), 30, "the app's last line")
        return time.monotonic() - t0
    finally:
        tmux("kill-session", "-t", name)


def show(label: str, xs: list[float], target: float | None = None) -> None:
    line = f"  {label:<22} median {statistics.median(xs) * 1000:7.0f} ms   max {max(xs) * 1000:7.0f} ms"
    if target is not None:
        line += f"   (target < {target * 1000:.0f} ms: {'met' if max(xs) < target else 'NOT met'})"
    print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--terminal", action="store_true", help="also time `servescope demo` in tmux")
    args = ap.parse_args()

    from servescope.sim.launcher import start_sim

    runs: list[dict[str, float]] = []
    with start_sim(args.profile) as sim, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            runs.append(app_run(sim.url, Path(tmp) / f"app-{i}"))
            print(f"run {i + 1}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in runs[-1].items()), file=sys.stderr)
        terminal = [in_terminal(Path(tmp) / f"term-{i}") for i in range(args.repeat)] if args.terminal else []
    print(f"ctrl+q then s during a sweep on sim://{args.profile}, {args.repeat} runs")
    print("in the app (Pilot):")
    for key in runs[0]:
        show(key, [r[key] for r in runs], APP_TARGET_S if key == "s -> app exits" else None)
    if terminal:
        print("in a terminal (tmux, servescope demo):")
        show("s -> last line shown", terminal, TERMINAL_TARGET_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
