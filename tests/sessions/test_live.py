"""The session bus (servescope.sessions.live): the runner lock, the event log with its rotation, the control
file. Real files and real processes; no fakes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.sessions.live import (
    CONTROL,
    EVENTS,
    EVENTS_OLD,
    ControlReader,
    EventLogReader,
    EventLogWriter,
    RunnerLock,
    runner_state,
    send_command,
)

# the --fast lane leaves this module out: 7 tests, ~8 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def test_the_lock_is_held_while_the_runner_lives_and_dropped_when_it_is_killed(tmp_path: Path) -> None:
    # the child holds the lock until it is killed (it blocks reading its stdin: closed on the way out, that ends it)
    code = ("import sys; from pathlib import Path; from servescope.sessions.live import RunnerLock; "
            "RunnerLock.acquire(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()")
    t0 = time.time()
    with subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as p:
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "held"
            st = runner_state(tmp_path)
            # the heartbeat is the lock's, taken since the child started (however slowly it started)
            assert st.running and st.pid == p.pid and st.heartbeat_age_s is not None
            assert st.heartbeat_age_s <= time.time() - t0 + 1, (st.heartbeat_age_s, time.time() - t0)
            with pytest.raises(ServescopeError) as e:
                RunnerLock.acquire(tmp_path)  # a second runner is refused, in one line that says how to attach
            assert f"pid {p.pid}" in e.value.message and "servescope attach" in e.value.message
            assert "\n" not in e.value.message
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            st = runner_state(tmp_path)
            assert not st.running and f"pid {p.pid}" in st.reason and "gone" in st.reason
            RunnerLock.acquire(tmp_path).release()  # the dead runner's lock is free again
        finally:
            if p.poll() is None:
                p.kill()


def test_a_stale_heartbeat_is_said(tmp_path: Path) -> None:
    lock = RunnerLock.acquire(tmp_path)
    try:
        old = time.time() - 600
        os.utime(tmp_path / "runner.lock", (old, old))
        st = runner_state(tmp_path)
        assert st.running and "no heartbeat for 600 s" in st.reason
        lock.heartbeat()
        assert runner_state(tmp_path).reason == ""
    finally:
        lock.release()


def test_no_lock_reads_as_not_running(tmp_path: Path) -> None:
    st = runner_state(tmp_path)
    assert not st.running and st.pid is None and "no lock" in st.reason


def test_a_reader_follows_the_log_across_rotations_each_item_once(tmp_path: Path) -> None:
    w = EventLogWriter(tmp_path, max_bytes=4000)
    r = EventLogReader(tmp_path)
    got: list[tuple[str, dict[str, object]]] = []
    w.write("SweepStarted", {"cells": [1, 2, 3]})
    w.flush()
    got += r.poll()
    for cell in range(3):
        w.write("CellStarted", {"cell": cell})
        for i in range(30):
            w.write("RequestsMeasured", {"cell": cell, "i": i, "pad": "x" * 60})
            w.flush()
            if i % 7 == 0:
                got += r.poll()
        w.write("CellFinished", {"cell": cell})
        w.flush(sync=True)
    w.write("SweepFinished", {"status": "completed"})
    w.close()
    for _ in range(5):
        got += r.poll()
    assert (tmp_path / EVENTS_OLD).exists()  # it rotated
    assert (tmp_path / EVENTS).stat().st_size < 4000 + 3000  # bounded: a snapshot plus what came after
    kinds = [k for k, _ in got]
    assert kinds.count("CellFinished") == 3 and kinds.count("SweepStarted") == 1 and kinds[-1] == "SweepFinished"
    batches = [(f["cell"], f["i"]) for k, f in got if k == "RequestsMeasured"]
    assert batches == [(c, i) for c in range(3) for i in range(30)]  # every batch, once, in order


def test_a_late_reader_rebuilds_the_sweep_from_the_rotated_log_alone(tmp_path: Path) -> None:
    w = EventLogWriter(tmp_path, max_bytes=3000)
    w.write("SweepStarted", {"cells": [0, 1]})
    w.write("CellStarted", {"cell": 0})
    for i in range(40):
        w.write("RequestsMeasured", {"cell": 0, "i": i, "pad": "x" * 60})
        w.flush()
    w.write("CellFinished", {"cell": 0})
    w.write("CellStarted", {"cell": 1})
    for i in range(40):
        w.write("RequestsMeasured", {"cell": 1, "i": i, "pad": "x" * 60})
        w.write("TelemetryUpdated", {"n": i})
        w.flush()
    w.close()
    (tmp_path / EVENTS_OLD).unlink()  # only the current file is read
    got = EventLogReader(tmp_path).poll()
    kinds = [k for k, _ in got]
    assert kinds[:3] == ["SweepStarted", "CellStarted", "CellFinished"]  # the snapshot keeps the whole sweep
    assert "TelemetryUpdated" in kinds
    running = [f["i"] for k, f in got if k == "RequestsMeasured" and f["cell"] == 1]
    assert running and running == sorted(running) and running[-1] == 39  # the running cell's batches


def test_a_resumed_writer_goes_on_numbering_and_a_cut_line_is_skipped(tmp_path: Path) -> None:
    w = EventLogWriter(tmp_path)
    w.write("SweepStarted", {"cells": []})
    w.close()
    with open(tmp_path / EVENTS, "a") as f:
        f.write('{"seq": 2, "kind": "Cell')  # a crash mid-line
        f.write("\n")
    w = EventLogWriter(tmp_path)
    w.write("SweepFinished", {"status": "completed"})
    w.close()
    got = EventLogReader(tmp_path).poll()
    assert [k for k, _ in got] == ["SweepStarted", "SweepFinished"]
    last = json.loads((tmp_path / EVENTS).read_text().splitlines()[-1])
    assert last["seq"] == 2


def test_the_control_file_gives_each_command_once_and_ignores_old_ones(tmp_path: Path) -> None:
    send_command(tmp_path, "stop")  # written before the runner started: not for it
    c = ControlReader(tmp_path)
    assert c.poll() == []
    send_command(tmp_path, "skip", 3)
    send_command(tmp_path, "stop")
    got = c.poll()
    assert [(x.cmd, x.cell) for x in got] == [("skip", 3), ("stop", None)]
    assert c.poll() == []
    with open(tmp_path / CONTROL, "a") as f:
        f.write('{"cmd": "rm -rf"}\n{"cmd": "sk')  # unknown, and half a line: neither is obeyed now
    assert c.poll() == []
    with open(tmp_path / CONTROL, "a") as f:
        f.write('ip", "cell": 1}\n')
    assert [x.cmd for x in c.poll()] == ["skip"]
    with pytest.raises(ValueError):
        send_command(tmp_path, "delete")


def test_a_reader_behind_by_two_rotations_still_gets_every_item(tmp_path: Path) -> None:
    w = EventLogWriter(tmp_path, max_bytes=4000)
    r = EventLogReader(tmp_path)
    w.write("CellStarted", {"cell": 0})
    w.flush()
    got = r.poll()  # the reader holds the first file
    rotations, n, ino = 0, 0, (tmp_path / EVENTS).stat().st_ino
    while rotations < 2 or n % 5:  # two rotations (and a few items more) before the reader looks again
        w.write("RequestsMeasured", {"cell": 0, "i": n, "pad": "x" * 60})
        w.flush()
        n += 1
        now = (tmp_path / EVENTS).stat().st_ino
        rotations, ino = rotations + (now != ino), now
    w.close()
    for _ in range(6):
        got += r.poll()
    assert [f["i"] for k, f in got if k == "RequestsMeasured"] == list(range(n))


# ---- issue 32, item 7: `watch` of a session whose event log is garbage ------------------------------------------
@pytest.mark.parametrize("status", ["completed", "failed", "running"])
def test_watch_trusts_session_toml_over_a_garbage_log_and_says_the_log_is_damaged(tmp_path: Path,
                                                                                   status: str) -> None:
    """A garbage events.jsonl made `watch` of a completed session advise `resume`."""
    import argparse
    import io

    from servescope.cli.detach import watch_command
    from tests.sessions.conftest import build_session, gptq_spec

    s = build_session(tmp_path / "sessions", gptq_spec())
    toml = s / "session.toml"
    toml.write_text(toml.read_text().replace('status = "completed"', f'status = "{status}"', 1))
    (s / EVENTS).write_bytes(b"\x00garbage\n{not json}\n" + os.urandom(200).replace(b"\n", b" ") + b"\n")
    out = io.StringIO()
    rc = watch_command(argparse.Namespace(session=str(s), sessions_dir=None), out=out, poll_s=0.01)
    last = out.getvalue().splitlines()[-1]
    assert f"its event log {s / EVENTS} is damaged (3 unreadable lines)" in last, last
    if status == "completed":
        assert rc == 0 and last.startswith(f"sweep completed; session {s}") and "resume" not in last
    elif status == "failed":
        assert rc == 1 and last.startswith("sweep failed") and "resume" not in last
    else:  # running without a runner: interrupted, and resume is the advice
        assert rc == 1 and last.startswith("the sweep is not running") and f"servescope resume {s}" in last
