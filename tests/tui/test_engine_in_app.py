"""The engine inside the app (issue 10): it really runs in its own process on a 2-CPU machine; a failed start
is one readable line with no running timer; `s` saves the cell as skipped and `x` lets the in-flight requests
finish (a second `x` cancels them), with the curve drawn from completed cells only; ctrl+q during a sweep
asks, then `s` stops it and the app leaves saying what it saved, or `l` leaves it running (how fast the app
leaves is a figure of benchmarks/tui_quit.py); the app and `servescope sessions` count an interrupted
session's cells alike; the probe result and the duration estimate follow the target."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Static

from servescope.core.results import CellResult
from servescope.engine.spec import SweepSpec
from servescope.sessions.store import load_session
from servescope.tui.app import make_app
from servescope.tui.screens.dialogs import ChoiceScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import CellTable, EventLog, SweepProgress
from servescope.workloads.spec import Workload, fixed
from tests.support.meta import meta_of, stored

from .helpers import cell_status, poll_until, set_input, text_of, wait_until

# the --fast lane leaves this module out: 8 tests, ~27 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)
FAST = Workload("fast", "completions", fixed(32), fixed(16), source="inline")
SLOW = Workload("slow", "completions", fixed(32), fixed(400), source="inline")  # requests stay in flight a while
# requests per cell of the SLOW sweeps: each takes about 1.4 s on sim://tiny, so a cell at c=1 (2, 4) runs 30 s
# (15, 8) or more, far longer than a test needs to press its keys; more requests only make each cell slower to
# prepare (its prompts are built before it starts)
N_SLOW = 24


def _spec(url: str, wl: Workload = FAST, conc: tuple[int, ...] = (1,), requests: int = 4) -> Any:
    return SweepSpec(url=url, workloads=(wl,), concurrency=conc, requests=requests, name="t",
                     telemetry_interval_s=None).check("test")


def _log(app: Any) -> str:
    """The event log's text with its wrapped lines joined (one space between words)."""
    return " ".join(" ".join(ln.text for ln in app.screen.query_one(EventLog).lines).split())


async def test_the_sweep_runs_in_a_runner_process_of_its_own(home: Path, sim_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVESCOPE_ENGINE", raising=False)
    app = make_app(url=sim_url, sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        assert app.start_sweep(_spec(sim_url))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 60, "the Run screen")
        progress = app.screen.query_one(SweepProgress)
        try:
            await wait_until(pilot, lambda: progress.state in ("completed", "failed"), 60, "the sweep to end")
        except AssertionError as e:  # say what the app and the runner had said by then
            where = app.driver.session_dir if app.driver is not None else None
            runner = (where / "runner.log").read_text(errors="replace")[-2000:] if where and (where / "runner.log").is_file() else ""
            raise AssertionError(f"{e}; state {progress.state!r}; event log: {_log(app)}; runner.log: {runner}") from None
        log = _log(app)
        assert progress.state == "completed", log
        assert "in a thread" not in log and "could not start" not in log, log
        run = app.screen
        assert isinstance(run, RunScreen)
        assert run.engine_pid and run.engine_pid != os.getpid()  # the sweep ran in another process
        assert app.driver is not None and app.driver.mode == "detached" and app.driver.detached
        assert f"own process (pid {run.engine_pid})" in log
        assert run.session_dir is not None and (run.session_dir / "events.jsonl").is_file()
        # the runner is the app's child: once it ends it is reaped, not left `<defunct>` until the next sweep
        proc = Path(f"/proc/{run.engine_pid}")
        await wait_until(pilot, lambda: not proc.exists(), 60,
                         f"the runner (pid {run.engine_pid}) to be reaped after its sweep ended")


def test_an_engine_start_failure_is_one_readable_line() -> None:
    import pickle

    from servescope.tui.wire import start_failure

    for e in (ValueError("bad value(s) in fds_to_keep"), pickle.PicklingError("Can't pickle <function <lambda>>"),
              OSError(28, "No space left on device")):
        line = start_failure(e)
        assert "\n" not in line and type(e).__name__ not in line and "running in a thread" in line, line
        assert "fds_to_keep" not in line and "<lambda>" not in line, line


async def test_a_failed_start_says_why_with_no_running_timer(home: Path) -> None:
    now = [1000.0]  # the Run screen's clock: moved by hand, so a tick after the failure would show it
    app = make_app(url="http://127.0.0.1:9", sessions_dir=str(home / "sessions"), clock=lambda: now[0])
    async with app.run_test(size=SIZE) as pilot:
        assert app.start_sweep(_spec("http://127.0.0.1:9"))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 30, "the Run screen")
        run = app.screen
        assert isinstance(run, RunScreen)
        progress = run.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.state == "failed", 60, "the failure")
        before = text_of(progress), progress.sweep_elapsed, progress.cell_elapsed
        now[0] += 60.0
        run._tick()  # what the screen's 1 s timer runs: a minute later, nothing on the failed sweep moves
        await pilot.pause()
        assert (text_of(progress), progress.sweep_elapsed, progress.cell_elapsed) == before
        shown = text_of(progress)
        assert "did not start" in shown and "127.0.0.1:9" in shown, shown
        assert "the URL field" in shown and "--url" not in shown, shown  # the app's field, not the CLI flag
        assert "cell 0.0 s" not in shown and "ETA" not in shown and "starting" not in shown, shown
        assert "--url" not in _log(app)


