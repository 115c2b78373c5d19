"""Production-like workloads in the app: the new-workload form's kind and the fields each kind takes (a trace file
with its live preview, or the line that says what is wrong with it), saved as TOML the CLI reads; the Compose
list and preview for trace and conversation workloads; the Run screen's TTFT by turn for a conversation cell,
checked against the saved session's per-turn summary (and shown by the session screen); a trace cell's send
lateness; old event logs without per-turn data still load."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Select, SelectionList, Static

from servescope.core.results import CellResult
from servescope.engine import wire as w
from servescope.engine.spec import SweepSpec
from servescope.sessions.store import load_session
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.compose import ComposeScreen, rough_cell_s
from servescope.tui.screens.run import RunScreen, lateness_text
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.screens.workloadform import KIND_FIELDS, WorkloadFormScreen
from servescope.tui.widgets import EventLog, LatencyHistogram, SweepProgress, TurnChart
from servescope.tui.widgets.turns import live_turn_rows
from servescope.workloads.spec import Workload, fixed, load_toml
from servescope.workloads.traces import cached_trace

from .helpers import set_input, text_of, wait_until

# the --fast lane leaves this module out: 7 tests, ~15 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)
MOONCAKE = "".join(f'{{"timestamp": {t}, "input_length": {i}, "output_length": {o}, "hash_ids": {h}}}\n' for t, i, o, h in (
    (0, 612, 16, [1, 2]), (120, 1100, 32, [1, 2, 3]), (900, 300, 8, [4]), (2500, 700, 16, [1, 2])))
# each kind's fields, by their input/select ids (the form's rows are shown only for the kinds that take them)
FIELD_IDS = {"api": "wf-api", "in": "wf-in", "out": "wf-out", "prefix": "wf-prefix", "think": "wf-think",
             "turns": "wf-turns", "pause": "wf-pause", "context": "wf-context", "calls": "wf-calls",
             "tool": "wf-tool", "trace": "wf-trace", "format": "wf-format", "scale": "wf-scale"}


def prompt_of(sl: SelectionList[Any], key: str) -> str:
    """The label the workloads list shows for a selection value."""
    opts = [sl.get_option_at_index(i) for i in range(sl.option_count)]
    return next(str(o.prompt) for o in opts if getattr(o, "value", None) == key)


def err(app: Any, fid: str) -> str:
    return text_of(app.screen.query_one(f"#{fid}-error", Static))


async def _form(pilot: Any, kind: str) -> WorkloadFormScreen:
    await pilot.press("ctrl+n")
    await pilot.pause()
    form = pilot.app.screen
    assert isinstance(form, WorkloadFormScreen)
    form.query_one("#wf-kind", Select).value = kind
    await pilot.pause()
    return form


async def test_the_form_shows_each_kinds_fields_and_only_those(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=(80, 24)) as pilot:
        form = await _form(pilot, "single")
        for kind, fields in KIND_FIELDS.items():
            form.query_one("#wf-kind", Select).value = kind
            await pilot.pause()
            for key, fid in FIELD_IDS.items():
                w = form.query_one(f"#{fid}")
                shown = all(a.display for a in w.ancestors_with_self if a is not form)
                assert shown == (key in fields), (kind, key)
        # a conversation's input is each turn's new user message
        form.query_one("#wf-kind", Select).value = "conversation"
        await pilot.pause()
        assert "user tokens" in text_of(form.query_one("#wf-in", Input).parent.query_one("Label"))  # type: ignore[union-attr]


async def test_a_conversation_workload_is_saved_with_errors_under_their_fields(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=(80, 24)) as pilot:
        await _form(pilot, "conversation")
        await set_input(pilot, "#wf-name", "chat8")
        await set_input(pilot, "#wf-turns", "8-3")
        await set_input(pilot, "#wf-pause", "x")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "turns" in err(app, "wf-turns") and "3-8" in err(app, "wf-turns")
        assert "seconds like 0, 2 or a range like 1-5" in err(app, "wf-pause")
        assert app.screen.query_one("#wf-turns-error", Static).display  # shown, not only set
        await set_input(pilot, "#wf-turns", "3-8")
        await set_input(pilot, "#wf-pause", "1-5")
        await set_input(pilot, "#wf-in", "200-500")
        await set_input(pilot, "#wf-prefix", "128")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ComposeScreen), err(app, "wf")
        path = home / "workloads" / "chat8.toml"
        raw = tomllib.loads(path.read_text())["workload"]
        assert raw["kind"] == "conversation" and raw["api"] == "chat"
        assert raw["turns"] == {"dist": "uniform", "min": 3, "max": 8}
        assert raw["think_time_s"] == {"dist": "uniform", "min": 1.0, "max": 5.0}
        (w,) = load_toml(path)  # what `servescope run -w chat8.toml` reads
        assert w.kind == "conversation" and w.turns.max == 8 and w.prefix_tokens == 128
        sl = app.screen.query_one("#workloads", SelectionList)
        key = next(k for k in sl.selected if k.endswith("#chat8"))
        label = prompt_of(sl, key)
        assert "conversation: 3-8 turns x in 200-500 / out 256, think 1-5 s, prefix 128" in label
        assert "(turns)" in text_of(app.screen.query_one("#preview", Static))  # a conversation's requests are turns


async def test_a_trace_workload_previews_its_file_and_saves_it(home: Path) -> None:
    good, bad = home / "mc.jsonl", home / "bad.jsonl"
    good.write_text(MOONCAKE)
    bad.write_text(MOONCAKE.splitlines()[0] + "\nnot json\n")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=(80, 24)) as pilot:
        form = await _form(pilot, "trace")
        preview = form.query_one("#wf-trace-preview", Static)
        form.query_one("#wf-trace", Input).value = str(bad)
        await wait_until(pilot, lambda: text_of(preview).startswith("✗"), 60, "the bad file's line")
        assert f"{bad}:2: not JSON" in text_of(preview)
        form.query_one("#wf-trace", Input).value = str(good)
        want = cached_trace(good).preview()
        await wait_until(pilot, lambda: want in text_of(preview), 60, "the trace preview")
        shown = text_of(preview)
        assert shown.startswith("✓ mooncake: 4 requests over 2.5 s") and "input p50 612 / p99 1,100" in shown
        assert "shared" in shown
        await set_input(pilot, "#wf-scale", "0.5")  # the preview follows the time scale: twice as fast
        await wait_until(pilot, lambda: "at x0.5 time" in text_of(preview), 60, "the scaled preview")
        assert "over 1.25 s" in text_of(preview)
        await set_input(pilot, "#wf-scale", "0")
        await set_input(pilot, "#wf-name", "replay")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "above 0" in err(app, "wf-scale")
        await set_input(pilot, "#wf-scale", "2")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ComposeScreen), err(app, "wf")
        raw = tomllib.loads((home / "workloads" / "replay.toml").read_text())["workload"]
        assert raw["kind"] == "trace" and raw["trace"] == str(good.resolve()) and raw["time_scale"] == 2.0
        assert "input_tokens" not in raw
        sl = app.screen.query_one("#workloads", SelectionList)
        key = next(k for k in sl.selected if k.endswith("#replay"))
        assert "trace mc.jsonl (mooncake x2 time): 4 requests over 5 s" in prompt_of(sl, key)
        sl.deselect("preset:sharegpt")
        await pilot.pause()
        text = text_of(app.screen.query_one("#preview", Static))
        # one cell at the trace's own times (scaled): about its 5 s, whatever the load levels say
        assert "1 trace replay = 1 cells, 4 requests, ~5 s" in text, text


def test_rough_durations_of_trace_and_conversation_cells(tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text(MOONCAKE)
    w = Workload("r", "chat", kind="trace", trace=str(trace), time_scale=2.0)
    times = tuple(r.t_s for r in cached_trace(trace).scaled(2.0).requests)
    assert 5.0 <= rough_cell_s(w, None, 1.6, 4, None, 0, 20.0, times) < 6.0  # 2.5 s x 2, plus the last request
    assert 0.7 <= rough_cell_s(w, None, 1.6, 2, None, 0, 20.0, times) < 1.0  # the first two: sent by 0.24 s
    conv = Workload("c", "chat", fixed(100), fixed(50), kind="conversation", turns=fixed(5))
    # 20 turns over 2 users, one after another: 10 x one turn's time (100/5000 s + 50 x 20 ms)
    assert rough_cell_s(conv, 2, None, 20, None, 0, 20.0) == pytest.approx(10 * (0.02 + 1.0))
    # at 1 conversation/s: 20 turns = 4 conversations started over 4 s, the last one 5 turns long
    assert rough_cell_s(conv, None, 1.0, 20, None, 0, 20.0) == pytest.approx(4 + 5 * 1.02)


def test_turn_rows_from_a_batch() -> None:
    rows = live_turn_rows([1, 2, 1, 0, 2], [10.0, 5.0, 30.0, 99.0, 7.0],
                          [[0, 100], [80, 200], [None, 120], [0, 50], [150, 200]])
    assert [r.turn for r in rows] == [1, 2]  # the single-turn request (turn 0) is left out
    assert rows[0].p50 == 20.0 and rows[0].ok == 2 and rows[0].input_tokens == 110.0
    assert rows[0].cached == 0.0  # of the requests whose usage said: 0 of 100
    assert rows[1].cached == pytest.approx(230 / 400) and rows[1].p50 == 6.0


def test_an_old_event_log_item_without_turns_still_loads() -> None:
    from servescope.tui.wire import decode_item

    cell = {"index": 0, "workload": "w", "load_label": "c=1", "concurrency": 1, "rate": None, "requests": 4,
            "duration_s": None}
    item = decode_item("RequestsMeasured", {"cell": cell, "ttft_ms": [1.0, 2.0], "tpot_ms": [], "e2e_ms": [],
                                            "per_user_tok_s": [], "output_tokens": 3, "done": 2, "failed": 0,
                                            "elapsed_s": 1.0, "errors": []})
    assert item is not None
    msg = m.message(item)
    assert isinstance(msg, m.RequestsMeasured) and msg.turns == [] and msg.cached == []


CONV = Workload("conv", "chat", fixed(48), fixed(8), kind="conversation", turns=fixed(3), source="inline")


async def test_ttft_by_turn_live_matches_the_saved_per_turn_summary(home: Path, sim_url: str) -> None:
    sessions = home / "sessions"
    app = make_app(url=sim_url, sessions_dir=str(sessions))
    spec = SweepSpec(url=sim_url, workloads=(CONV,), concurrency=(2,), requests=12, name="conv",
                     telemetry_interval_s=None).check("test")
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.start_sweep(spec)
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 60, "the Run screen")
        run = app.screen
        assert isinstance(run, RunScreen)
        progress = run.query_one(SweepProgress)
        await wait_until(pilot, lambda: progress.state in ("completed", "failed"), 60, "the sweep to end")
        assert progress.state == "completed", [ln.text for ln in run.query_one(EventLog).lines]
        run.flush_charts()
        await pilot.pause()
        chart = run.query_one(TurnChart)
        assert chart.display and not run.query_one("#hist-e2e", LatencyHistogram).display  # in E2E's place
        assert chart.lines(70, 8)[0].plain == "TTFT p50 by turn (in E2E's place)"
        live = chart.rows
        assert run.session_dir is not None
        (summary,) = [s for s in load_session(run.session_dir).summaries() if s is not None]
        assert [t.turn for t in summary.turns] == [r.turn for r in live] == [1, 2, 3]
        for t, r in zip(summary.turns, live, strict=True):
            assert r.ok == t.requests_ok
            assert r.p50 == pytest.approx(t.ttft_ms_p50) and r.p90 == pytest.approx(t.ttft_ms_p90)
            assert r.input_tokens == pytest.approx(t.input_tokens_mean)
            assert t.prefix_cache_hit_rate is not None and r.cached == pytest.approx(t.prefix_cache_hit_rate)
        assert (live[2].cached or 0) > (live[0].cached or 0)  # later turns resend a cached history
        drawn = "\n".join(ln.plain for ln in chart.lines(38, 5))
        assert f"{live[1].p50:.1f} ms" in drawn and f"n={live[1].ok}" in drawn and "cached" in drawn

        # the saved session shows the same figures for that cell
        scr = SessionScreen(run.session_dir)
        await app.push_screen(scr)
        await pilot.pause()
        turns = scr.query_one("#s-turns", TurnChart)
        assert turns.display and not scr.query_one("#s-hist-e2e", LatencyHistogram).display
        assert [(r.turn, r.ok, r.p50, r.p90) for r in turns.rows] == [
            (t.turn, t.requests_ok, t.ttft_ms_p50, t.ttft_ms_p90) for t in summary.turns]


async def test_a_trace_cell_says_how_late_its_sends_were(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        cell = m.CellInfo(0, "replay", "1.6/s", None, 1.6, 4, None, "trace mc.jsonl (mooncake; chat)")
        run.reset("replay")
        run.post_message(m.CellStarted(w.CellStarted(cell, 1)))
        summary = CellResult.from_dict({"requests_ok": 4, "client_queue_ms": {"p50": 0.4, "p99": 12.5, "max": 13.0}})
        run.post_message(m.CellFinished(w.CellFinished(cell, summary, "done")))
        await pilot.pause()
        log = " ".join(" ".join(ln.text for ln in run.query_one(EventLog).lines).split())
        assert "sent late vs trace p50 0.40 ms, p99 12.50 ms, max 13.00 ms" in log
        assert "the client did not keep the trace's times" in log
        # the first line says it in the trace's shape's place
        assert run.query_one(SweepProgress).shape == "sent late vs trace p99 12.50 ms (behind the trace)"
    assert "within 10 ms" in lateness_text(CellResult.from_dict({"client_queue_ms": {"p50": 0.1, "p99": 2.0, "max": 3.0}}))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_the_turn_chart_takes_e2es_place_and_reads_at_both_sizes(home: Path, size: tuple[int, int]) -> None:
    """A conversation cell's TTFT by turn replaces the E2E histogram (its title says so), every line within the
    pane; the next single-turn cell has its E2E histogram back."""
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    conv = m.CellInfo(0, "chat5", "c=4", 4, None, 60, None, "5 turns x in 200-500 (uniform) new / out 256, think 0 s "
                                                             "(conversation)")
    single = m.CellInfo(1, "sharegpt", "c=4", 4, None, 60, None, "in 200-512 (uniform) / out 256 (chat)")
    turns = [t for t in range(1, 6) for _ in range(4)]
    ttft = [30.0 + 10 * t + i for i, t in enumerate(turns)]
    cached = [[0 if t == 1 else 100 * t, 300 * t] for t in turns]
    async with app.run_test(size=size) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", [conv, single], "sim://tiny", "tiny", None, "t", True)))
        run.post_message(m.CellStarted(w.CellStarted(conv, 2)))
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(conv, ttft, ttft, ttft, [1.0] * 20, 100, 20, 0, 2.0, [], turns, cached)))
        await pilot.pause()
        run.flush_charts()
        await pilot.pause()
        chart = run.query_one(TurnChart)
        e2e = run.query_one("#hist-e2e", LatencyHistogram)
        assert chart.display and not e2e.display
        lines = [ln.plain for ln in chart.lines(chart.content_size.width, chart.content_size.height)]
        assert lines[0].startswith("TTFT p50 by turn (in E2E's place)")
        assert all(len(ln) <= chart.content_size.width for ln in lines)
        # turn 2: TTFTs 54..57 -> p50 55.5 ms, 4 requests, 200 of 600 prompt tokens cached
        row2 = next(ln for ln in lines if ln.startswith(("turn 2", "t2")))
        assert "55.5 ms" in row2 and "n=4" in row2 and "33% cached" in row2
        if size[1] >= 48:
            assert len(lines) == 6 and "p90" in row2  # every turn, and p90 with room for it
        else:
            assert lines[-1].startswith("… turn")  # the rest is a zoom away
        run.post_message(m.CellFinished(w.CellFinished(conv, CellResult(requests_ok=20), "done")))
        run.post_message(m.CellStarted(w.CellStarted(single, 2)))
        await pilot.pause()
        assert e2e.display and not chart.display
