"""What a user read wrong at 80x24 and 160x48 (issue 44, the app's items 4 and 5): text that is cut ends in `…`
and what matters fits (the Compose preview's SLOs and tags, Compare's chart titles, the GPU line); the Run chart
says its per-user line is a mean; the progress line's request count and the histograms' `n=` agree; a delta
whose interval has no width says so instead of `[+42.3, +42.3]`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Static

from servescope.engine import wire as w
from servescope.sessions.compare import interval_pct
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.compare import CompareScreen, compact_delta
from servescope.tui.screens.compose import preview_rows
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import SweepProgress
from servescope.tui.widgets.curve import OverlayCurve, ThroughputCurve
from servescope.tui.widgets.histogram import LatencyHistogram
from servescope.tui.widgets.panels import TelemetryPanel

from .fixtures import live_sweep_messages, write_session
from .helpers import drawn, open_compare, text_of, wait_until

# the --fast lane leaves this module out: 7 tests, ~18 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

NVML = ("NVML is not available: nvmlInit failed (NVMLError_LibraryNotFound: NVML Shared Library Not Found); no "
        "NVIDIA driver or GPU here?")


def app_for(home: Path) -> Any:
    return make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                    clock=lambda: 1000.0)


# ---- 4. cut text ends in …, what matters fits ---------------------------------------------------------------
def test_the_preview_packs_its_parts_whole_and_ends_what_does_not_fit_in_an_ellipsis() -> None:
    text = ("1 workload x 3 load levels = 3 cells, 300 requests, ~11 min (guess: F5 measures)\n"
            "target sim://tiny, SLOs ttft_ms=3000,tpot_ms=50, tags quant=GPTQ-Int4, gpu=RTXPro6000")
    rows = preview_rows(text, 64)
    assert all(len(r) <= 64 for r in rows) and len(rows) <= 4, rows
    assert "SLOs ttft_ms=3000,tpot_ms=50," in " ".join(rows) and "tags quant=GPTQ-Int4, gpu=RTXPro6000" in rows[-1]
    many = text + ", " + ", ".join(f"k{i}=v{i}" for i in range(30))
    rows = preview_rows(many, 64)
    assert len(rows) == 4 and rows[-1].endswith("…") and all(len(r) <= 64 for r in rows), rows


async def test_the_compose_preview_shows_slos_and_tags_whole_at_80x24(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f8")
        app.screen.query_one("#slos", Input).value = "ttft_ms=3000,tpot_ms=50"
        app.screen.query_one("#tags", Input).value = "quant=GPTQ-Int4,gpu=RTXPro6000"
        preview = app.screen.query_one("#preview", Static)
        await wait_until(pilot, lambda: "RTXPro6000" in text_of(preview), 10, "the tags in the preview")
        await pilot.pause()
        shown = drawn(preview)  # the rows on screen, as drawn
        assert len(shown) == len(text_of(preview).split("\n")), (shown, text_of(preview))
        on_screen = " ".join(r.strip() for r in shown)
        assert "SLOs ttft_ms=3000,tpot_ms=50" in on_screen and "tags quant=GPTQ-Int4, gpu=RTXPro6000" in on_screen, shown
        # more than fits: the last row says so
        app.screen.query_one("#tags", Input).value = ",".join(f"key{i}=value{i}" for i in range(20))
        await wait_until(pilot, lambda: "key0=value0" in text_of(preview), 10, "the tags in the preview")
        await pilot.pause()
        shown = drawn(preview)
        assert shown[-1].rstrip().endswith("…") and len(shown) == 4, shown


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_compares_chart_titles_name_metric_and_workload_uncut(home: Path, size: tuple[int, int]) -> None:
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, slow=1.5)
    app = app_for(home)
    async with app.run_test(size=size) as pilot:
        scr = await open_compare(pilot)
        assert isinstance(scr, CompareScreen)
        scr.workloads.append("short-chat")  # a second workload: the titles say `w` shows the next
        scr.refresh_view()
        await pilot.pause()
        assert "(w: next of 2)" in scr.query_one("#cmp-aggregate", OverlayCurve).title
        for curve in scr.query(OverlayCurve):
            title = drawn(curve)[0].rstrip()
            assert not title.endswith("…") and " vs load: sharegpt" in title, title
        assert drawn(scr.query_one("#cmp-per-user", OverlayCurve))[0].startswith("mean tok/s/user")


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_the_gpu_line_says_nvml_is_not_available_without_a_cut(home: Path, size: tuple[int, int]) -> None:
    app = app_for(home)
    async with app.run_test(size=size) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("sim://tiny: 1 workload")
        for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
            run.post_message(msg)
        run.post_message(m.TelemetryMeta(w.TelemetryMeta(None, {"available": False, "reason": NVML})))
        await pilot.pause()
        run.flush_telemetry()
        panel = run.query_one(TelemetryPanel)
        await wait_until(pilot, lambda: any("GPU:" in ln for ln in drawn(panel)), 10, "the GPU line")
        line = next(ln for ln in drawn(panel) if "GPU:" in ln).rstrip()
        assert line.startswith("GPU: NVML is not available") and not line.endswith("…"), line
        assert line == f"GPU: {NVML}"[: len(line)], line  # a shorter form of the reason, read from its start


# ---- 5. what the Run screen's figures count ---------------------------------------------------------------
async def test_the_run_chart_says_its_per_user_line_is_a_mean(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("sim://tiny: 1 workload")
        for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
            run.post_message(msg)
        await pilot.pause()
        run.flush_charts()
        await pilot.pause()
        legend = " ".join(drawn(run.query_one(ThroughputCurve))[1:3])  # one or two lines
        assert "◆ mean/user (r)" in legend or "◆ mean tok/s/user (right)" in legend, legend


async def test_the_request_count_and_the_histograms_agree(home: Path) -> None:
    cells = [m.CellInfo(0, "sharegpt", "c=4", 4, None, 16, None, "in 256 / out 64 (chat)")]
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", cells, "sim://tiny", "tiny", None,
                                                       "t", True)))
        run.post_message(m.CellStarted(w.CellStarted(cells[0], 1)))
        progress = run.query_one(SweepProgress)
        hists = list(run.query(LatencyHistogram))

        def agree(done: int) -> bool:
            shown = str(progress.render())
            return (f"requests {done}/16 done" in shown
                    and all(f"n={done}" in text_of(h).split("\n")[0] for h in hists if h.display))

        # two batches, the second before the charts redraw: the count shown is the charts' count
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(cells[0], [90.0, 95.0], [5.0, 5.1], [400.0, 410.0],
                                                               [150.0, 148.0], 128, 2, 0, 1.0)))
        await wait_until(pilot, lambda: agree(2), 10, "2 requests in the count and the histograms")
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(cells[0], [91.0, 96.0], [5.2, 5.0], [405.0, 415.0],
                                                               [149.0, 147.0], 128, 4, 0, 1.5)))
        await pilot.pause()
        assert agree(2) or agree(4), (str(progress.render()), [text_of(h) for h in hists])
        run.flush_charts()
        await pilot.pause()
        assert agree(4), (str(progress.render()), [text_of(h) for h in hists])
        # a request without this figure (one token: no TPOT): the histogram says of how many requests
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(cells[0], [92.0], [], [300.0], [3.3], 1, 5, 0, 2.0)))
        await pilot.pause()
        run.flush_charts()
        await pilot.pause()
        tpot = run.query_one("#hist-tpot", LatencyHistogram)
        assert "n=4 of 5" in text_of(tpot).split("\n")[0], text_of(tpot)


def test_an_interval_of_no_width_says_there_is_no_spread() -> None:
    assert interval_pct((42.31, 42.34)) == "(no spread: deterministic server)"
    assert interval_pct((5.5, 33.9)) == "[+5.5, +33.9]"
    assert compact_delta("+42.3% (no spread: deterministic server) better") == "+42% (no spread)"