@pytest.mark.slow  # 7 s of the --fast lane on 2 cores
async def test_skip_saves_skipped_and_stop_lets_in_flight_requests_finish(home: Path, sim_url: str) -> None:
    sessions = home / "sessions"
    app = make_app(url=sim_url, sessions_dir=str(sessions))
    async with app.run_test(size=SIZE) as pilot:
        assert app.start_sweep(_spec(sim_url, SLOW, (1, 2, 4), N_SLOW))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 60, "the Run screen")
        run = app.screen
        progress = run.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.cell_no == 1 and progress.done >= 1, 60, "a request of cell 1")
        await pilot.press("s")
        await wait_until(pilot, lambda: progress.cell_no == 2 and progress.done >= 1, 60, "a request of cell 2")
        await pilot.press("x")
        assert app.sweep_worker is not None
        await app.sweep_worker.wait()
        await wait_until(pilot, lambda: progress.state == "interrupted", 60, "the interrupted message")
        table = run.query_one(CellTable)
        assert [cell_status(table, i) for i in range(table.row_count)] == ["skipped", "stopped"]
        log = _log(app)
        assert "(x again: cancel them)" in log
        assert "left out of the curve" in log
        assert isinstance(run, RunScreen) and run._points == {}  # neither cell completed: no curve point
    s = load_session(next(sessions.iterdir()))
    assert [(c["status"], c.get("reason") or None) for c in stored(s)["cells"]] == [
        ("skipped", "skipped by the user"), ("stopped", "stopped by the user"), ("planned", None)]
    assert "cancelled" not in s.requests(1)["status"].to_list()  # the in-flight requests finished


async def test_a_second_x_cancels_the_in_flight_requests(home: Path, sim_url: str) -> None:
    sessions = home / "sessions"
    app = make_app(url=sim_url, sessions_dir=str(sessions))
    async with app.run_test(size=SIZE) as pilot:
        assert app.start_sweep(_spec(sim_url, SLOW, (4,), N_SLOW))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 60, "the Run screen")
        progress = app.screen.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.done >= 1, 60, "a request")
        await pilot.press("x", "x")
        assert app.sweep_worker is not None
        await app.sweep_worker.wait()
        assert "the in-flight requests are cancelled" in _log(app)
    s = load_session(next(sessions.iterdir()))
    assert "cancelled" in s.requests(0)["status"].to_list()


def _wait_runner_gone(path: Path, timeout: float = 60.0) -> None:
    from servescope.sessions.live import runner_state

    poll_until(lambda: not runner_state(path).running, timeout, f"the runner of {path} to end")


async def test_ctrl_q_asks_and_s_stops_the_sweep(home: Path, sim_url: str) -> None:
    sessions = home / "sessions"
    app = make_app(url=sim_url, sessions_dir=str(sessions))
    async with app.run_test(size=SIZE) as pilot:
        assert app.start_sweep(_spec(sim_url, SLOW, (1, 2), N_SLOW))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 30, "the Run screen")
        progress = app.screen.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.done >= 1, 60, "a request")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceScreen), 30, "the question")
        assert app.return_code is None  # it asks first
        shown = " ".join(text_of(w) for w in app.screen.query("Static"))
        assert "leave it running" in shown and "stop the sweep" in shown, shown
        await pilot.press("s")
        await wait_until(pilot, lambda: app.return_code is not None, 30, "the app to leave")
    assert app.return_code == 0
    path = next(sessions.iterdir())
    _wait_runner_gone(path)
    s = load_session(path)
    assert stored(s)["cells"][0]["status"] in ("stopped", "interrupted"), stored(s)["cells"][0]
    assert stored(s)["cells"][1]["status"] == "planned"  # the sweep ended: the second cell never ran
    assert s.status == "interrupted"
    assert "stopping the sweep" in app.quit_summary and "servescope resume" in app.quit_summary, app.quit_summary


