"""The app on a running `servescope tune`: the tune holds its session's runner lock and rewrites its [tune] table
as it goes (the path so far, the best so far, the cell being measured); the session screen follows it live and
switches to the answer when the search ends; `servescope attach` opens a tune session on that view; `watch`
says in one line that it follows sweeps and gives the attach command."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from servescope.__main__ import main
from servescope.core.errors import ServescopeError
from servescope.sessions.meta import SessionMeta, TuneBest
from servescope.sessions.store import SessionWriter
from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen

from .helpers import poll_until, text_of, wait_until

# the --fast lane leaves this module out: 5 tests, ~42 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# long enough answers that a cell takes a few seconds on the tiny simulator: the view can see one running
SLOW = '[workload]\nname = "s32"\ninput_tokens = 128\noutput_tokens = 256\n'
def _tune_argv(home: Path) -> list[str]:
    wl = home / "s32.toml"
    wl.write_text(SLOW)
    return ["tune", "--url", "sim://tiny", "-w", str(wl), "-c", "2..16", "-n", "8", "--budget", "4"]


@pytest.fixture
def tune_proc(home: Path) -> Iterator[subprocess.Popen[str]]:
    """A real `servescope tune` against the simulator, SERVESCOPE_HOME in tmp."""
    p = subprocess.Popen([sys.executable, "-m", "servescope", *_tune_argv(home)], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    yield p
    if p.poll() is None:
        p.kill()
    p.communicate(timeout=30)


def _tune_dir(home: Path) -> Path | None:
    found = sorted((home / "sessions").glob("*-tune-*/session.toml")) if (home / "sessions").is_dir() else []
    return found[0].parent if found else None


def _summary(scr: SessionScreen) -> str:
    return text_of(scr.query_one("#tune-summary", Static))


def _running(scr: SessionScreen) -> str:
    w = scr.query_one("#tune-running", Static)
    return text_of(w) if w.display else ""


async def test_the_app_follows_a_running_tune_until_its_answer(home: Path, tune_proc: subprocess.Popen[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SessionScreen, "TUNE_POLL_S", 0.25)  # the same checks, more often: the cells are short
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: _tune_dir(home) is not None, 60, "the tune's session")
        path = _tune_dir(home)
        assert path is not None
        await pilot.press("f4")
        lst = app.screen
        assert isinstance(lst, SessionsScreen)
        lst.action_refresh()
        assert lst.rows[str(path)][3] == "running"  # the sessions list: a live tune is running
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionScreen), 10, "the tune view")
        scr = app.screen
        assert isinstance(scr, SessionScreen) and scr.tune_live
        table = scr.query_one("#tune-path", DataTable)
        # live: a measured step in the path while the next cell is measured, its requests counted
        await wait_until(pilot, lambda: table.row_count >= 1 and scr.tune_live and "requests done" in _running(scr),
                         60, "a path row and the running cell's requests while the tune runs")
        assert "searching: step" in _summary(scr) and "of budget 4" in _summary(scr)
        assert "best so far:" in _summary(scr) and "req/s" in _summary(scr)
        assert _running(scr).startswith("measuring c=")
        assert scr.check_action("attach_cell", ()) is True
        # the end: the answer on the same screen, without reopening it
        await wait_until(pilot, lambda: "best:" in _summary(scr), 90, "the tune's answer")
        assert not scr.tune_live and _running(scr) == ""
        assert "cells:" in _summary(scr) and "searching" not in _summary(scr)
        assert "[completed]" in text_of(scr.query_one("#session-head", Static))
        meta = tomllib.loads((path / "session.toml").read_text())
        assert table.row_count == len(meta["tune"]["path"])
        assert scr.check_action("attach_cell", ()) is False
    assert tune_proc.wait(timeout=60) == 0


def test_the_tune_table_is_written_after_each_step_and_ends_without_running(home: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write of session.toml during a real (in-process) tune, as the session's [tune] table then stood."""
    seen: list[SessionMeta] = []
    save = SessionWriter.save_meta

    def record(self: SessionWriter) -> None:
        save(self)
        if self.meta.kind == "tune":
            seen.append(self.meta)  # frozen: each write's table as it stood

    monkeypatch.setattr(SessionWriter, "save_meta", record)
    argv = _tune_argv(home)
    argv[argv.index("-n") + 1] = "4"
    (home / "s32.toml").write_text(SLOW.replace("256", "16"))
    assert main(argv) == 0
    tables = [m.tune for m in seen if m.tune is not None]
    final = tables[-1]
    assert final.stop and final.seconds is not None and final.best is not None and final.predicted
    assert final.running is None and seen[-1].status == "completed"
    path = final.path
    assert path
    # when a cell starts: the path before it and the cell running, its folder under the session
    starts = [t for t in tables if t.running is not None]
    assert len(starts) == len(path)
    for k, t in enumerate(starts):
        run = t.running
        assert run is not None and t.path == path[:k] and run.step == k + 1
        assert run.concurrency == path[k].concurrency and run.cell == path[k].cell
        assert t.budget == 4 and t.grid_cells == 4 and t.unit == "req/s"
    # after the first step: that step in the path (same rows as the final table), no cell running, its best
    after = next(t for t in tables if t.running is None and len(t.path) == 1)
    assert after.path == path[:1]
    assert after.best == TuneBest(server_args="", concurrency=path[0].concurrency, objective=path[0].objective)
    assert after.partial  # a table written while the search ran
    # the last table written before the final one: its best so far is the answer's (a cell measured again: its mean)
    last = [t for t in tables if t.partial][-1]
    assert last.path == path and last.best is not None
    assert (last.best.server_args, last.best.concurrency) == (final.best.server_args, final.best.concurrency)
    assert last.best.objective == pytest.approx(final.best.objective, rel=1e-5)


