"""The Run screen: a sweep as it runs. Progress, live histograms of the running cell, the throughput curve
over finished cells, the server panel, the event log and the table of finished cells.

Imported inside functions, to keep polars off the app's start-up: core.metrics (benchmarks/import_cost.py; the
docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from servescope.core.health import client_text
from servescope.core.kvbudget import KvBudgetMeta
from servescope.core.results import CellResult, ServerWindow, rate_limit_line
from servescope.engine.wire import GpuReading
from servescope.sessions.measurement import measure_lines
from servescope.sessions.meta import GpuTable
from servescope.tui import messages as m
from servescope.tui.eta import Measured, sweep_eta
from servescope.tui.widgets.curve import ChartSpec, CurvePoint, ThroughputCurve
from servescope.tui.widgets.histogram import LatencyHistogram
from servescope.tui.widgets.panels import (
    CELL_COLS,
    CellTable,
    EventLog,
    ServerPanel,
    SweepProgress,
    TelemetryPanel,
    budget_line,
    budget_short_forms,
    fnum,
    gpu_reading,
    short_path,
)
from servescope.tui.widgets.serving import serving_lines
from servescope.tui.widgets.turns import TurnChart, live_turn_rows
from servescope.tui.widgets.zoom import zoomed_elsewhere

LIVE_SAMPLES = 240  # telemetry samples kept for the sparklines (a minute or more)


CELLS_TITLE = "finished cells"
BOUND_TITLE = "finished (bound: client-limited)"  # a client-bound cell is in the table: its status says `bound`
LIVE_TITLE = "server live (/metrics)"
GAUGES = ("KV cache", "running", "waiting")  # the live panel's rows that are a reading of now, not a count



def ended_series(series: Sequence[tuple[str, str, tuple[float | None, ...]]]
                 ) -> tuple[tuple[str, str, tuple[float | None, ...]], ...]:
    """The live panel's rows once the sweep has ended: the gauges no longer read anything now (`-`), their
    sparklines keep the sweep's history; the counts (preemptions, prefix hits) stand."""
    return tuple((label, "-" if label in GAUGES else value, vals) for label, value, vals in series)


def live_series(samples: Sequence[dict[str, float]]) -> tuple[tuple[str, str, tuple[float | None, ...]], ...]:
    """The live panel's rows from /metrics samples: KV-cache usage (%), running, waiting, and preemptions
    (the count since the first sample, its sparkline the new ones per sample)."""
    def col(key: str) -> list[float | None]:
        return [s.get(key) for s in samples]

    if not samples:
        return ()
    kv = [v * 100 if v is not None else None for v in col("kv_cache_usage")]
    pre = col("preemptions_total")
    first = next((v for v in pre if v is not None), None)
    new: list[float | None] = [None if (a is None or b is None) else max(0.0, b - a) for a, b in zip([first, *pre], pre,
                                                                                                    strict=False)]
    last = samples[-1]

    def show(v: float | None, fmt: str) -> str:
        return fmt.format(v) if v is not None else "-"

    now = last.get("preemptions_total")
    total = now - first if first is not None and now is not None else None
    rows = [("KV cache", show(kv[-1], "{:.1f}%"), tuple(kv)),
            ("running", show(last.get("running"), "{:.0f}"), tuple(col("running"))),
            ("waiting", show(last.get("waiting"), "{:.0f}"), tuple(col("waiting"))),
            ("preemptions", show(total, "{:.0f}"), tuple(new)),
            ("prefix hits", *prefix_hits(col("prefix_queries_total"), col("prefix_hits_total")))]
    return tuple(r for r in rows if any(v is not None for v in r[2]))


HIT_WINDOW = 10  # samples the live prefix-cache hit rate is taken over (a few seconds)


