"""A saved session's quality results in the app's session detail (F4, enter): a quality probe session shows its
figures instead of an empty sweep layout, a sweep holding quality results shows them on `q`, a damaged
quality.json is one line, and a finished session without cells never says it is `waiting for…`. Sessions are
written by the real SessionWriter; the probe's results are `QualityResult`s built by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servescope.core.quality import Divergence, QualityResult, TaskScore, wilson
from servescope.core.results import CellResult
from servescope.sessions.store import SessionWriter
from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.widgets.curve import ThroughputCurve
from servescope.tui.widgets.histogram import LatencyHistogram
from servescope.tui.widgets.panels import CellTable, ServerPanel
from servescope.tui.widgets.quality import QualityFigures, QualityPanel
from servescope.tui.widgets.table import FitTable
from tests.support.meta import meta_of, quality_settings

from .fixtures import summary_for, write_session
from .helpers import full_row, text_of

# the --fast lane leaves this module out: 10 tests, ~22 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SETTINGS = {"tasks": ["arithmetic", "retrieval"], "contexts": [1024, 16384], "n": 100, "top_k": 5, "seed": 0,
            "reference": "/data/sessions/bf16", "user_sets": []}


def ts(correct: int, n: int) -> TaskScore:
    lo, hi = wilson(correct, n)
    return TaskScore(accuracy=correct / n, n=n, correct=correct, lo=lo, hi=hi)


def probe(ppl: float | None = 6.3, kl: float | None = 0.012, **kw: Any) -> QualityResult:
    ref = None if kl is None else Divergence(kl_mean=kl, kl_p99=kl * 5, top1_agreement=0.97,
                                            first_divergence_mean=12.5, positions=256, prompts=8)
    return QualityResult(perplexity=ppl, perplexity_tokens=40960 if ppl is not None else 0,
                         tasks={"arithmetic": ts(19, 20), "retrieval@16K": ts(92, 100), "user[b]|x": ts(3, 4)},
                         reference=ref, reference_session="bf16" if ref is not None else None, **kw)


def quality_session(base: Path, dirname: str, res: QualityResult, name: str = "quality fp8") -> Path:
    """A session of kind quality, as `servescope quality` writes it: created without cells, quality.json, done."""
    w = SessionWriter.create(base / dirname, meta_of(**{"kind": "quality", "name": name, "model": "org/m[/x]",
                                              "target": {"url": "http://127.0.0.1:8000", "engine": "vllm"}}))
    w.write_quality(res, quality_settings(SETTINGS))
    w.finish("completed")
    return base / dirname


async def open_session(pilot: Any, downs: int = 0) -> SessionScreen:
    """F4, the `downs`-th session (newest first), enter."""
    await pilot.press("f4")
    await pilot.pause()
    await pilot.press(*["down"] * downs, "enter")
    await pilot.pause()
    scr = pilot.app.screen
    assert isinstance(scr, SessionScreen), scr
    return scr


def screen_text(app: Any) -> str:
    return "\n".join(s.text.rstrip() for s in app.screen._compositor.render_strips())


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_a_quality_session_shows_its_results(home: Path, size: tuple[int, int]) -> None:
    base = home / "sessions"
    quality_session(base, "20261202-100000-quality-fp8", probe(perplexity_ci=(6.2, 6.4)), name="q [b]x[/b]")
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=size) as pilot:
        scr = await open_session(pilot)
        await pilot.pause()
        assert not scr.query(CellTable) and not scr.query(ThroughputCurve) and not scr.query(LatencyHistogram)
        shown = screen_text(app)
        assert "waiting for" not in shown
        head = text_of(scr.query_one("#session-head"))
        assert "q [b]x[/b]" in head and "org/m[/x]" in head  # data, shown as typed
        assert "quality probe: ppl 6.30, 3 tasks" in head
        settings = text_of(scr.query_one("#sq-settings"))
        assert settings.startswith("probe settings: tasks arithmetic, retrieval; contexts 1024, 16384; "
                                   "questions per task 100; top-k 5; seed 0; reference /data/sessions/bf16")
        # every figure with its unit, as the report says it
        figs = {f: (v, how) for f, v, how in scr.query_one(QualityFigures).figures}
        assert figs["perplexity"][0] == "6.300 (95% interval 6.200-6.400) over 40,960 tokens"
        assert figs["perplexity"][1].startswith("exp of the mean negative log-likelihood")
        assert figs["reference session"][0] == "bf16"
        assert figs["KL mean"][0] == "0.012 nats" and figs["KL p99"][0] == "0.06 nats"
        assert figs["top-1 agreement"][0] == "97%" and figs["first divergence"][0] == "token 12.5 (mean)"
        assert figs["positions compared"][0] == "256 of 8 prompts"
        for text in ("perplexity", "6.300 (95% interval 6.200-6.400)", "exp of the mean negative", "KL mean",
                     "0.012 nats", "KL p99", "top-1 agreement", "97%", "token 12.5 (mean)", "256 of 8 prompts",
                     "bf16"):
            assert text in shown, text
        tasks = scr.query_one("#sq-tasks", FitTable)
        assert [full_row(tasks, i) for i in range(tasks.row_count)] == [
            ["arithmetic", "-", "95%", "20", "76.4-99.1%"], ["retrieval", "16K tokens", "92%", "100", "85.0-95.9%"],
            ["user[b]|x", "-", "75%", "4", "30.1-95.4%"]]
        for text in ("95% interval (Wilson)", "retrieval", "16K tokens", "85.0-95.9%", "user[b]|x"):
            assert text in shown, text
        # no cells: the keys of the cells' view are not offered, and do nothing
        assert not scr.check_action("toggle_quality", ()) and not scr.check_action("toggle_server", ())
        await pilot.press("q", "t")
        assert scr.query_one(QualityPanel).display
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SessionScreen)


async def test_zoom_shows_how_every_figure_was_computed(home: Path) -> None:
    quality_session(home / "sessions", "20261202-100000-quality-fp8", probe())
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_session(pilot)
        figs = scr.query_one(QualityFigures)
        assert figs.has_focus
        assert "99th percentile of that per-position KL" not in screen_text(app)
        await pilot.press("z")
        await pilot.pause()
        panel = scr.query_one(QualityPanel)
        assert scr.maximized is panel and figs.zoomed
        assert "99th percentile of that per-position KL" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert scr.maximized is None and isinstance(app.screen, SessionScreen)


async def test_without_perplexity_or_reference_it_says_why(home: Path) -> None:
    res = probe(ppl=None, kl=None, perplexity_note="the server returns no prompt log-probabilities")
    quality_session(home / "sessions", "20261202-100000-quality-fp8", res)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        await open_session(pilot)
        shown = screen_text(app)
        assert "not measured: the server returns no prompt log-probabilities" in shown
        assert "No divergence was measured" in shown
        assert "KL mean" not in shown and "waiting for" not in shown


def sweep_with_quality(home: Path, res: QualityResult | None) -> Path:
    p = write_session(home / "sessions", "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    if res is not None:
        SessionWriter.open(p).write_quality(res, quality_settings(SETTINGS))
    return p


async def test_a_sweep_with_quality_shows_it_on_q(home: Path) -> None:
    sweep_with_quality(home, probe())
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_session(pilot)
        cells, panel = scr.query_one(CellTable), scr.query_one(QualityPanel)
        assert cells.row_count == 4 and cells.display and not panel.display
        assert "+quality (q): ppl 6.30" in text_of(scr.query_one("#session-head"))
        shown = screen_text(app)
        assert "q Quality" in shown and "t Panel" in shown  # the footer offers it
        assert "KL mean" not in shown
        await pilot.press("q")
        await pilot.pause()
        assert panel.display and not scr.query_one("#session-top").display
        assert not scr.query_one("#session-hists").display
        shown = screen_text(app)
        assert "6.300 over 40,960 tokens" in shown and "0.012 nats" in shown and "85.0-95.9%" in shown
        assert "t Panel" not in shown  # the cells' panels are not on screen
        await pilot.press("q")
        await pilot.pause()
        assert not panel.display and scr.query_one("#session-top").display and cells.has_focus


async def test_a_sweep_without_quality_offers_no_q(home: Path) -> None:
    sweep_with_quality(home, None)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_session(pilot)
        assert not scr.query(QualityPanel) and not scr.check_action("toggle_quality", ())
        assert "q Quality" not in screen_text(app)
        await pilot.press("q")
        assert isinstance(app.screen, SessionScreen)


def test_help_lists_the_key() -> None:
    from servescope.tui.app import ServescopeApp
    from servescope.tui.screens.help import help_text

    text = help_text(ServescopeApp.BINDINGS, SessionScreen)
    assert "Quality/cells" in text.split("A saved session")[1]


@pytest.mark.parametrize("kind", ["quality", "sweep"])
async def test_a_damaged_quality_json_is_one_line(home: Path, kind: str) -> None:
    if kind == "quality":
        p = quality_session(home / "sessions", "20261202-100000-quality-fp8", probe())
    else:
        p = sweep_with_quality(home, probe())
    (p / "quality.json").write_text('{"tasks": {"a": {"accuracy": "x"}}}')
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_session(pilot)
        if kind == "sweep":
            assert scr.query_one(CellTable).row_count == 4  # the rest of the screen works
            assert "+quality (q): quality.json damaged" in text_of(scr.query_one("#session-head"))
            await pilot.press("q")
            await pilot.pause()
        err = text_of(scr.query_one("#sq-error"))
        assert "\n" not in err and "quality.json" in err and "cannot be read" in err
        assert " ".join(err.split()) in " ".join(screen_text(app).split())  # wrapped at 80 columns, whole
        assert not scr.query_one(QualityFigures).display and not scr.query_one("#sq-tasks").display
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SessionScreen)


async def test_quality_under_load_is_on_q(home: Path) -> None:
    """A sweep run with --quality-share (no quality.json): each cell's accuracy under load."""
    base = home / "sessions"
    p = base / "20261201-100000-share"
    w = SessionWriter.create(p, meta_of(**{"name": "share", "model": "tiny", "target": {"url": "sim://tiny"},
                                 "cells": [{"index": 0, "workload": "sharegpt", "concurrency": 4,
                                            "load_label": "c=4", "status": "planned"}]}))
    df, s = summary_for(4)
    s["quality"] = {"accuracy": 0.9, "n": 10, "correct": 9, "failed": 1, "kl_mean": 0.02, "positions": 64,
                    "top1_agreement": 0.95, "tasks": {"arithmetic": {"accuracy": 0.9, "n": 10, "correct": 9}}}
    w.write_cell({"index": 0, "workload": "sharegpt", "api": "chat", "concurrency": 4, "rate": None,
                  "load_label": "c=4", "status": "done", "reason": ""}, df, CellResult.from_dict(s))
    w.finish("completed")
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(100, 30)) as pilot:
        scr = await open_session(pilot)
        assert "+quality (q): under load" in text_of(scr.query_one("#session-head"))
        await pilot.press("q")
        await pilot.pause()
        load = scr.query_one("#sq-load", FitTable)
        assert load.display and load.row_count == 1
        assert full_row(load, 0) == ["sharegpt", "c=4", "90% (9/10)", "59.6-98.2%", "0.02 over 64 positions", "95%",
                                     "1", "arithmetic 9/10"]
        assert "no quality results" not in screen_text(app)


async def test_a_finished_sweep_without_cells_says_so(home: Path) -> None:
    base = home / "sessions"
    w = SessionWriter.create(base / "20261201-100000-empty", meta_of(**{
        "name": "empty", "model": "tiny", "target": {"url": "sim://tiny", "metrics": True},
        "cells": [{"index": 0, "workload": "sharegpt", "concurrency": 4, "load_label": "c=4", "status": "planned"}]}))
    w.finish("interrupted")
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_session(pilot)
        shown = screen_text(app)
        assert "waiting for" not in shown
        assert "no cells (session interrupted)" in shown
        assert scr.query_one(ThroughputCurve).empty.startswith("no cells")
        assert all(h.empty == "no cells" for h in scr.query(LatencyHistogram))
        assert scr.query_one(ServerPanel).empty.startswith("no cells")