async def test_attach_opens_a_tune_session_on_its_tune_view(home: Path) -> None:
    from tests.sessions.tune_synth import write_tune_session

    path = write_tune_session(home / "sessions" / "20261207-012837-tune-short")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), attach=path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, SessionScreen), 10, "the tune view")
        scr = app.screen
        assert isinstance(scr, SessionScreen) and not scr.tune_live
        assert "best: --max-num-seqs 32 at c=8" in _summary(scr)
        assert scr.query_one("#tune-path", DataTable).row_count == 5
        assert app.sweep_worker is None  # no Run screen following an event log the tune does not have


def test_watch_on_a_tune_session_gives_the_attach_command(home: Path) -> None:
    from servescope.cli.detach import pick_session, watch_command
    from tests.sessions.tune_synth import write_tune_session

    path = write_tune_session(home / "sessions" / "20261207-012837-tune-short")
    assert pick_session(str(path), None) == path
    with pytest.raises(ServescopeError) as e:
        watch_command(argparse.Namespace(session=str(path), sessions_dir=None))
    assert e.value.message == (f"{path.name} is a tune session: watch follows sweeps; follow the search (its path, "
                               f"best so far and the running cell) with servescope attach {path}")


def test_a_killed_tune_reads_as_dead_in_one_line(home: Path, tune_proc: subprocess.Popen[str]) -> None:
    """kill -9 mid-search: the lock goes with the process; the view says the runner is gone, in one line."""
    from servescope.sessions.live import runner_state

    poll_until(lambda: (d := _tune_dir(home)) is not None and "[[tune.path]]" in (d / "session.toml").read_text(),
               60, "a measured step")
    path = _tune_dir(home)
    assert path is not None and runner_state(path).running
    tune_proc.kill()
    tune_proc.wait(timeout=30)
    poll_until(lambda: not runner_state(path).running, 10, "the lock to go")
    scr = SessionScreen(path)
    assert not scr.tune_live and scr.session.status == "interrupted"
    lines, running = scr._tune_lines()
    assert len(lines) == 1 and running == ""
    assert lines[0].startswith("the search did not finish: its runner (pid ")
    assert "is gone: it ended without finishing (killed, or its machine restarted); " in lines[0]
    assert " of budget 4 cells measured (4 in the grid)" in lines[0]
    assert "best so far:" in lines[0]