def prefix_hits(queries: list[float | None], hits: list[float | None]) -> tuple[str, tuple[float | None, ...]]:
    """The server's prefix-cache hit rate from its counters: the value shown is hits / queried prompt tokens over
    the last HIT_WINDOW samples (%), the sparkline the same between consecutive samples (None where no prompt
    was queried)."""
    def rate(i: int, j: int) -> float | None:
        q0, q1, h0, h1 = queries[i], queries[j], hits[i], hits[j]
        if q0 is None or q1 is None or h0 is None or h1 is None or q1 - q0 <= 0:
            return None
        return max(0.0, min(100.0, 100.0 * (h1 - h0) / (q1 - q0)))

    n = len(queries)
    spark = tuple(rate(i - 1, i) if i else None for i in range(n))
    now = rate(max(0, n - 1 - HIT_WINDOW), n - 1) if n > 1 else None
    return (f"{now:.1f}%" if now is not None else "-"), spark


LATE_MS = 10.0  # a trace cell sent later than this at p99 did not keep the trace's times (as `servescope run` says)


def multi_turn_kind(cell: m.CellInfo) -> str:
    """"conversation" or "agent" when the cell's workload is one (its shape says so), else ""."""
    shape = cell.shape or ""
    for kind in ("conversation", "agent"):
        if f"({kind}" in shape or shape.startswith(f"{kind}:"):
            return kind
    return ""


def is_trace(cell: m.CellInfo) -> bool:
    return (cell.shape or "").startswith("trace ")


def lateness_text(summary: CellResult) -> str:
    """How late a trace cell's sends were against the trace (its client queueing, ms), in one line that says what
    it means."""
    q = summary.client_queue_ms
    p50, p99, mx = q.stat("p50"), q.stat("p99"), q.stat("max")
    if p99 is None:
        return "sent late vs trace: - (no request was sent)"
    verdict = (f"over {LATE_MS:g} ms: the client did not keep the trace's times" if p99 > LATE_MS
               else f"within {LATE_MS:g} ms: on the trace's schedule")
    return (f"sent late vs trace p50 {fnum(p50, 2)} ms, p99 {fnum(p99, 2)} ms, max {fnum(mx, 2)} ms "
            f"(client queueing; p99 {verdict})")


def short_lateness(summary: CellResult) -> str:
    """`sent late vs trace p99 X ms`, and whether that kept the trace's times (the progress line)."""
    p99 = summary.client_queue_ms.stat("p99")
    if p99 is None:
        return "sent late vs trace: -"
    return f"sent late vs trace p99 {fnum(p99, 2)} ms ({'behind the trace' if p99 > LATE_MS else 'on schedule'})"


def curve_point(cell: m.CellInfo, summary: CellResult, slos: bool) -> CurvePoint:
    from servescope.core.metrics import meets_slos

    return CurvePoint(
        x=cell.x,
        label=cell.load_label,
        aggregate_tok_s=float(summary.output_tok_s or 0.0),
        per_user_tok_s=float(summary.per_user_tok_s.mean or 0.0),
        meets_slo=meets_slos(summary) if slos else None,
    )


