"""The Compare screen with quality results (issue 17): two quality probes side by side (no speed cell in common),
and two sweeps that hold quality results, their quality rows under the speed rows of the same table."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from servescope.core.quality import Divergence, QualityResult, TaskScore, wilson
from servescope.sessions.store import SessionWriter
from servescope.tui.app import make_app
from tests.support.meta import meta_of, quality_settings

from .fixtures import write_session
from .helpers import drawn, open_compare, row_text, text_of

# the --fast lane leaves this module out: 2 tests, ~9 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)


def ts(correct: int, n: int) -> TaskScore:
    lo, hi = wilson(correct, n)
    return TaskScore(accuracy=correct / n, n=n, correct=correct, lo=lo, hi=hi)


def result(retrieval: tuple[int, int], arithmetic: tuple[int, int], kl: float) -> QualityResult:
    return QualityResult(perplexity=6.3, perplexity_tokens=4096,
                         tasks={"retrieval@16K": ts(*retrieval), "arithmetic": ts(*arithmetic)},
                         reference=Divergence(kl_mean=kl, kl_p99=kl * 4, top1_agreement=0.98,
                                              first_divergence_mean=10.0, positions=128, prompts=8),
                         reference_session="bf16")


def quality_session(base: Path, dirname: str, quant: str, res: QualityResult) -> Path:
    w = SessionWriter.create(base / dirname, meta_of(**{"kind": "quality", "name": f"quality {quant}", "model": "tiny",
                                              "tags": {"quant": quant}, "target": {"url": "sim://tiny"}}))
    w.write_quality(res, quality_settings({"tasks": ["retrieval", "arithmetic"], "n": 100}))
    w.finish("completed")
    return base / dirname


async def test_two_quality_sessions_side_by_side(home: Path) -> None:
    base = home / "sessions"
    quality_session(base, "20261201-100000-quality-fp8", "FP8", result((100, 100), (10, 10), 0.012))
    quality_session(base, "20261202-100000-quality-int4", "GPTQ-Int4", result((92, 100), (9, 10), 0.031))
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        scr = await open_compare(pilot)
        assert scr.comparison.labels == ["FP8", "GPTQ-Int4"] and scr.comparison.cells == []
        t = scr.query_one("#compare-table", DataTable)
        rows = [row_text(t, i) for i in range(t.row_count)]
        by = {(r[1], r[2]): r for r in rows}
        assert rows[0][0] == "quality"
        retrieval = by[("16K", "retrieval")]
        assert retrieval[3:] == ["100% (100/100) ★", "92% (92/100)", "-8.0 pts worse", "FP8"]
        arith = by[("", "arithmetic")]
        assert arith[3:] == ["100% (10/10)", "90% (9/10)", "-10.0 pts within noise", "within noise"]
        assert by[("", "KL mean (nats)")][3:5] == ["0.012", "0.031"]
        head = text_of(scr.query_one("#compare-head", Static))
        assert "no speed cells in common: quality only" in head
        assert "retrieval@16K 92% vs 100% (worse, beyond noise)" in head
        assert not scr.query_one("#compare-curves").display  # no cells: no curves
        shown = "\n".join(drawn(t))  # the accuracy figures are on screen, not only in the table's data
        assert "100% (100/100)" in shown and "92% (92/100)" in shown and "pts worse" in shown
        # the other session as baseline: better, beyond noise
        await pilot.press("B")
        await pilot.pause()
        rows = [row_text(t, i) for i in range(t.row_count)]
        retrieval = next(r for r in rows if r[2] == "retrieval")
        assert retrieval[3:] == ["92% (92/100)", "100% (100/100) ★", "+8.0 pts better", "FP8"]


async def test_sweeps_holding_quality_show_it_under_speed(home: Path) -> None:
    base = home / "sessions"
    a = write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, slow=1.5)
    SessionWriter.open(a).write_quality(result((100, 100), (10, 10), 0.012), quality_settings({"n": 100}))
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        scr = await open_compare(pilot)
        assert scr.comparison.cells
        t = scr.query_one("#compare-table", DataTable)
        rows = [row_text(t, i) for i in range(t.row_count)]
        first_q = next(i for i, r in enumerate(rows) if r[0] == "quality")
        assert all(r[0] != "quality" for r in rows[:first_q]) and rows[0][0] == "sharegpt"
        assert rows[-1][2] == "GPTQ-Int4: no quality results"
        retrieval = next(r for r in rows if r[2] == "retrieval")
        assert retrieval[3:5] == ["100% (100/100)", "-"]
        assert "only FP8 holds quality results" in text_of(scr.query_one("#compare-head", Static))
        assert scr.query_one("#compare-curves").display