@pytest.mark.slow  # 5 s of the --fast lane on 2 cores
async def test_ctrl_q_then_l_leaves_the_sweep_running(home: Path, sim_url: str) -> None:
    from servescope.sessions.live import EventLogReader, runner_state, send_command

    sessions = home / "sessions"
    app = make_app(url=sim_url, sessions_dir=str(sessions))
    async with app.run_test(size=SIZE) as pilot:
        assert app.start_sweep(_spec(sim_url, SLOW, (1,), N_SLOW))
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 30, "the Run screen")
        progress = app.screen.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.done >= 1, 60, "a request")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceScreen), 30, "the question")
        await pilot.press("escape")  # esc: neither; the app stays
        await wait_until(pilot, lambda: not isinstance(app.screen, ChoiceScreen), 30, "the question to close")
        assert app.return_code is None and isinstance(app.screen, RunScreen)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceScreen), 30, "the question again")
        await pilot.press("l")
        await wait_until(pilot, lambda: app.return_code is not None, 30, "the app to leave")
    path = next(sessions.iterdir())
    # the sweep goes on without the app: its runner still holds the session and measures new requests
    log = EventLogReader(path)
    while log.poll():  # what was written while the app was there
        pass
    poll_until(lambda: any(kind == "RequestsMeasured" for kind, _ in log.poll()), 60,
               "requests measured after the app left")
    log.close()
    st = runner_state(path)
    assert st.running and st.pid == app.driver.engine_pid, st
    assert f"servescope attach {path}" in app.quit_summary, app.quit_summary
    send_command(path, "stop")
    send_command(path, "stop")
    _wait_runner_gone(path)
    assert load_session(path).status == "interrupted"


def test_the_app_and_servescope_sessions_count_cells_alike(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from servescope.__main__ import main
    from servescope.sessions.store import SessionWriter
    from servescope.tui.screens.sessions import SESSION_COLUMNS, session_row

    path = home / "sessions" / "cut"
    w = SessionWriter.create(path, meta_of(**{"name": "cut", "model": "m", "target": {"url": "sim://tiny"},
                                    "cells": [{"index": i, "workload": "fast", "status": "planned"} for i in range(3)]}))
    w.write_cell({"index": 0, "workload": "fast", "concurrency": 1, "load_label": "c=1", "status": "done"}, None,
                 CellResult(requests_ok=4, requests_failed=0))
    w.write_cell({"index": 1, "workload": "fast", "concurrency": 2, "load_label": "c=2", "status": "stopped",
                  "reason": "stopped by the user"}, None, CellResult(requests_ok=1, requests_failed=0))
    w.finish("interrupted")
    row = session_row(path)
    assert row[[c.key for c in SESSION_COLUMNS].index("cells")] == "1/3"
    assert main(["sessions", "--sessions-dir", str(home / "sessions")]) == 0
    out = capsys.readouterr().out
    assert "  1/3  " in out, out
    assert main(["sessions", "--sessions-dir", str(home / "sessions"), "--json"]) == 0
    [j] = json.loads(capsys.readouterr().out)
    assert (j["cells_done"], j["cells_planned"]) == (1, 3)


async def test_the_probe_result_and_the_estimate_follow_the_target(home: Path, sim_url: str) -> None:
    app = make_app(url=sim_url, sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f5")
        res = app.screen.query_one("#probe-result", Static)
        await wait_until(pilot, lambda: text_of(res).startswith(("✓", "✗")), 30, "the probe")
        assert text_of(res).startswith("✓") and "TPOT" in text_of(res), text_of(res)
        preview = app.screen.query_one("#preview", Static)
        assert "ms/token, probed" in text_of(preview), text_of(preview)
        await pilot.press("f6")
        await set_input(pilot, "#url", "http://127.0.0.1:9")
        assert app.screen.query_one("#url", Input).value == "http://127.0.0.1:9"
        assert "✓" not in text_of(res) and "not probed yet" in text_of(res), text_of(res)
        assert "guess: F5 measures" in text_of(preview), text_of(preview)


async def test_a_on_a_running_session_attaches_and_s_skips_its_cell(home: Path, sim_url: str) -> None:
    """Sessions screen: `a` on a sweep another process runs opens the Run screen on it, rebuilt from its event
    log, and `s` there skips the runner's current cell (through the session's control file)."""
    from servescope.engine.detached import start_runner, wait_started
    from servescope.engine.spec import RunContext
    from servescope.sessions.live import runner_state, send_command

    sessions = home / "sessions"
    path, proc = start_runner(_spec(sim_url, SLOW, (1, 2), N_SLOW), RunContext(sessions_dir=sessions))
    assert wait_started(path, proc, 30) is None
    try:
        app = make_app(url=sim_url, sessions_dir=str(sessions))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f4")
            await wait_until(pilot, lambda: [r[3] for r in getattr(app.screen, "rows", {}).values()] == ["running"],
                             60, "the running session in the list")
            await pilot.press("a")
            await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 60, "the Run screen")
            progress = app.screen.query_one(SweepProgress)
            await wait_until(pilot, lambda: progress.state == "running" and progress.done >= 1, 60, "live figures")
            assert app.driver is not None and app.driver.engine_pid == proc.pid  # the runner, not this app
            await pilot.press("s")
            await wait_until(pilot, lambda: "skipped" in _log(app), 30, "the skip")
            await wait_until(pilot, lambda: progress.cell_no == 2, 30, "cell 2")
            assert stored(load_session(path))["cells"][0]["status"] == "skipped"
    finally:
        send_command(path, "stop")
        send_command(path, "stop")
        proc.wait(timeout=60)
    assert not runner_state(path).running