class RunScreen(Screen[None]):
    """Fed by the sweep worker's messages (posted to this screen; they bubble on to the app)."""

    BINDINGS = [
        Binding("s", "skip_cell", "Skip"),
        Binding("x", "stop_sweep", "Stop"),
        Binding("t", "toggle_server", "Panel"),
        Binding("escape,b", "back", "Back to compose", show=False),  # F2 in the footer does the same
    ]

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.cells: list[m.CellInfo] = []
        self.total = 0
        self.finished = 0
        self.sweep_t0: float | None = None
        self.running = False
        self.slos = False
        self.session_dir: Path | None = None
        self._cur: m.CellInfo | None = None
        self._ttft: list[float] = []
        self._tpot: list[float] = []
        self._e2e: list[float] = []
        self._per_user: list[float] = []
        self._turns: list[int] = []  # parallel to self._ttft: each request's turn (0: single-turn)
        self._cached: list[Any] = []  # parallel to self._ttft: [cached prompt tokens or None, prompt tokens]
        self._turn_kind = ""  # "conversation" / "agent" while such a cell runs: the per-turn chart is shown
        self._out_tok = 0
        self._cell_elapsed = 0.0  # the engine's elapsed time of the running cell, as of its latest batch
        self._cell_seen: float | None = None  # our clock when that was: the shown cell time runs on from it
        self._points: dict[str, list[CurvePoint]] = {}  # per workload (and server variant)
        self._servers: list[ServerWindow] = []
        self._client_ttft: list[float | None] = []
        self._dirty = False
        self._samples: deque[dict[str, float]] = deque(maxlen=LIVE_SAMPLES)
        self._gpus: list[GpuReading] = []
        self._kv_budget: KvBudgetMeta | None = None
        self._gpu_meta: GpuTable | None = None
        self._tele_dirty = False
        self._stops = 0  # `x` presses during this sweep: the first drains the running cell, a second cancels
        self._done_cells = 0  # finished cells saved as `done` whose client was not the limit (on the curve)
        self._completed = 0  # finished cells saved as `done` (cell_counts' completed: client-bound ones too)
        self._left_out: dict[str, list[str]] = {}  # per series: its finished cells not drawn on the curve, with why
        self._cur_ended = True  # the cell in self._cur is saved (finished or skipped)
        self.engine_pid = 0  # the process the engine runs in (the app's own when it runs in a thread)
        self._quit_cell: m.CellInfo | None = None  # the cell running when ctrl+q was pressed
        self._quit_finished = 0  # cells finished then
        self._counts = (0, 0, 0)  # the running cell's requests done, failed, rate-limited (shown with the charts)
        self._cell_t0: float | None = None  # our clock when the running cell started
        self._measured: list[Measured] = []  # finished cells: their wall time and E2E p50 (the ETA's basis)
        self._ended: set[int] = set()  # cells finished or skipped

    def compose(self) -> ComposeResult:
        yield SweepProgress(id="progress")
        with Horizontal(id="run-middle"):
            with Vertical(id="hists"):
                yield LatencyHistogram("TTFT", id="hist-ttft")
                yield LatencyHistogram("TPOT", id="hist-tpot")
                yield LatencyHistogram("E2E", id="hist-e2e")
                yield TurnChart("TTFT p50 by turn", id="turn-chart")
            with Vertical(id="run-right"):
                yield ThroughputCurve(id="curve")
                yield TelemetryPanel(id="live")
                yield ServerPanel(id="server")
        with Horizontal(id="run-bottom"):
            yield EventLog(id="log")
            yield CellTable(id="cells")
        yield Static("", id="run-session", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#log", EventLog).border_title = "events"
        cells = self.query_one("#cells", CellTable)
        cells.border_title = CELLS_TITLE
        cells.set_columns(CELL_COLS)
        self.query_one(ServerPanel).display = False  # `t` swaps the live panel for the per-cell one
        self.query_one(TurnChart).display = False  # in E2E's place while a multi-turn cell runs
        self.set_interval(1.0, self._tick)
        self.set_interval(0.5, self.flush_charts)  # charts redraw at most twice a second, whatever the batch rate

    # ---- helpers --------------------------------------------------------------------------------
    @property
    def progress(self) -> SweepProgress:
        return self.query_one(SweepProgress)

    @property
    def log_view(self) -> EventLog:
        return self.query_one(EventLog)

    def reset(self, title: str = "") -> None:
        """A new sweep is about to start: clear everything."""
        self.cells, self.total, self.finished, self.running = [], 0, 0, True
        self.sweep_t0 = self.clock()
        self.session_dir = None
        self._cur = None
        self._stops, self._done_cells, self._completed, self._left_out = 0, 0, 0, {}
        self._measured, self._ended, self._cell_t0 = [], set(), None
        self._points.clear()
        self._servers.clear()
        self._client_ttft.clear()
        self._clear_cell()
        self._samples.clear()
        self._gpus, self._kv_budget, self._gpu_meta = [], None, None
        self._tele_dirty = True
        p = self.progress
        p.state, p.cell_no, p.total, p.label, p.shape, p.detail = "starting", 0, 0, "", "", title
        p.done = p.failed = p.rate_limited = 0
        p.fraction, p.eta_s = 0.0, None
        p.cell_elapsed, p.sweep_elapsed, p.planned = 0.0, 0.0, None
        self.log_view.reset()
        self.query_one(CellTable).clear()
        self.query_one(CellTable).border_title = CELLS_TITLE
        self.query_one(TelemetryPanel).title = LIVE_TITLE  # live again (TelemetryPanel's own title)
        self.query_one(ServerPanel).cells = ()
        self.query_one(ThroughputCurve).points = ()
        self.query_one(ThroughputCurve).title = "throughput vs load"  # not the last sweep's workload
        self.query_one("#run-session", Static).update("")
        self.log_view.event("info", f"starting {title}…" if title else "starting…")

    def _clear_cell(self) -> None:
        self._ttft, self._tpot, self._e2e, self._per_user = [], [], [], []
        self._counts = (0, 0, 0)
        self._turns, self._cached = [], []
        self._out_tok, self._cell_elapsed = 0, 0.0
        for h in self.query(LatencyHistogram):
            h.values = ()
        self.query_one(TurnChart).rows = ()

    def _show_turns(self, kind: str) -> None:
        """While a conversation or agent cell runs, its TTFT by turn takes the E2E histogram's place (its title
        says so); any other cell shows the E2E histogram."""
        self._turn_kind = kind
        chart, e2e = self.query_one(TurnChart), self.query_one("#hist-e2e", LatencyHistogram)
        if kind:
            chart.note = "(in E2E's place)"
        if chart.display != bool(kind):
            moves = (chart if kind else e2e) if (e2e if kind else chart).has_focus else None
            chart.display, e2e.display = bool(kind), not kind
            if moves is not None:  # the focus stays in the same slot
                moves.focus()

    def _tick(self) -> None:
        if not self.running or self.sweep_t0 is None:
            return
        if self._cur is not None and not self._cur_ended and self._cell_seen is not None:
            # between the engine's batches (twice a second, and only when requests finish) the cell time runs on
            self.progress.cell_elapsed = self._cell_elapsed + (self.clock() - self._cell_seen)
        self._update_eta()

    def _update_eta(self) -> None:
        """The sweep's time gone and left (servescope.tui.eta: each cell still to run from its plan and the time a
        request takes at its load), and the bar: the share of the sweep's time gone once that is known, else of its
        cells done."""
        p = self.progress
        if self.sweep_t0 is not None:
            p.sweep_elapsed = self.clock() - self.sweep_t0
        cur = self._cur if self._cur is not None and not self._cur_ended else None
        done = self._counts[0]
        frac_cell = 0.0
        if cur is not None:  # a finished or skipped cell is already in `finished`
            if cur.requests:
                frac_cell = min(1.0, done / cur.requests) if done else 0.0
            elif cur.duration_s:
                frac_cell = min(1.0, self._cell_elapsed / cur.duration_s)
        e2e = sorted(self._e2e)
        left = sweep_eta(self.cells, self._measured, cur,
                         self.clock() - self._cell_t0 if cur is not None and self._cell_t0 is not None else 0.0,
                         done, e2e[len(e2e) // 2] / 1000 if e2e else None, self._ended) if self.cells else None
        p.eta_s = left
        if left is not None and p.sweep_elapsed + left > 0:
            p.fraction = min(1.0, p.sweep_elapsed / (p.sweep_elapsed + left))
        else:
            p.fraction = min(1.0, (self.finished + frac_cell) / self.total) if self.total else 0.0

    def _live_curve(self) -> None:
        cur = self._cur
        if cur is None:
            return
        pts = list(self._points.get(cur.series, []))
        if self._out_tok and self._cell_elapsed > 0 and self._per_user:
            pts.append(CurvePoint(cur.x, cur.load_label, self._out_tok / self._cell_elapsed,
                                  sum(self._per_user) / len(self._per_user), live=True))
        curve = self.query_one(ThroughputCurve)
        curve.title = f"{cur.series}: output tok/s vs load"
        left_out = self._left_out.get(cur.series)
        curve.empty = (f"{', '.join(left_out)}: not plotted (see events)" if left_out
                       else ChartSpec.empty)
        curve.points = tuple(pts)

    # ---- engine messages ----------------------------------------------------------------------
    @on(m.SweepStarted)
    def _started(self, msg: m.SweepStarted) -> None:
        self.cells, self.total, self.session_dir = msg.cells, len(msg.cells), msg.session_dir
        self.query_one(ServerPanel).metrics_available = msg.metrics
        self.query_one(TelemetryPanel).note = (
            ("llama.cpp: running = requests processing, waiting = deferred; no KV-cache usage or preemptions"
             if msg.engine.startswith("llama.cpp") else "") if msg.metrics
            else "this server has no vLLM or llama.cpp /metrics")
        p = self.progress
        p.total, p.state = self.total, "running"
        p.detail = ""
        engine = msg.engine or f"vLLM {msg.version or '?'}"  # an older event log names no engine
        self.log_view.event("info", f"{msg.target}: model {msg.model} ({engine}), {self.total} cells,"
                                    f" tokenizer {msg.tokenizer}")
        if msg.started_at is not None:  # attached: the sweep began before this screen did
            self.sweep_t0 = self.clock() - max(0.0, time.time() - msg.started_at)
        self.engine_pid = msg.engine_pid
        if msg.engine_pid and msg.engine_pid != os.getpid():
            self.log_view.event("info", f"the sweep runs in its own process (pid {msg.engine_pid}): it goes on if "
                                        "this terminal closes; ctrl+q asks whether to stop it")
        self.query_one("#run-session", Static).update(f"session: {short_path(msg.session_dir)}")

    @on(m.CellStarted)
    def _cell_started(self, msg: m.CellStarted) -> None:
        self._cur = msg.cell
        self._cur_ended = False
        self._clear_cell()
        p = self.progress
        p.cell_no, p.total, p.label, p.shape = msg.cell.index + 1, msg.total, msg.cell.label, msg.cell.shape
        p.done = p.failed = p.rate_limited = 0
        p.planned = msg.cell.requests
        p.cell_elapsed = 0.0
        self._cell_seen = self._cell_t0 = self.clock()
        self._show_turns(multi_turn_kind(msg.cell))
        if is_trace(msg.cell):
            self.log_view.event("info", f"cell {msg.cell.index + 1} replays a trace: how late its sends were against "
                                        "the trace's times (client queueing) is shown when it ends")
        self._tele_dirty = True  # the KV budget line follows the running cell
        self._live_curve()

    @on(m.RequestsMeasured)
    def _requests(self, msg: m.RequestsMeasured) -> None:
        self._ttft.extend(msg.ttft_ms)
        # older event logs have no turns: keep the lists parallel to the TTFTs all the same
        self._turns.extend(msg.turns or [0] * len(msg.ttft_ms))
        self._cached.extend(msg.cached or [None] * len(msg.ttft_ms))
        if not self._turn_kind and any(t > 1 for t in msg.turns):
            self._show_turns("conversation")  # a multi-turn cell whose shape did not say so
        self._tpot.extend(msg.tpot_ms)
        self._e2e.extend(msg.e2e_ms)
        self._per_user.extend(msg.per_user_tok_s)
        self._out_tok += msg.output_tokens
        self._cell_elapsed = msg.elapsed_s
        self._cell_seen = self.clock()
        self._dirty = True
        self._counts = (msg.done, msg.failed, msg.rate_limited)  # shown with the charts, so that they agree
        self.progress.cell_elapsed = msg.elapsed_s
        if msg.errors:
            self.log_view.request_errors(msg.cell.index + 1, msg.errors)
        self._update_eta()

    @on(m.TelemetryUpdated)
    def _telemetry(self, msg: m.TelemetryUpdated) -> None:
        if msg.server is not None:
            self._samples.append(msg.server)
        if msg.gpus is not None:
            self._gpus = msg.gpus
        self._tele_dirty = True

    @on(m.TelemetryMeta)
    def _telemetry_meta(self, msg: m.TelemetryMeta) -> None:
        self._kv_budget, self._gpu_meta = msg.kv_budget, msg.gpu
        self._tele_dirty = True

    def flush_telemetry(self) -> None:
        if not self._tele_dirty:
            return
        self._tele_dirty = False
        panel = self.query_one(TelemetryPanel)
        series = live_series(list(self._samples))
        panel.series = series if self.running else ended_series(series)
        if self._gpus:
            panel.gpu_lines = tuple(gpu_reading(g) for g in self._gpus)
        elif self._gpu_meta is not None and not self._gpu_meta.get("available"):
            panel.gpu_lines = (f"GPU: {self._gpu_meta.get('reason') or 'NVML not available'}",)
        else:
            panel.gpu_lines = ()
        cur = self._cur
        wl, conc = (cur.workload, cur.concurrency) if cur else (None, None)
        panel.budget = budget_line(self._kv_budget, wl, conc)
        panel.budget_short = budget_short_forms(self._kv_budget, wl, conc)

    def flush_charts(self) -> None:
        """Redraw the histograms, the live curve point and the live panel from what arrived since the last
        flush."""
        self.flush_telemetry()
        if not self._dirty:
            return
        self._dirty = False
        p = self.progress
        p.done, p.failed, p.rate_limited = self._counts
        for hid, vals in (("#hist-ttft", self._ttft), ("#hist-tpot", self._tpot), ("#hist-e2e", self._e2e)):
            h = self.query_one(hid, LatencyHistogram)
            h.values, h.requests = tuple(vals), self._counts[0]
        if self._turn_kind:
            self.query_one(TurnChart).rows = live_turn_rows(self._turns, self._ttft, self._cached)
        self._live_curve()

    @on(m.CellFinished)
    def _cell_finished(self, msg: m.CellFinished) -> None:
        self.flush_charts()
        s, c = msg.summary, msg.cell
        self.finished += 1
        self._cur_ended = True
        self._ended.add(c.index)
        if msg.status == "done" and self._cell_t0 is not None and self._cur is not None and self._cur.index == c.index:
            e2e = s.e2e_ms.stat("p50")
            self._measured.append(Measured(c, self.clock() - self._cell_t0, e2e / 1000 if e2e is not None else None))
        client = s.client
        bound = s.client_bound
        if msg.status == "done":
            self._completed += 1
        if bound:
            self.query_one(CellTable).border_title = BOUND_TITLE
        if msg.status == "done" and not bound:  # the curve, its knee and capacity use completed cells only
            self._done_cells += 1
            self._points.setdefault(c.series, []).append(curve_point(c, s, self.slos))
        elif msg.status == "done":  # the load generator, not the server, limited it: its figures are the client's
            self._left_out.setdefault(c.series, []).append(f"{c.load_label} client-bound")
        else:
            self._left_out.setdefault(c.series, []).append(f"{c.load_label} {msg.status}")
        # a cell the server's rate limit refused for the most part says so in its status (its figures are the few served)
        status = f"{msg.status}, rate-limited" if s.mostly_rate_limited else msg.status
        self.query_one(CellTable).set_cell(c.index, c.series, c.load_label, status, s)
        if s.server is not None:
            self._servers.append(s.server)
            self._client_ttft.append(s.ttft_ms.mean)
            sp = self.query_one(ServerPanel)
            sp.client_ttft = tuple(self._client_ttft)
            sp.cells = tuple(self._servers)
        self.log_view.cell_errors(c.index + 1)
        why = f" ({msg.reason})" if msg.reason else ""
        self.log_view.event(
            "ok" if msg.status == "done" else "warning",
            f"cell {c.index + 1}/{self.total} {c.label} {msg.status}{why}: {s.requests_ok} ok, "
            f"{s.requests_failed} failed, "
            + (f"{s.requests_rate_limited} rate-limited (HTTP 429), " if s.requests_rate_limited else "")
            + f"{fnum(s.output_tok_s)} tok/s, TTFT p50 "
            f"{fnum(s.ttft_ms.stat('p50'))} ms, p99 {fnum(s.ttft_ms.stat('p99'))} ms",
        )
        # its window, precision, saturation, probes (sessions/measurement.py); a cell the engine measured has a window
        for level, line in measure_lines(s, before_windows=False):
            self.log_view.event(level, f"cell {c.index + 1} {line}")
        if s.mostly_rate_limited:
            self.log_view.event("warning", f"cell {c.index + 1} {rate_limit_line(s)}")
        for line in serving_lines(s):  # speculation, adapters, the prefix cache's aim and reset, energy
            self.log_view.event("warning" if "NOT reset" in line else "info", f"cell {c.index + 1} {line}")
        if is_trace(c):
            late = lateness_text(s)
            p99 = s.client_queue_ms.stat("p99")
            self.log_view.event("warning" if p99 is not None and p99 > LATE_MS else "info",
                                f"cell {c.index + 1} {late}")
            if self._cur is not None and self._cur.index == c.index:  # the first line says it, in the load's and
                self.progress.label, self.progress.shape = c.series, short_lateness(s)  # the shape's place
        if client is not None and client.verdict != "ok":  # ok is in the table's client column
            self.log_view.event("warning", f"cell {c.index + 1} client: {client_text(client)}")
        if msg.status != "done":
            self.log_view.event("warning", f"cell {c.index + 1} ({c.label}) is left out of the curve, knee and "
                                           f"capacity: it did not complete ({msg.status})")
        elif bound:
            self.log_view.event("warning", f"cell {c.index + 1} ({c.label}) is left out of the curve, knee and "
                                           "capacity: its client was bound (the load generator, not the server, "
                                           "limited it)")
        self._out_tok, self._per_user = 0, []
        self._live_curve()
        self._update_eta()

    @on(m.CellSkipped)
    def _cell_skipped(self, msg: m.CellSkipped) -> None:
        self.finished += 1
        self._ended.add(msg.cell.index)
        if self._cur is not None and self._cur.index == msg.cell.index:  # the running cell, skipped by the user
            self._cur_ended = True
            self._clear_cell()
            self._dirty = True
        self.query_one(CellTable).set_cell(msg.cell.index, msg.cell.series, msg.cell.load_label, "skipped", {})
        self.log_view.event("warning", f"cell {msg.cell.index + 1}/{self.total} {msg.cell.label} skipped: {msg.reason}")
        self._update_eta()

    @on(m.EngineNotice)
    def _notice(self, msg: m.EngineNotice) -> None:
        self.log_view.event(msg.level, msg.text)

    def counts_text(self) -> str:
        """`4/8 cells completed`: cells saved as done of the cells planned, as the Sessions screen and `servescope
        sessions` count them (sessions.views.cell_counts)."""
        return f"{self._completed}/{self.total} cells completed"

    @on(m.SweepFinished)
    def _finished(self, msg: m.SweepFinished) -> None:
        self.running = False
        if self.total:  # the live gauges read nothing now: they no longer show the last sample as current
            self.query_one(TelemetryPanel).title = "server /metrics (sweep ended)"
            self._tele_dirty = True
            self.flush_telemetry()
        self._update_eta()
        p = self.progress
        if msg.session_dir is None and not self.total:  # it ended before the first cell: say why, no timers
            p.detail = msg.message or "the engine stopped before the first cell"
            p.eta_s = None
            self.query_one(ThroughputCurve).title = f"throughput vs load: the sweep {'did not start' if msg.status == 'failed' else 'was stopped'}"
        p.state = msg.status
        if msg.status == "completed":
            p.fraction = 1.0
        p.eta_s = None
        where = f"; session saved in {short_path(msg.session_dir)}" if msg.session_dir else ""
        if self.total:
            where = f": {self.counts_text()}{where}"
        level = {"completed": "ok", "interrupted": "warning"}.get(msg.status, "error")
        self.log_view.event(level, f"sweep {msg.status}{where}" + (f": {msg.message}" if msg.message else ""))
        if msg.session_dir:
            self.query_one("#run-session", Static).update(f"session ({msg.status}): {short_path(msg.session_dir)}")

    # ---- actions --------------------------------------------------------------------------------
    def action_skip_cell(self) -> None:
        if self.app.skip_cell():  # type: ignore[attr-defined]
            self.log_view.event("warning", "skipping the current cell: its requests are cancelled and it is saved "
                                           "as skipped…")
        else:
            self.notify("no sweep is running", severity="warning", markup=False)

    def action_stop_sweep(self) -> None:
        if self.app.stop_sweep():  # type: ignore[attr-defined]
            self._stops += 1
            if self._stops == 1:
                self.log_view.event("warning", "stopping the sweep: no new requests; the in-flight ones finish, then "
                                               "the cell is saved as stopped (x again: cancel them)…")
            else:
                self.log_view.event("warning", "stopping now: the in-flight requests are cancelled…")
        else:
            self.notify("no sweep is running", severity="warning", markup=False)

    def quit_text(self, done: bool) -> str:
        """What quitting keeps, in one line: the finished cells on disk and the cell that was running when
        ctrl+q was pressed (saved as interrupted)."""
        if self.session_dir is None:
            return "the sweep had not started its first cell: nothing to save"
        if not done or self._quit_cell is None:  # the first ctrl+q: remember which cell it interrupts
            cur = self._cur
            self._quit_cell = cur if cur is not None and self.running and not self._cur_ended else None
            self._quit_finished = self._completed
        n = self._quit_finished
        where = short_path(self.session_dir)
        cur = self._quit_cell
        running = (f"cell {cur.index + 1} ({cur.label}) {'is' if done else 'will be'} saved as interrupted; "
                   if cur is not None else "")
        return (f"{n}/{self.total} cells completed, saved in {where}; {running}"
                f"continue with `servescope resume {where}`")

    def on_screen_resume(self) -> None:
        self.call_after_refresh(self._say_if_idle)  # a sweep being started or attached to is not idle by then

    def _say_if_idle(self) -> None:
        if self.progress.state == "idle" and self.is_current:  # F3 before any sweep: say why the screen is empty
            self.notify("no sweep running: compose one with F2, then ctrl+r runs it (F4: saved sessions)",
                        severity="information", timeout=4, markup=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "toggle_server":  # zoomed on another pane, the swap would not show: not offered
            return not zoomed_elsewhere(self, TelemetryPanel, ServerPanel)
        return True

    def action_toggle_server(self) -> None:
        """Swap the live server/GPU panel and the per-cell /metrics panel (zoomed on one: the other, zoomed)."""
        live, cells = self.query_one(TelemetryPanel), self.query_one(ServerPanel)
        live.display, cells.display = not live.display, live.display

    def action_back(self) -> None:
        self.app.switch_mode("compose")
