"""Text panels of the run and session screens: sweep progress, the event log, the server panel and the
cell table."""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import RichLog

from servescope.core.kvbudget import fmt_concurrency
from servescope.core.results import CellResult, GpuWindow, ServerWindow
from servescope.sessions.measurement import MARKS, marks, precision_short, window_label
from servescope.tui.widgets.table import Col, FitTable, ellipsize
from servescope.tui.widgets.zoom import Zoomable

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None]) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    out = []
    for v in values:
        if v is None or math.isnan(v):
            out.append(" ")
        elif hi == lo:
            out.append(SPARK[0] if hi == 0 else SPARK[3])
        else:
            out.append(SPARK[int((v - lo) / (hi - lo) * (len(SPARK) - 1))])
    return "".join(out)


def short_path(path: Path | str) -> str:
    """A path as the user would type it: relative to the working directory when inside it, ~ for home."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    try:
        return "~/" + str(p.relative_to(Path.home()))
    except ValueError:
        return str(p)


def fmt_s(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60:02d}:{s % 60:02d}"


def fnum(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.{nd}f}"
    return str(v)


def shorter_forms(line: str) -> list[str]:
    """A line of prose and shorter forms of it, longest first, for a pane too narrow for it whole: without its
    closing advice (`; no NVIDIA driver or GPU here?`), then without its parentheses, then one `: ` part fewer at a time:
    `GPU: NVML is not available: nvmlInit failed (NVMLError_LibraryNotFound: ...); no NVIDIA driver or GPU here?`
    -> ... -> `GPU: NVML is not available: nvmlInit failed` -> `GPU: NVML is not available`."""
    forms = [line]
    for f in (line.split("; ")[0], re.sub(r" \([^()]*(\([^()]*\)[^()]*)*\)", "", line.split("; ")[0])):
        if f not in forms:
            forms.append(f)
    head = forms[-1].split(": ")
    forms += [": ".join(head[:k]) for k in range(len(head) - 1, 1, -1)]
    return forms


def fit_lines(t: Text, width: int, height: int) -> Text:
    """`t` as lines of at most `width` cells (cut ones end in `…`); when there are more lines than
    `height`, the last one shown says how many more there are (zoom the pane with `z` to see them)."""
    lines = list(t.split("\n", allow_blank=True))
    for ln in lines:
        ln.truncate(max(1, width), overflow="ellipsis")
    if height > 0 and len(lines) > height:
        more = len(lines) - height + 1
        lines = [*lines[: height - 1], Text(f"… {more} more line{'s' if more != 1 else ''} (z zooms)", style="dim")]
    return Text("\n").join(lines)


class SweepProgress(Widget):
    """Cell i of N with its workload and load, requests done/failed (and rate-limited, HTTP 429, when any), elapsed
    and ETA."""

    DEFAULT_CSS = """
    SweepProgress { height: 3; padding: 0 1; }
    SweepProgress .progress--bar { color: $success; }
    """
    COMPONENT_CLASSES = {"progress--bar"}

    state: reactive[str] = reactive("idle")  # idle | starting | running | completed | interrupted | failed
    cell_no: reactive[int] = reactive(0)
    total: reactive[int] = reactive(0)
    label: reactive[str] = reactive("")
    shape: reactive[str] = reactive("")
    done: reactive[int] = reactive(0)
    failed: reactive[int] = reactive(0)
    rate_limited: reactive[int] = reactive(0)  # the cell's requests answered HTTP 429 so far (not among `failed`)
    planned: reactive[int | None] = reactive(None)
    cell_elapsed: reactive[float] = reactive(0.0)
    sweep_elapsed: reactive[float] = reactive(0.0)
    eta_s: reactive[float | None] = reactive(None)
    fraction: reactive[float] = reactive(0.0)  # of the whole sweep
    detail: reactive[str] = reactive("")

    def render(self) -> Text:
        t = Text()
        if self.state == "idle":
            t.append("No sweep running. ", style="bold")
            t.append("Compose one (F2) and press ctrl+r, or open a saved session (F4).")
            return t
        if not self.total and self.state in ("failed", "interrupted"):  # it ended before any cell: no timers
            t.append("The sweep did not start" if self.state == "failed" else "The sweep was stopped before it "
                     "started", style="bold red" if self.state == "failed" else "bold")
            t.append(f"   [{self.state}]", style="bold")
            if self.detail:
                t.append(f"\n{self.detail}")
            t.append("\nFix it in Compose (F2), then ctrl+r.", style="dim")
            return t
        t.append(f"cell {self.cell_no}/{self.total}" if self.total else "starting", style="bold")
        if self.label:
            t.append(f"  {self.label}", style="bold")
        state = f"   [{self.state}]"
        if self.shape:  # a long shape (a conversation's) is cut so that the state stays on the first line
            room = self.content_size.width - t.cell_len - len(state) - 2 if self.content_size.width else 10_000
            shape = Text(f"  {self.shape}", style="dim")
            shape.truncate(max(3, room + 2), overflow="ellipsis")
            t.append_text(shape)
        t.append(state, style="bold")
        planned = f"/{self.planned}" if self.planned else ""
        cell = f"   cell {self.cell_elapsed:.1f} s"
        sweep = f"   sweep {fmt_s(self.sweep_elapsed)}"
        eta = f"  ETA {fmt_s(self.eta_s) if self.state == 'running' else '-'}"
        line = f"requests {self.done}{planned} done, {self.failed} failed"
        if self.rate_limited:  # counted apart from the failed: whole where the line has room, else shorter forms
            n = self.rate_limited
            room = self.content_size.width or 10_000
            forms = [line + f", {n} rate-limited (HTTP 429)" + cell + sweep + eta,
                     line + f", {n} HTTP 429" + cell + sweep + eta, line + f", {n} HTTP 429" + cell + eta]
            line = next((f for f in forms if len(f) <= room), forms[-1])
        else:
            line += cell + sweep + eta
        t.append("\n" + line)
        if self.detail:
            t.append(f"   {self.detail}", style="dim")
        width = max(10, self.content_size.width - 7)
        filled = int(round(max(0.0, min(1.0, self.fraction)) * width))
        t.append("\n")
        t.append("█" * filled, style=self.get_component_rich_style("progress--bar"))
        t.append("░" * (width - filled), style="dim")
        t.append(f" {self.fraction * 100:3.0f}%")
        return t


LOG_LINES = 2000  # the event log keeps its newest entries


class EventLog(RichLog, Zoomable):
    """Notices, cell results and request errors (each distinct error once, counted at the cell's end). Its
    entries are kept, and wrapped again to the new width when the log is zoomed or the terminal resized."""

    DEFAULT_CSS = """
    EventLog { height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(wrap=True, markup=False, highlight=False, max_lines=LOG_LINES, min_width=20, **kwargs)
        self._seen: dict[tuple[int, str, str], int] = {}
        self._entries: deque[Text] = deque(maxlen=LOG_LINES)
        self._wrapped_at = 0  # the width the entries were last wrapped to (0: not yet known)

    def event(self, level: str, text: str) -> None:
        style = {"error": "bold red", "warning": "yellow", "ok": "green"}.get(level, "")
        mark = {"error": "✗ ", "warning": "! ", "ok": "✓ "}.get(level, "· ")
        entry = Text(mark + text, style=style)
        self._entries.append(entry)
        self.write(entry)

    def on_resize(self, event: events.Resize) -> None:
        """Wrap every entry again at the new width (RichLog wraps a line once, when it is written)."""
        width = self.scrollable_content_region.width
        if not self._size_known or width <= 0:  # RichLog writes what waited for the first size itself
            self._wrapped_at = width
            return
        if width == self._wrapped_at:
            return
        self._wrapped_at = width
        at_end = self.scroll_y >= self.max_scroll_y
        RichLog.clear(self)
        for entry in self._entries:
            self.write(entry, scroll_end=False)
        if at_end:
            self.scroll_end(animate=False, immediate=False, x_axis=False)

    def clear(self) -> Self:
        self._entries.clear()
        return super().clear()

    def request_errors(self, cell_no: int, errors: Sequence[tuple[str, str]]) -> None:
        for status, err in errors:
            key = (cell_no, status, err)
            n = self._seen.get(key, 0)
            self._seen[key] = n + 1
            if n == 0:
                self.event("error", f"cell {cell_no}: request {status}: {err or '(no message)'} (repeats are counted)")

    def cell_errors(self, cell_no: int) -> None:
        for (c, status, err), n in sorted(self._seen.items(), key=lambda kv: -kv[1]):
            if c == cell_no and n > 1:
                self.event("error", f"cell {cell_no}: {n} x {status}: {err or '(no message)'}")

    def reset(self) -> None:
        self.clear()
        self._seen.clear()


SERVER_ROWS = (
    ("requests_success", "requests", 0),
    ("preemptions", "preemptions", 0),
    ("queue_ms_mean", "queue ms (mean)", 1),
    ("ttft_ms_mean", "server TTFT ms", 1),
    ("itl_ms_mean", "server ITL ms", 2),
    ("e2e_ms_mean", "server E2E ms", 0),
    ("kv_cache_tokens", "KV cache tokens", 0),
    ("prefix_cache_hit_rate", "prefix hit rate", 2),
)


class ServerPanel(Zoomable):
    """What the server's /metrics said during each finished cell (vLLM deltas); a sparkline per metric
    across cells. Live KV-cache/running/waiting gauges come with the telemetry work."""

    can_focus = True  # so it can be zoomed (z)

    DEFAULT_CSS = """
    ServerPanel { height: auto; padding: 0 1; }
    """

    # the `server` windows (or their dicts), one per finished cell
    cells: reactive[tuple[ServerWindow | Mapping[str, Any], ...]] = reactive(tuple, layout=True)
    metrics_available: reactive[bool | None] = reactive(None, layout=True)
    client_ttft: reactive[tuple[float | None, ...]] = reactive(tuple)  # client mean TTFT per cell
    empty: reactive[str] = reactive("waiting for the first finished cell…", layout=True)  # without a cell
    # whose figures the value column shows: the `at`-th of `cells` (-1: the newest), named by `at_label`
    # ("cell 2"); the sparklines always run over every cell
    at: reactive[int] = reactive(-1, layout=True)
    at_label: reactive[str] = reactive("", layout=True)

    def render(self) -> Text:
        return fit_lines(self._text(), self.content_size.width, self.content_size.height)

    def full_text(self) -> str:
        """Everything the panel has to say, uncut (what zooming it shows, at any width)."""
        return self._text(compact=False).plain if isinstance(self, TelemetryPanel) else self._text().plain

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._text().split("\n", allow_blank=True))  # all of it: a max-height cuts it with "… more"

    def _text(self) -> Text:
        t = Text("server /metrics per cell" + (f": {self.at_label}" if self.at_label else ""), style="bold")
        if self.metrics_available is False:
            t.append("\nthis server has no vLLM /metrics: client-side numbers only", style="dim")
            return t
        if not self.cells:
            t.append("\n" + self.empty, style="dim")
            return t
        cells = [c if isinstance(c, ServerWindow) else ServerWindow.from_dict(c) for c in self.cells]
        at = self.at
        shown = cells[at] if -len(cells) <= at < len(cells) else ServerWindow()  # a cell without one: "-"
        for key, label, nd in SERVER_ROWS:
            series = [getattr(c, key) for c in cells]
            if all(v is None for v in series):
                continue
            t.append(f"\n{label:<16}{fnum(getattr(shown, key), nd):>10}  ")
            t.append(sparkline([float(v) if v is not None else None for v in series][-20:]), style="cyan")
        ttfts = self.client_ttft
        cl = ttfts[at] if -len(ttfts) <= at < len(ttfts) else None
        st = shown.ttft_ms_mean
        if cl is not None and st is not None:
            t.append(f"\nclient - server TTFT{cl - st:>+9.1f} ms", style="dim")
        return t


# How a cell was measured (sessions/measurement.py), the cell table's last columns: the window its figures are over,
# the precision it reached (--precision), its probes' TTFT and E2E p50 (--probe-rate)
MEASURE_COLUMNS = ("window", "precision", "probe TTFT p50", "probe E2E p50")


def measure_values(s: CellResult) -> tuple[str, ...]:
    p = s.probes
    return (window_label(s), precision_short(s.precision) or "-", fnum(p.ttft_ms.p50) if p is not None else "-",
            fnum(p.e2e_ms.p50, 0) if p is not None else "-")


CELL_COLUMNS = ("#", "workload", "load", "status", "ok/fail", "out tok/s", "per-user tok/s (mean)", "TTFT p50",
                "TTFT p99", "TPOT p50", "E2E p50", "client", *MEASURE_COLUMNS)
CLIENT_BOUND_STATUS = "client BOUND"  # the end of a cell's status when the load generator, not the server, was the limit


OK_FAIL_429 = "ok/fail/429"  # the ok/fail column's header when some cell of the table got HTTP 429s


def cell_row(index: int, workload: str, load: str, status: str,
             summary: CellResult | Mapping[str, Any] | None, rate_limited: bool = False) -> tuple[str, ...]:
    """A cell's table row; "-" where the cell has no summary (a dict is read as a stored summary). A client-bound
    cell's status is `done, client BOUND` (or `stopped, client BOUND`), shown as `bound` (`stopped`) where the pane
    has no room for it whole (short_status).
    `rate_limited`: the ok/fail column counts the requests answered HTTP 429 third (`5/1/14`; the table's header
    then reads OK_FAIL_429)."""
    s = _summary(summary)
    if not isinstance(s, CellResult):
        return (str(index + 1), workload, load, status, *["-"] * (len(CELL_COLUMNS) - 4))
    status = ", ".join([status, *marks(s)])  # imprecise, saturated (sessions/measurement.py)
    if s.client_bound:  # the load generator, not the server, limited it (core/health.py)
        status = f"{status}, {CLIENT_BOUND_STATUS}"
    return (
        str(index + 1), workload, load, status,
        f"{s.requests_ok}/{s.requests_failed}" + (f"/{s.requests_rate_limited or 0}" if rate_limited else ""),
        fnum(s.output_tok_s, 1), fnum(s.per_user_tok_s.mean), fnum(s.ttft_ms.p50), fnum(s.ttft_ms.p99),
        fnum(s.tpot_ms.p50, 2), fnum(s.e2e_ms.p50, 0), _verdict(s), *measure_values(s),
    )




def _summary(summary: CellResult | Mapping[str, Any] | None) -> CellResult | None:
    s = CellResult.from_dict(summary) if isinstance(summary, Mapping) and summary else summary
    return s if isinstance(s, CellResult) else None


def short_status(status: str) -> str:
    """A cell's status where the pane has no room for it whole: a completed cell whose client was the limit reads
    `bound` (the pane's title explains it; zoomed, `done, client BOUND`), not `done,…`; any other cell keeps its
    own status (`stopped, client BOUND` reads `stopped`: that it ended early matters more)."""
    if not status.endswith(CLIENT_BOUND_STATUS):
        own, marked = _marked(status)
        return marked if own == "done" and marked else status  # `saturated` says more than `done…`
    own, _ = _marked(status[: -len(CLIENT_BOUND_STATUS)].rstrip(", "))
    return "bound" if own == "done" else own


def _marked(status: str) -> tuple[str, str]:
    """`done, imprecise, saturated` -> (`done`, `imprecise, saturated`): a status and its measurement marks."""
    parts = status.split(", ")
    n = len(parts)
    while n > 1 and parts[n - 1] in MARKS:
        n -= 1
    return ", ".join(parts[:n]), ", ".join(parts[n:])


def _verdict(s: CellResult) -> str:
    """The client's verdict (core/health.py), `BOUND` in capitals: that cell measured the load generator."""
    c = s.client
    if c is None or not c.verdict:
        return "-"
    return "BOUND" if c.verdict == "bound" else c.verdict


# The cell table's columns, declared once for the Run and Session screens. The pane exists for each cell's output
# tok/s (`keep`: never left out); then which cell it is (#, load), its TTFT p50, its status (cut to `done…` or its
# short form `bound`, which zoom shows whole) and its workload, each widened back to whole once placed when there is
# room; the rest zooms (lower priority stays longest).
# Each latency header names its statistic and unit.
CELL_COLS = (
    Col("#", "#", 1, right=True), Col("workload", "workload", 5, min_width=8, max_width=28, grow_at=5),
    Col("load", "load", 2, min_width=6, max_width=20),
    Col("status", "status", 4, min_width=4, grow_at=4, short=short_status),
    Col("ok/fail", "ok/fail", 6, right=True), Col("out tok/s", "out tok/s", 0, right=True, keep=True),
    Col("per-user tok/s (mean)", "per-user tok/s (mean)", 7, right=True), Col("TTFT p50", "TTFT p50 ms", 3, right=True),
    Col("TTFT p99", "TTFT p99 ms", 8, right=True), Col("TPOT p50", "TPOT p50 ms", 9, right=True),
    Col("E2E p50", "E2E p50 ms", 10, right=True), Col("client", "client", 11),
    Col("window", "window", 12), Col("precision", "precision", 13, right=True),
    Col("probe TTFT p50", "probe TTFT p50 ms", 14, right=True), Col("probe E2E p50", "probe E2E p50 ms", 15, right=True),
)
# A saved session of several workloads: which workload a cell ran comes right after its figure (a cut name
# widens back to whole once TTFT p50 is placed), and the cell number last.
_MULTI = {"out tok/s": 0, "workload": 1, "load": 2, "TTFT p50": 3, "status": 4, "#": 5}
CELL_COLS_MULTI = tuple(replace(c, priority=_MULTI.get(c.key, c.priority),
                                grow_at=_MULTI["TTFT p50"] if c.key == "workload" else c.grow_at) for c in CELL_COLS)


class CellTable(FitTable):
    """One row per finished (or skipped) cell; the columns that fit (`z` zooms to see them all). Its sort key is
    left out of the footer (F1 lists it), so that the screen's keys and the app's F1-F3 fit at 80 columns."""

    BINDINGS = [Binding("o", "sort_next", "Sort", show=False), Binding("O", "sort_reverse", "Reverse sort", show=False)]

    DEFAULT_CSS = """
    CellTable { height: 1fr; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # each row's cell as given (its summary read), so that every row can count its 429s once one cell has any
        self.cells: dict[str, tuple[int, str, str, str, CellResult | None]] = {}

    def on_mount(self) -> None:
        self.set_columns(CELL_COLS)

    @property
    def rate_limited(self) -> bool:
        """Some cell of the table got HTTP 429s: the ok/fail column counts them third (`ok/fail/429`)."""
        return any(s is not None and s.requests_rate_limited for *_, s in self.cells.values())

    def set_columns(self, cols: Sequence[Col]) -> None:
        super().set_columns(_ok_fail_header(cols, self.rate_limited))

    def set_cell(self, index: int, workload: str, load: str, status: str,
                 summary: CellResult | Mapping[str, Any] | None) -> None:
        before = self.rate_limited
        self.cells[str(index)] = (index, workload, load, status, _summary(summary))
        limited = self.rate_limited
        if limited == before:
            self.put_row(str(index), cell_row(index, workload, load, status, summary, limited))
            return
        # the first cell with 429s (or the last one gone): every row and the header change together
        self.cols = _ok_fail_header(self.cols, limited)
        self.set_rows({k: cell_row(*cell, rate_limited=limited) for k, cell in self.cells.items()})

    def remove_key(self, key: str) -> None:
        self.cells.pop(key, None)
        super().remove_key(key)

    def clear(self, columns: bool = False) -> CellTable:
        self.cells.clear()
        if not columns:  # a new sweep's table starts without the 429 count
            self.cols = _ok_fail_header(self.cols, False)
        super().clear(columns=columns)
        return self


def _ok_fail_header(cols: Sequence[Col], rate_limited: bool) -> list[Col]:
    """The cell table's columns with the ok/fail header that says whether its rows count 429s third."""
    return [replace(c, label=OK_FAIL_429 if rate_limited else "ok/fail") if c.key == "ok/fail" else c for c in cols]


def gpu_reading(g: Mapping[str, object]) -> str:
    """One live NVML reading: 'GPU0 61.2/80 GiB 97% 412 W 1,980 MHz 71°C'."""
    def num(key: str) -> float | None:
        v = g.get(key)
        return float(v) if isinstance(v, (int, float)) and not math.isnan(float(v)) else None

    parts = [f"GPU{g.get('gpu', '?')}"]
    used, total = num("mem_used_gib"), num("mem_total_gib")
    if used is not None:
        parts.append(f"{used:.1f}/{total:.0f} GiB" if total else f"{used:.1f} GiB")
    for key, fmt in (("util_pct", "{:.0f}%"), ("power_w", "{:.0f} W"), ("sm_clock_mhz", "{:,.0f} MHz"),
                     ("temp_c", "{:.0f}°C")):
        v = num(key)
        if v is not None:
            parts.append(fmt.format(v))
    return " ".join(parts)


def gpu_cell_line(gpu: GpuWindow | Mapping[str, object] | None) -> str:
    """A finished cell's GPU summary: energy, Wh per 1M output tokens, cost, power; or why there is none.
    A dict is read as a GPU window (a session's `gpu` table, when NVML was absent, reads as one)."""
    g = GpuWindow.from_dict(gpu) if isinstance(gpu, Mapping) and gpu else gpu
    if not isinstance(g, GpuWindow):
        return "GPU: not recorded for this cell"
    if not g.available:
        return f"GPU: {g.reason or 'NVML not available'}"
    parts = []
    if g.energy_wh is not None:
        parts.append(f"{g.energy_wh:.2f} Wh")
    if g.wh_per_1m_output_tokens is not None:
        parts.append(f"{g.wh_per_1m_output_tokens:,.0f} Wh/1M tok")
    if g.cost_usd_per_1m_output_tokens is not None:
        parts.append(f"${g.cost_usd_per_1m_output_tokens:.3f}/1M tok")
    if g.power_w_mean is not None:
        parts.append(f"{g.power_w_mean:.0f} W mean")
    if g.mem_used_gib_peak is not None:
        parts.append(f"{g.mem_used_gib_peak:.1f} GiB peak")
    return "GPU: " + (", ".join(parts) if parts else "no samples in this cell")


def _tokens(n: int) -> str:
    """A token count in few characters: 6,506,660 -> '6.5M', 12,752 -> '12.8k', 373,296 -> '373k', 900 -> '900'."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= size:
            v = n / size
            return f"{v:.1f}{suffix}" if v < 100 else f"{v:.0f}{suffix}"
    return str(n)


def budget_line(kv: Mapping[str, object] | None, workload: str | None, concurrency: int | None,
                short: bool = False, named: bool = True) -> str:
    """'KV cache 12,752 tokens: sharegpt fits 16.6 at once, c=32 is over it: expect queueing'. `kv` is the KV
    budget as the engine states it (core.kvbudget.KvBudgetMeta, the sweep's max_concurrency_by_workload). `short`:
    the same in about 38 columns, for a half-width pane ('KV 12.8k tok: sharegpt fits c=16.6; c=32 over');
    `named=False` leaves the workload's name out of it (the running cell's: 'KV 12.8k tok: fits c=16.6; c=32 over':
    up to 16.6 users at once)."""
    def count(key: str) -> int:
        v = kv.get(key) if kv else None
        return int(v) if isinstance(v, (int, float)) else 0

    if not kv or kv.get("kv_cache_tokens") is None:
        return ""
    line = f"KV {_tokens(count('kv_cache_tokens'))} tok" if short else f"KV cache {count('kv_cache_tokens'):,} tokens"
    if kv.get("slots"):  # llama.cpp: the context is shared by its parallel slots
        line = (f"KV {count('slots')} slots x {_tokens(count('slot_tokens'))} tok" if short
                else f"KV {count('slots')} slots x {count('slot_tokens'):,} tokens")
    by = kv.get("max_concurrency_by_workload") or {}
    if not isinstance(by, dict):
        by = {}
    mc = by.get(workload) if workload else None
    if isinstance(mc, (int, float)):
        line += (f": {workload} fits " if named or not short else ": fits ") + (
            f"c={fmt_concurrency(mc)}" if short else f"{fmt_concurrency(mc)} at once")
        if concurrency is not None and short:
            line += f"; c={concurrency} " + ("ok" if concurrency <= mc else "over")
        elif concurrency is not None:
            line += f", c={concurrency} " + ("fits" if concurrency <= mc else "is over it: expect queueing")
    elif by:
        line += (": fits " if short else ": max concurrency ") + ", ".join(
            f"{k} {fmt_concurrency(v)}" for k, v in by.items())
    return line


def budget_short_forms(kv: Mapping[str, object] | None, workload: str | None,
                       concurrency: int | None) -> tuple[str, str]:
    """The KV budget's shorter lines, longest first (TelemetryPanel.budget_short): named, then without the name."""
    return (budget_line(kv, workload, concurrency, short=True),
            budget_line(kv, workload, concurrency, short=True, named=False))


class TelemetryPanel(Zoomable):
    """Server gauges with a sparkline each (live samples on the Run screen, one point per cell on a saved
    session), the GPU line(s) or why NVML is absent, and the KV budget with the concurrency it allows."""

    DEFAULT_CSS = """
    TelemetryPanel { height: auto; padding: 0 1; }
    """

    can_focus = True  # so it can be zoomed (z)

    title: reactive[str] = reactive("server live (/metrics)")
    # (label, value shown, values for the sparkline)
    series: reactive[tuple[tuple[str, str, tuple[float | None, ...]], ...]] = reactive(tuple, layout=True)
    note: reactive[str] = reactive("", layout=True)  # e.g. "no /metrics: client-side numbers only"
    gpu_lines: reactive[tuple[str, ...]] = reactive(tuple, layout=True)
    budget: reactive[str] = reactive("", layout=True)
    # shorter forms of the budget, longest first (budget_line's short ones), for a pane too narrow for it whole
    budget_short: reactive[tuple[str, ...]] = reactive(tuple, layout=True)

    def render(self) -> Text:
        return fit_lines(self._text(), self.content_size.width, self.content_size.height)

    def full_text(self) -> str:
        """Everything the panel has to say, uncut (what zooming it shows, at any width)."""
        return self._text(compact=False).plain if isinstance(self, TelemetryPanel) else self._text().plain

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._text(compact=False).split("\n", allow_blank=True))  # all of it: a max-height cuts it with "… more"

    def _text(self, compact: bool = True) -> Text:
        width = max(20, self.content_size.width)
        t = Text(self.title, style="bold")
        if self.note:
            t.append("\n" + self.note, style="dim")
        full = 1 + len(self.series) + (1 if self.note else 0) + len(self.gpu_lines) + (1 if self.budget else 0)
        height = self.content_size.height
        if compact and height and full > height and width >= 36 and len(self.series) > 1:
            # short pane: two gauges a row ("KV cache 0.2% ▂▂▇█  running 4 ▂▂██")
            half = (width - 2) // 2
            for k in range(0, len(self.series), 2):
                t.append("\n")
                for j, (label, value, vals) in enumerate(self.series[k:k + 2]):
                    head = f"{label[:11]} {value}"
                    sw = max(2, half - len(head) - 1)
                    t.append(("  " if j else "") + head + " ")
                    t.append(f"{sparkline(list(vals)[-sw:]):<{sw}}", style="cyan")
        else:
            spark_w = max(4, width - 24)
            for label, value, vals in self.series:
                t.append(f"\n{label:<12}{value:>9}  ")
                t.append(sparkline(list(vals)[-spark_w:]), style="cyan")
        if not self.series and not self.note:
            t.append("\nwaiting for the first sample…", style="dim")
        for line in self.gpu_lines:
            t.append("\n" + next((f for f in shorter_forms(line) if len(f) <= width), ellipsize(line, width)),
                     style="dim" if "NVML" in line or "not" in line else "")
        if self.budget:
            forms = (self.budget, *self.budget_short) if compact else (self.budget,)
            budget = next((f for f in forms if len(f) <= width), forms[-1])
            t.append("\n" + budget, style="yellow" if "over it" in self.budget else "")
        return t
