"""Sweeps that outlive the terminal (simulator, real processes): `run --detach` returns at once and the sweep
completes with nobody attached; `watch` follows it to the end; `sessions --json` says running (with its pid),
completed or interrupted; kill -9 of the runner reads as interrupted and `resume` completes it; two runners
never write one session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servescope.sessions.live import RUNNER_LOG, runner_state, send_command
from servescope.sessions.store import load_session
from tests.integration.helpers import ROOT, events, measured, servescope, wait_for
from tests.support.meta import stored

# the --fast lane leaves this module out: 6 tests, ~18 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

FAST = """
[workload]
name = "fast"
input_tokens = 64
output_tokens = 24
"""
SLOW = """
[workload]
name = "slow"
input_tokens = 64
output_tokens = 400
"""


def _workload(tmp_path: Path, text: str) -> str:
    f = tmp_path / "w.toml"
    f.write_text(text)
    return str(f)


def _detach(tmp_path: Path, *args: str) -> tuple[Path, float, str]:
    """`run --detach ARGS` on sim://tiny: the session directory, the wall-clock time (epoch s) it returned at,
    and its stdout."""
    p = servescope("run", "--url", "sim://tiny", *args, "--detach", "--sessions-dir", str(tmp_path / "sessions"),
                   timeout=60)
    returned = time.time()
    assert p.returncode == 0, p.stderr[-2000:]
    last = p.stdout.strip().splitlines()[-1]
    return Path(last), returned, p.stdout


def _sessions(tmp_path: Path) -> list[dict[str, object]]:
    p = servescope("sessions", "--json", "--sessions-dir", str(tmp_path / "sessions"), timeout=60)
    assert p.returncode == 0, p.stderr
    rows: list[dict[str, object]] = json.loads(p.stdout)
    return rows


def _kinds(path: Path) -> list[str]:
    return [e["kind"] for e in events(path)]


def test_a_detached_sweep_completes_alone_and_watch_follows_it(tmp_path: Path) -> None:
    path, returned, out = _detach(tmp_path, "-w", _workload(tmp_path, FAST), "-c", "1,2,4", "-n", "12")
    assert path.is_dir() and f"servescope attach {path}" in out and f"servescope watch {path}" in out
    rows = _sessions(tmp_path)
    assert len(rows) <= 1  # the session.toml appears once the server answered
    if rows and rows[0]["status"] == "running":
        assert rows[0]["pid"] == runner_state(path).pid and isinstance(rows[0]["pid"], int)
    w = servescope("watch", str(path), timeout=180)  # follows it to the end
    assert w.returncode == 0, w.stdout[-3000:] + w.stderr[-2000:]
    assert "cell 3/3" in w.stdout and "sweep completed" in w.stdout, w.stdout
    assert "TTFT ms" in w.stdout  # each finished cell's table
    assert not runner_state(path).running
    assert load_session(path).status == "completed"
    [row] = _sessions(tmp_path)
    assert row["status"] == "completed" and "pid" not in row
    log = (path / "runner.log").read_text()
    assert "cell 3/3" in log  # the runner's own output went to its log
    # `run --detach` returned before the sweep ended (it does not wait for it; the runner's clock, same host)
    [finished] = [e for e in events(path) if e["kind"] == "SweepFinished"]
    assert returned < finished["t"], (returned, finished["t"])


@pytest.mark.slow
def test_kill_9_reads_interrupted_and_resume_completes_it(tmp_path: Path) -> None:
    path, _, _ = _detach(tmp_path, "-w", _workload(tmp_path, SLOW), "-c", "1,2", "-n", "6")
    wait_for(lambda: (path / "session.toml").exists() and runner_state(path).running, 30, "the sweep to start")
    [row] = _sessions(tmp_path)
    assert row["status"] == "running" and row["pid"] == runner_state(path).pid
    r = servescope("resume", str(path), timeout=30)  # a running sweep is not resumed twice
    assert r.returncode != 0 and f"servescope attach {path}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    pid = runner_state(path).pid
    assert pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not runner_state(path).running, 60, "the lock to be released")
    [row] = _sessions(tmp_path)
    assert row["status"] == "interrupted" and "gone" in str(row["reason"]), row
    w = servescope("watch", str(path), timeout=60)
    assert w.returncode == 1 and "servescope resume" in w.stdout, w.stdout
    r = servescope("resume", str(path), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = load_session(path)
    assert s.status == "completed" and [c["status"] for c in stored(s)["cells"]] == ["done", "done"]


def test_two_runners_never_write_one_session(tmp_path: Path) -> None:
    path, _, _ = _detach(tmp_path, "-w", _workload(tmp_path, SLOW), "-c", "1", "-n", "40")
    wait_for(lambda: runner_state(path).running, 30, "the runner")
    p = servescope("run", "--url", "sim://tiny", "-w", _workload(tmp_path, FAST), "-c", "1", "-n", "2",
                   "--save", str(path), timeout=60)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()[-1]
    assert "is being written by a running sweep" in err and "servescope attach" in err, p.stderr
    send_command(path, "stop")  # the viewers' control file: the runner obeys it
    send_command(path, "stop")
    wait_for(lambda: not runner_state(path).running, 30, "the stop")
    assert load_session(path).status == "interrupted"


def test_a_detached_sweep_that_cannot_start_says_why_at_once(tmp_path: Path) -> None:
    # `run --detach` waits a few seconds (START_WAIT_S) to see the runner start or fail, then returns 0 and leaves
    # it alone: a failure reported here is one seen within that wait, not found later in runner.log
    p = servescope("run", "--url", "http://127.0.0.1:9", "-w", "sharegpt", "-c", "1", "-n", "2", "--detach",
                   "--sessions-dir", str(tmp_path / "sessions"), timeout=60)
    assert p.returncode != 0 and "127.0.0.1:9" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("servescope run: error: ") and p.stderr.count("error:") == 1, p.stderr  # said once
    assert not any((tmp_path / "sessions").iterdir())  # nothing half-made is left behind


def test_watch_with_no_running_sweep_says_so(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()  # a sessions directory that does not exist is a bad --sessions-dir instead
    p = servescope("watch", "--sessions-dir", str(tmp_path / "sessions"), timeout=30)
    assert p.returncode != 0 and "no running sweep" in p.stderr and "--detach" in p.stderr


@pytest.mark.slow  # 6 s of the --fast lane on 2 cores
def test_a_skip_command_skips_only_the_cell_it_names(tmp_path: Path) -> None:
    path, _, _ = _detach(tmp_path, "-w", _workload(tmp_path, SLOW), "-c", "1,2", "-n", "30")
    wait_for(lambda: "CellStarted" in _kinds(path), 60, "the first cell")
    send_command(path, "skip", 1)  # a stale skip for a cell not running: ignored
    # the runner reads its commands after each write to the log: the first line written after the command
    # means it has read it (or reads it next); with one user, the request after the one then in flight
    # finishing means cell 0 went on past the stale skip (a skipped cell's requests are not logged)
    seen = len(events(path))
    after = wait_for(lambda: events(path)[seen:], 60, "the runner to write again")
    done = measured(events(path)[: seen + len(after)], 0)
    wait_for(lambda: measured(events(path), 0) >= done + 2 or "CellSkipped" in _kinds(path), 60, "cell 0 to go on")
    assert "CellSkipped" not in _kinds(path), "a skip naming cell 1 skipped cell 0"
    send_command(path, "skip", 0)
    wait_for(lambda: "CellStarted" in _kinds(path)[_kinds(path).index("CellSkipped"):]
          if "CellSkipped" in _kinds(path) else False, 60, "the skip")
    send_command(path, "stop")
    send_command(path, "stop")
    wait_for(lambda: not runner_state(path).running, 30, "the stop")
    cells = stored(load_session(path))["cells"]
    assert cells[0]["status"] == "skipped" and cells[0]["reason"] == "skipped by the user"
    assert cells[1]["status"] in ("stopped", "interrupted")


def test_sigterm_stops_a_detached_runner_cleanly(tmp_path: Path) -> None:
    path, _, _ = _detach(tmp_path, "-w", _workload(tmp_path, SLOW), "-c", "1,2", "-n", "30")
    wait_for(lambda: (path / "session.toml").exists() and runner_state(path).running, 30, "the sweep to start")
    pid = runner_state(path).pid
    assert pid
    wait_for(lambda: measured(events(path), 0) >= 1, 60, "a request measured, the next in flight")
    os.kill(pid, signal.SIGTERM)  # `kill PID`, as `run --detach` prints
    wait_for(lambda: not runner_state(path).running, 60, "the runner to stop")
    s = load_session(path)
    assert s.status == "interrupted" and stored(s).get("ended_at")  # it finished its bookkeeping
    log = [json.loads(x) for x in (path / "events.jsonl").read_text().splitlines()]
    why = ([(e["kind"], e.get("fields", {}).get("status")) for e in log[-5:]],
           (path / RUNNER_LOG).read_text()[-2000:] if (path / RUNNER_LOG).exists() else "no runner log")
    assert log[-1]["kind"] == "SweepFinished" and log[-1]["fields"]["status"] == "interrupted", why


def test_the_runner_survives_its_parent_and_the_terminal(tmp_path: Path) -> None:
    """SIGHUP to the process group of the command that started it (a closed terminal) does not reach it."""
    wl = _workload(tmp_path, SLOW)
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-w", wl, "-c", "1",
                             "-n", "20", "--detach", "--sessions-dir", str(tmp_path / "sessions")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, _ = proc.communicate(timeout=30)
    path = Path(out.strip().splitlines()[-1])
    wait_for(lambda: runner_state(path).running, 30, "the runner")
    try:
        os.killpg(proc.pid, signal.SIGHUP)
    except ProcessLookupError:
        pass
    assert runner_state(path).running
    send_command(path, "stop")
    send_command(path, "stop")
    wait_for(lambda: not runner_state(path).running, 60, "the stop")
    # it lived to obey the stop (a runner ended by the SIGHUP would not have finished its log)
    tail = events(path)[-1]
    assert tail["kind"] == "SweepFinished" and tail["fields"]["status"] == "interrupted", tail
