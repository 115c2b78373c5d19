"""The Run screen's ETA follows each cell's plan and the time a request takes at its load (servescope.tui.eta),
not the share of cells done (issue: `ETA 02:04` at 50%, and it took 3:04): a closed loop at c=1 sends its
requests one after another, at c=16 sixteen at a time, and latency grows with the load. Checked on recorded
progress (a sweep's cells, their wall times and E2E, replayed on a fake clock) through the functions and through
the screen."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from servescope.core.results import CellResult, Dist
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.eta import Measured, cell_seconds, request_seconds, sweep_eta
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import SweepProgress

from .helpers import wait_until

# the --fast lane leaves this module out: 1 tests, ~2 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

N = 64  # requests per cell
LOADS = (1, 4, 16, 32)
E2E_S = {1: 0.282, 4: 0.347, 16: 0.620, 32: 1.343}  # a request's time at each load (it grows past c=4)
BEFORE_S, AFTER_S = 1.0, 1.0  # each cell's time around its requests: prompts and warmup, then the last samples
CELLS = [m.CellInfo(i, "sharegpt", f"c={c}", c, None, N, None, "in 200-512 (uniform) / out 256 (chat)")
         for i, c in enumerate(LOADS)]


def wall(c: int) -> float:
    """A cell's recorded wall time: N / c rounds of its requests and the time around them."""
    return BEFORE_S + math.ceil(N / c) * E2E_S[c] + AFTER_S


def uniform_eta(elapsed: float, finished: int, cell_share: float) -> float:
    """The estimate the screen made before: the time gone over the share of cells done."""
    f = (finished + cell_share) / len(CELLS)
    return elapsed * (1 - f) / f


def test_half_way_through_the_second_cell_the_eta_is_the_time_left() -> None:
    measured = [Measured(CELLS[0], wall(1), E2E_S[1])]
    rounds_left = math.ceil(N / 2 / 4)
    elapsed_in_cell = BEFORE_S + rounds_left * E2E_S[4]
    truth = rounds_left * E2E_S[4] + AFTER_S + wall(16) + wall(32)
    eta = sweep_eta(CELLS, measured, CELLS[1], elapsed_in_cell, N // 2, E2E_S[4], {0})
    assert eta is not None and abs(eta - truth) <= 0.2 * truth, (eta, truth)
    # the share of cells done called it more than three times as long
    assert uniform_eta(wall(1) + elapsed_in_cell, 1, 0.5) > 3 * truth


def test_later_cells_at_higher_loads_take_what_their_load_predicts() -> None:
    measured = [Measured(CELLS[i], wall(c), E2E_S[c]) for i, c in enumerate(LOADS[:2])]
    # E2E past the highest load measured grows as it grew between the two highest: not a constant, never less
    assert request_seconds(CELLS[2], measured) > E2E_S[4]
    # a cell at c=16 runs N / 16 rounds: far shorter than the mean of the cells before it
    t16 = cell_seconds(CELLS[2], measured)
    assert t16 is not None and abs(t16 - wall(16)) <= 0.15 * wall(16), (t16, wall(16))
    assert t16 < (wall(1) + wall(4)) / 2
    # nothing measured yet: no ETA rather than a guess
    assert sweep_eta(CELLS, [], CELLS[0], 0.5, 0, None, set()) is None


def test_open_loop_and_timed_cells() -> None:
    rate = [m.CellInfo(i, "chat", f"{r:g} req/s", None, r, 40, None) for i, r in enumerate((0.5, 1.0, 4.0))]
    measured = [Measured(rate[0], 2.0 + 40 / 0.5 + 1.0, 1.0)]  # 83 s: 80 s of arrivals, a request, 2 s around
    t = cell_seconds(rate[2], measured)
    assert t is not None and abs(t - (40 / 4.0 + 1.0 + 2.0)) < 0.01, t
    timed = [m.CellInfo(i, "chat", f"c={c}", c, None, None, 30.0) for i, c in enumerate((1, 8))]
    measured = [Measured(timed[0], 30.0 + 2.0 + 3.0, 2.0)]  # 30 s, the requests in flight at its end, 3 s around
    t = cell_seconds(timed[1], measured)
    assert t is not None and abs(t - 35.0) < 0.01, t


def summary(c: int) -> CellResult:
    return CellResult(requests_ok=N, requests_failed=0, output_tok_s=100.0, per_user_tok_s=Dist(mean=50.0),
                      e2e_ms=Dist(p50=E2E_S[c] * 1000, mean=E2E_S[c] * 1000))


async def test_the_run_screen_shows_the_time_left_on_recorded_progress(home: Path) -> None:
    now = [0.0]
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), clock=lambda: now[0])
    async with app.run_test(size=(100, 30)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("recorded")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None,
                                                       "t", True)))
        # cell 1 (c=1) as recorded, then half of cell 2 (c=4)
        run.post_message(m.CellStarted(w.CellStarted(CELLS[0], len(CELLS))))
        await pilot.pause()
        now[0] += wall(1)
        run.post_message(m.CellFinished(w.CellFinished(CELLS[0], summary(1), "done")))
        run.post_message(m.CellStarted(w.CellStarted(CELLS[1], len(CELLS))))
        await pilot.pause()
        rounds_left = math.ceil(N / 2 / 4)
        now[0] += BEFORE_S + rounds_left * E2E_S[4]
        e2e_ms = [E2E_S[4] * 1000] * (N // 2)
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(CELLS[1], [90.0] * (N // 2), [4.0] * (N // 2), e2e_ms,
                                                               [50.0] * (N // 2), 100, N // 2, 0, 4.0)))
        progress = run.query_one(SweepProgress)
        truth = rounds_left * E2E_S[4] + AFTER_S + wall(16) + wall(32)
        await wait_until(pilot, lambda: progress.eta_s is not None and progress.done == N // 2, 10, "the ETA")
        assert progress.eta_s is not None and abs(progress.eta_s - truth) <= 0.2 * truth, (progress.eta_s, truth)
        # the bar: the share of the sweep's time gone
        assert abs(progress.fraction - now[0] / (now[0] + progress.eta_s)) < 1e-6
        run.flush_charts()
        text = str(progress.render())
        mm, ss = divmod(round(progress.eta_s), 60)
        assert f"ETA {mm:02d}:{ss:02d}" in text, text
