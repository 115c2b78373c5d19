"""Pilot tests of each flow: probe a target, compose (and reject bad input), save/load a sweep, make a
workload, run a sweep against sim://tiny, see its cells finish and the session saved, open it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, SelectionList, Static

from servescope.sessions.store import load_session
from servescope.tui.app import make_app
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen
from servescope.tui.widgets import CellTable, EventLog, LatencyHistogram, SweepProgress
from tests.support.meta import stored

from .helpers import cell_status, row_text, set_input, text_of, wait_until

# the --fast lane leaves this module out: 6 tests, ~12 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)


def err(app: object, fid: str) -> str:
    return text_of(app.screen.query_one(f"#{fid}-error", Static))  # type: ignore[attr-defined]


async def test_probe_shows_models_version_and_metrics(home: Path, sim_url: str) -> None:
    app = make_app(url=sim_url, sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        res = app.screen.query_one("#probe-result", Static)
        await wait_until(pilot, lambda: text_of(res).startswith(("✓", "✗")), 60, "the probe")
        out = text_of(res)
        assert "model tiny" in out and "max length 8192" in out
        assert "vLLM 0.32.0-sim" in out and "/metrics: yes" in out


async def test_probe_shows_a_markup_like_model_name_as_served(home: Path) -> None:
    from servescope.sim.launcher import start_sim

    with start_sim("tiny", ["--served-model-name", "[/x] m|1"]) as sim:
        app = make_app(url=sim.url, sessions_dir=str(home / "sessions"))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f5")
            res = app.screen.query_one("#probe-result", Static)
            await wait_until(pilot, lambda: text_of(res).startswith(("✓", "✗")), 60, "the probe")
            assert "model [/x] m|1" in text_of(res)


async def test_unreachable_url_is_shown_next_to_the_field(home: Path) -> None:
    app = make_app(url="http://127.0.0.1:9", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        res = app.screen.query_one("#probe-result", Static)
        await wait_until(pilot, lambda: text_of(res).startswith(("✓", "✗")), 60, "the probe")
        assert "cannot connect" in err(app, "url")
        assert app.is_running


@pytest.mark.slow  # 7 s of the --fast lane on 2 cores
async def test_bad_input_is_shown_next_to_its_field_and_blocks_the_run(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "1,x,4")
        assert "'x'" in err(app, "concurrency")
        assert "fix: concurrency" in text_of(app.screen.query_one("#preview", Static))
        await set_input(pilot, "#slos", "ttft=3")
        assert "bad SLO" in err(app, "slos")
        await set_input(pilot, "#tags", "quant")
        assert "KEY=VALUE" in err(app, "tags")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.sweep_worker is None and isinstance(app.screen, ComposeScreen)
        await set_input(pilot, "#concurrency", "1,2,4")
        await set_input(pilot, "#slos", "ttft_ms=3000")
        await set_input(pilot, "#tags", "quant=FP8")
        assert err(app, "concurrency") == ""
        assert "3 cells" in text_of(app.screen.query_one("#preview", Static))
        await pilot.press("f6")
        await set_input(pilot, "#url", "localhost:8000")
        assert "bad URL" in err(app, "url")


@pytest.mark.slow  # 5 s of the --fast lane on 2 cores
async def test_sweep_toml_save_load_and_parse_errors(home: Path) -> None:
    (home / "bad.toml").write_text("[load\nconcurrency = [1]\n")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "2,8")
        await set_input(pilot, "#tags", "quant=FP8")
        await set_input(pilot, "#sweep-file", "my-sweep.toml")
        await pilot.press("ctrl+s", "enter")  # ctrl+s asks where, offering the field's file: enter saves there
        await pilot.pause()
        saved = (home / "my-sweep.toml").read_text()
        assert "concurrency = [\n    2,\n    8,\n]" in saved or "concurrency = [2, 8]" in saved
        assert 'quant = "FP8"' in saved and "sharegpt" in saved
        await set_input(pilot, "#concurrency", "64")
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert app.screen.query_one("#concurrency", Input).value == "2,8"
        await set_input(pilot, "#sweep-file", "bad.toml")
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert "bad.toml:1:" in err(app, "sweep-file") and "TOML error" in err(app, "sweep-file")
        assert app.is_running


async def test_new_workload_form_saves_toml_and_selects_it(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+n")
        await pilot.pause()
        await set_input(pilot, "#wf-name", "rag 4k")
        await set_input(pilot, "#wf-in", "1000-x")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "range like 200-512" in err(app, "wf-in")
        await set_input(pilot, "#wf-in", "4096")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert (home / "workloads" / "rag-4k.toml").is_file()
        assert isinstance(app.screen, ComposeScreen)
        sel = app.screen.query_one("#workloads", SelectionList).selected
        assert any(k.endswith("#rag 4k") for k in sel)


@pytest.mark.slow  # 6 s of the --fast lane on 2 cores
async def test_run_a_sweep_on_sim_tiny_then_open_the_session(home: Path) -> None:
    sessions = home / "sessions"
    app = make_app(url="sim://tiny", sessions_dir=str(sessions), workloads_dir=home / "workloads")
    async with app.run_test(size=(120, 40)) as pilot:
        # compose: the fast workload instead of sharegpt, two load levels, a few requests each
        await pilot.press("f7")
        sl = app.screen.query_one("#workloads", SelectionList)
        fast = next(k for k in app.screen.items if k.endswith("#fast"))  # type: ignore[attr-defined]
        sl.deselect("preset:sharegpt")
        sl.select(fast)
        await pilot.pause()
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "1,4")
        await set_input(pilot, "#requests", "8")
        await set_input(pilot, "#tags", "quant=FP8")
        assert "2 cells, 16 requests" in text_of(app.screen.query_one("#preview", Static))
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.sweep_worker is not None, 60, "the sweep to start")
        assert isinstance(app.screen, RunScreen)
        assert app.sweep_worker is not None
        await app.sweep_worker.wait()
        progress = app.screen.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.state == "completed", 60,
                         f"the completed message ({progress.state}, {[ln.text for ln in app.screen.query_one(EventLog).lines]})")
        run = app.screen
        table = run.query_one(CellTable)
        assert table.row_count == 2
        assert [cell_status(table, i) for i in range(2)] == ["done", "done"]
        assert run.query_one("#hist-e2e", LatencyHistogram).values  # the last cell's requests are drawn
        axis = str(run.query_one("#hist-ttft", LatencyHistogram).render()).split("\n")[-1]
        assert re.search(r"▲50|50▲|50,99", axis) and re.search(r"▲99|99▲|50,99", axis), axis  # p50 and p99 marked
        saved = [p for p in sessions.iterdir() if (p / "session.toml").is_file()]
        assert len(saved) == 1 and (saved[0] / "cells.parquet").is_file()
        # both cells on the curve, but for a cell whose client was the limit (a loaded machine can do that to c=1)
        verdicts = [s is not None and s.client_bound for s in load_session(saved[0]).summaries()]
        assert len(verdicts) == 2
        assert len(run._points.get("fast", [])) == verdicts.count(False)
        assert app.last_session == saved[0]
        assert "sim://tiny" in (saved[0] / "session.toml").read_text()

        # sessions: the new one is listed; enter opens it with its cells and histograms
        await pilot.press("f4")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        st = app.screen.query_one("#sessions", DataTable)
        assert st.row_count == 1
        row = row_text(st, 0)
        assert "sim://tiny" in row and "tiny" in row and "quant=FP8" in row and "2/2" in row and "completed" in row
        st.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen)
        assert app.screen.query_one(CellTable).row_count == 2
        await wait_until(pilot, lambda: bool(app.screen.query_one("#s-hist-ttft", LatencyHistogram).values), 60)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        # compare needs two marked sessions; with one it says so instead of failing
        await pilot.press("space", "c")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        assert len(app.screen.marked) == 1
        said = [str(n.message) for n in app._notifications]
        assert any("mark two or more sessions" in t for t in said), said


@pytest.mark.slow  # 5 s of the --fast lane on 2 cores
async def test_stop_keeps_finished_cells(home: Path, sim_url: str) -> None:
    sessions = home / "sessions"
    app = make_app(url=sim_url, sessions_dir=str(sessions), workloads_dir=home / "workloads")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "1,2,4")
        await set_input(pilot, "#requests", "24")  # cells of 20 s and more on sim://tiny: time to skip and stop
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.sweep_worker is not None, 60, "the sweep to start")
        progress = app.screen.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.done >= 1, 60, "a request to finish")
        await pilot.press("s")  # skip cell 1
        await wait_until(pilot, lambda: progress.cell_no == 2, 60, "cell 2")
        await pilot.press("x")  # stop the sweep
        assert app.sweep_worker is not None
        await app.sweep_worker.wait()
        await wait_until(pilot, lambda: progress.state == "interrupted", 60, "the interrupted message")
        table = app.screen.query_one(CellTable)
        assert table.row_count == 2 and [cell_status(table, i) for i in range(2)] == ["skipped", "stopped"]
        assert (next(sessions.iterdir()) / "cells.parquet").is_file()


async def test_help_lists_every_key(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4")
        await pilot.press("question_mark")
        await pilot.pause()
        text = text_of(app.screen.query_one("#help Static", Static))
        for needle in ("ctrl+r", "f5", "Skip", "Stop", "Compare", "ctrl+q", "?"):
            assert needle in text
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)


@pytest.mark.slow  # 23 s of the --fast lane on 2 cores
async def test_launch_a_server_with_variants_from_the_target_pane(home: Path) -> None:
    """The target pane's launch command: servescope starts the server for the sweep, once per variant."""
    import sys

    sessions = home / "sessions"
    app = make_app(url="sim://tiny", sessions_dir=str(sessions), workloads_dir=home / "workloads")
    async with app.run_test(size=(120, 40)) as pilot:
        await set_input(pilot, "#variants", "--max-num-seqs 1")
        assert "need a launch command" in err(app, "variants")
        await set_input(pilot, "#launch", "vllm run x")
        assert "vllm serve MODEL" in err(app, "launch")
        await set_input(pilot, "#launch", f"{sys.executable} -m servescope.sim --profile tiny --port 0")
        await set_input(pilot, "#variants", "--max-num-seqs 1 ; --max-num-seqs 4")
        assert err(app, "launch") == "" and err(app, "variants") == ""
        await set_input(pilot, "#url", "")  # ignored: the launched server's URL comes from its command
        assert err(app, "url") == ""
        await pilot.press("f5")
        assert "starts the server when the sweep runs" in text_of(app.screen.query_one("#probe-result", Static))
        await pilot.press("f7")
        sl = app.screen.query_one("#workloads", SelectionList)
        sl.deselect("preset:sharegpt")
        sl.select(next(k for k in app.screen.items if k.endswith("#fast")))  # type: ignore[attr-defined]
        await pilot.pause()
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "4")
        await set_input(pilot, "#requests", "4")
        pv = text_of(app.screen.query_one("#preview", Static))
        assert "1 workload x 1 load level x 2 server variants = 2 cells" in pv
        await set_input(pilot, "#sweep-file", str(home / "launch.toml"))
        await pilot.press("ctrl+s", "enter")  # ctrl+s asks where, offering the field's file: enter saves there
        await pilot.pause()
        assert "[server]" in (home / "launch.toml").read_text()
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.sweep_worker is not None, 60, "the sweep to start")
        assert app.sweep_worker is not None
        await app.sweep_worker.wait()
        progress = app.screen.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.state == "completed", 60,
                         f"the completed message ({progress.state}, {[ln.text for ln in app.screen.query_one(EventLog).lines]})")
        [saved] = [p for p in sessions.iterdir() if (p / "session.toml").is_file()]
        s = load_session(saved)
        assert s.cells.sort("index")["server_variant"].to_list() == ["--max-num-seqs 1", "--max-num-seqs 4"]
        # one curve per server variant (but for a cell whose client was the limit: it is left off the curve)
        curves = sorted(f"fast [{r['server_variant']}]" for r, c in zip(s.cells.to_dicts(), s.summaries(), strict=True)
                        if c is not None and not c.client_bound)
        assert sorted(app.screen._points) == curves  # type: ignore[attr-defined]
        assert (saved / "server-0.log").is_file() and (saved / "server-1.log").is_file()
        assert stored(s)["kv_budget"]["kv_cache_tokens"] > 0


async def test_repeat_in_the_load_pane(home: Path) -> None:
    """Compose's `repeat`: K runs of each cell (the preview counts them), a bad value next to its field."""
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "1,2,4")
        await set_input(pilot, "#repeat", "0")
        assert "repeat" in err(app, "repeat") or "at least 1" in err(app, "repeat"), err(app, "repeat")
        await set_input(pilot, "#repeat", "3")
        assert err(app, "repeat") == ""
        assert "9 cells" in text_of(app.screen.query_one("#preview", Static))
        spec = app.screen.collect()
        assert spec is not None and spec.repeat == 3
