"""The what-if pane of a saved session (`w` on its detail screen): the capacity twin (servescope/engine/twin.py)
predicts cells that were not run. Pick a workload (the session's own, or a preset or TOML file typed in), the
loads (concurrencies) and the server's KV settings, press enter (or ctrl+r): the twin is fitted first when the
session has none (a worker; its time estimated from the session's cells), then the predicted curve is drawn over the measured one (hollow
markers on dashed lines, the output tok/s band shaded) and a table lists each load's predicted figures with
their bands, marking the loads that lie outside what was measured. Bad input is one line under the form."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.suggester import SuggestFromList
from textual.widgets import DataTable, Footer, Input, Label, Select, Static

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine import fields as f
from servescope.engine.twin import Twin, fit_session, fit_time_estimate, load_twin
from servescope.engine.twinpredict import Load, Prediction, predict, session_workloads
from servescope.engine.twinshape import Knobs
from servescope.engine.whatifcap import check_whatif_loads
from servescope.sessions.store import Session
from servescope.tui.safe import plain
from servescope.tui.widgets.curve import CurvePoint, PredictedPoint, PredictionCurve
from servescope.tui.widgets.table import Col, FitTable
from servescope.workloads.spec import PRESETS, Workload, resolve

# what a band is (the CLI's longer wording: twinpredict.BAND_NOTE), in two lines of an 80-column screen
BAND_NOTE = ("band: where ~95% of runs land: 2x the twin's error (fit residual, or the cell's own) and a run's "
             "spread, wider off the measured range")
FIT_NOTE = "fitting the twin to the session's cells ..."
KV_AS_MEASURED = "auto"
KV_OPTIONS = [("as measured", KV_AS_MEASURED), ("fp8", "fp8")]
RESIDUALS = (("output_tok_s", "tok/s"), ("ttft_ms.p50", "TTFT p50"), ("tpot_ms.p50", "TPOT p50"))
COLUMNS = (
    Col("load", "load", 0),  # `c=32*`: extrapolated (the line under the table says why)
    Col("tok", "output tok/s [band]", 0),
    Col("ttft", "TTFT p50 ms [band]", 1),
    Col("tpot", "TPOT p50 ms [band]", 1),
    Col("user", "tok/s/user", 3, right=True),
    Col("measured", "measured tok/s", 4, right=True),
    Col("note", "note", 2, min_width=14, max_width=160),  # last: it takes the width that is left
)


# ---- the question and what the worker says about it --------------------------------------------------------
@dataclass(frozen=True)
class Question:
    """What the form asks the twin."""

    workload: Workload
    loads: tuple[Load, ...]
    knobs: Knobs


@dataclass
class TwinProgress(Message):
    """The fit or the prediction moved on (a line for the status)."""

    ask: int
    text: str


@dataclass
class TwinFitted(Message):
    ask: int
    twin: Twin
    seconds: float


@dataclass
class WhatIfPredicted(Message):
    ask: int
    question: Question
    predictions: list[Prediction]
    seconds: float


@dataclass
class WhatIfFailed(Message):
    ask: int
    message: str  # one line


class Abandoned(Exception):
    """The screen closed while the twin was being fitted: the fit stops at its next step, nothing is stored."""


# ---- the form's parts --------------------------------------------------------------------------------------
def num(v: Any) -> str:
    """A figure with the digits that matter: 2,850 / 254 / 28.1 / 4.26; `-` when missing."""
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "-"
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def banded(v: Any, band: list[float] | None) -> str:
    """`2,850 [2,602-3,122]` (the band after the value)."""
    return num(v) + (f" [{num(band[0])}-{num(band[1])}]" if band else "")


def why_text(p: Prediction) -> str:
    """What lies outside the measured range, the load first (it is what tells the rows apart)."""
    first = sorted(p.why, key=lambda w: 0 if w.startswith(("c=", "rate ")) else 1)
    return "extrapolated: " + "; ".join(clean_text(w) for w in first) if p.extrapolated else ""


def prediction_row(p: Prediction, measured: float | None) -> list[str]:
    s = p.summary
    return [p.load.label + ("*" if p.extrapolated else ""), banded(s.output_tok_s, p.band.get("output_tok_s")),
            banded(s.ttft_ms.p50, p.band.get("ttft_ms")),
            banded(s.tpot_ms.p50, p.band.get("tpot_ms")), num(s.per_user_tok_s.mean),
            num(measured), why_text(p)]


def residual_text(twin: Twin) -> str:
    """`twin fitted to 2 cells, residual tok/s 1.2%, TTFT p50 0.5%, TPOT p50 1.4% (root mean square ...)`."""
    res = ", ".join(f"{label} {twin.residuals[k]:.1%}" for k, label in RESIDUALS if k in twin.residuals)
    cells = twin.fit_info.get("cells")
    n = f" to {len(cells)} cell{'s' if len(cells) != 1 else ''}" if isinstance(cells, list) else ""
    return f"twin fitted{n}, residual {res or '-'} (root mean square of ln(twin / measured))"


def parse_loads(text: str) -> tuple[Load, ...]:
    vals = f.int_list(text, "loads") if text.strip() else None
    if not vals:
        raise ServescopeError("loads: give one or more concurrencies, e.g. 1,4,16,32")
    return tuple(Load(concurrency=c) for c in vals)


def parse_knobs(gmu: str, kv: str, seqs: str) -> Knobs:
    g: float | None = None
    if gmu.strip():
        try:
            g = float(gmu)
        except ValueError:
            raise ServescopeError(f"gpu-memory-utilization: {gmu.strip()!r} is not a number; give one in (0, 1], "
                                  "e.g. 0.9 (empty: as measured)") from None
        if not 0 < g <= 1:
            raise ServescopeError(f"gpu-memory-utilization: {gmu.strip()} is outside (0, 1]; e.g. 0.9 "
                                  "(empty: as measured)")
    n: int | None = None
    if seqs.strip():
        if not seqs.strip().isdigit() or int(seqs) < 1:
            raise ServescopeError(f"max-num-seqs: {seqs.strip()!r} is not a whole number of at least 1 (empty: as "
                                  "measured)")
        n = int(seqs)
    return Knobs(gpu_memory_utilization=g, kv_cache_dtype=None if kv == KV_AS_MEASURED else kv, max_num_seqs=n)


def single_presets() -> list[str]:
    return [n for n, w in PRESETS.items() if w.kind == "single" and not w.dataset]


def measured_loads(session: Session) -> list[int]:
    cells = session.cells
    if not cells.height or "concurrency" not in cells.columns:
        return []
    return sorted({int(r["concurrency"]) for r in cells.to_dicts()
                   if r.get("concurrency") and (r.get("status") or "done") == "done"})


def default_loads(session: Session) -> str:
    """The session's measured concurrencies and two doublings beyond the highest (1,4 -> 1,4,8,16)."""
    ms = measured_loads(session) or [1, 4, 16]
    return ",".join(str(c) for c in [*ms, ms[-1] * 2, ms[-1] * 4])


class WhatIfScreen(Screen[None]):
    """Pushed by the session detail screen (`w`)."""

    BINDINGS = [Binding("escape", "back", "Back to the session"), Binding("ctrl+r", "predict", "Predict")]

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.own = session_workloads(session)
        self.twin: Twin | None = None
        self.twin_error = ""
        self.asked = 0  # the latest question's number: a late answer to an earlier one is dropped
        self.busy = False
        self.question: Question | None = None
        self.predictions: list[Prediction] = []
        self.measured: dict[int, CurvePoint] = {}  # concurrency -> the measured cell of the shown workload
        self.left = threading.Event()  # the screen is gone: a fit in progress stops at its next step
        self.summaries = session.summaries()  # one per cell row, in the rows' order
        self.fit_time = fit_time_estimate(session)  # e.g. "22-54 s": the fit's time on this machine, estimated
        try:
            self.twin = load_twin(session)
        except ServescopeError as e:
            self.twin_error = e.message

    # ---- layout --------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(self._head_text(), id="wi-head")
        names = [w.name for w in self.own]
        yield Horizontal(
            Label("workload", classes="wi-label"),
            Input(names[0] if names else "", placeholder="a preset or a .toml file", id="wi-workload",
                  suggester=SuggestFromList(list(dict.fromkeys([*names, *single_presets()])), case_sensitive=True)),
            Label("loads (users)", classes="wi-label"),
            Input(default_loads(self.session), placeholder="e.g. 1,4,16,32", id="wi-loads"),
            classes="field-row wi-row")
        yield Horizontal(
            Label("gpu mem util", classes="wi-label"),
            Input("", placeholder=self._measured_text("gpu"), id="wi-gmu"),
            Label("kv dtype", classes="wi-label"),
            Select([(plain(t), v) for t, v in KV_OPTIONS], value=KV_AS_MEASURED, allow_blank=False, id="wi-kv"),
            Label("max seqs", classes="wi-label"),
            Input("", placeholder=self._measured_text("seqs"), id="wi-seqs"),
            classes="field-row wi-row")
        yield Static("", id="wi-status", markup=False)
        yield PredictionCurve(id="wi-curve")
        yield FitTable(id="wi-table")
        yield Static("", id="wi-why", markup=False)  # shown when the highlighted load is extrapolated
        yield Static(plain(BAND_NOTE), id="wi-band")
        yield Footer(compact=True)

    def _twin_line(self) -> str:
        if self.twin_error:
            return self.twin_error
        if self.twin is None:
            return f"no twin yet: enter (ctrl+r) fits it to the session and predicts ({self.fit_time})"
        return residual_text(self.twin)

    def _measured_text(self, what: str) -> str:
        """A knob field's placeholder: empty means as measured (its value when the twin knows it)."""
        if self.twin is None:
            return "as measured"
        eng = self.twin.profile.engine
        return f"as run: {eng.gpu_memory_utilization:g}" if what == "gpu" else f"as run: {eng.max_num_seqs}"

    def on_mount(self) -> None:
        t = self.query_one("#wi-table", FitTable)
        t.set_columns(COLUMNS)
        t.sortable = False  # rows in load order
        t.border_title = "predicted cells"
        curve = self.query_one(PredictionCurve)
        curve.empty = ("nothing predicted yet: enter (or ctrl+r) predicts" if self.twin is not None else
                       f"nothing predicted yet: enter (or ctrl+r) fits the twin ({self.fit_time}) and predicts")
        self.query_one("#wi-why", Static).display = False
        self._show_measured(self.query_one("#wi-workload", Input).value.strip())
        self.query_one("#wi-loads", Input).focus()
        if self.twin is not None:  # fitted already: answer the default question at once
            self.action_predict()

    # ---- the question --------------------------------------------------------------------------------------
    def _workload(self, text: str) -> Workload:
        name = text.strip()
        if not name:
            raise ServescopeError("workload: name one (the session's: "
                                  f"{', '.join(w.name for w in self.own) or 'none'}; or a preset or a .toml file)")
        for w in self.own:  # the session's own, as it ran
            if w.name == name:
                return w
        ws = resolve(name)
        if len(ws) != 1:
            raise ServescopeError(f"workload: {name!r} names {len(ws)} workloads; give one")
        return ws[0]

    def collect(self) -> Question:
        """The question from the form (raises ServescopeError with a one-line message)."""
        w = self._workload(self.query_one("#wi-workload", Input).value)
        if w.kind != "single" or w.dataset:
            raise ServescopeError(f"workload {w.name!r}: the twin predicts single-request workloads with token "
                                  "lengths (no conversation, agent, trace or dataset)")
        loads = parse_loads(self.query_one("#wi-loads", Input).value)
        kv = self.query_one("#wi-kv", Select).value
        knobs = parse_knobs(self.query_one("#wi-gmu", Input).value, str(kv),
                            self.query_one("#wi-seqs", Input).value)
        return Question(w, loads, knobs)

    def _status(self, text: str, error: bool = False) -> None:
        st = self.query_one("#wi-status", Static)
        st.update(plain(text))
        st.set_class(error, "-error")

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_predict()

    def action_predict(self) -> None:
        if self.busy:
            self.notify("the twin is still working on the last question", severity="warning", markup=False)
            return
        try:
            q = self.collect()
        except ServescopeError as e:
            self._status(e.message, error=True)
            return
        self.asked += 1
        self.busy = True
        self._show_measured(q.workload.name)
        self._status(f"{FIT_NOTE} ({self.fit_time})" if self.twin is None else
                     f"predicting {len(q.loads)} load{'s' if len(q.loads) != 1 else ''} of {q.workload.name} ...")
        self._work(self.asked, q)

    @work(thread=True, exclusive=True, group="whatif", exit_on_error=False)
    def _work(self, ask: int, q: Question) -> None:
        """Fit (when there is no twin yet), then predict; everything reaches the screen as messages."""
        try:
            twin = self.twin
            if twin is None:
                t0 = time.monotonic()

                def progress(step: str) -> None:
                    if self.left.is_set():  # the app quits (or the pane closed): do not hold the process for the rest
                        raise Abandoned
                    self.post_message(TwinProgress(ask, f"{FIT_NOTE} ({self.fit_time}): {step}"))

                fit_session(self.session, progress=progress)
                twin = load_twin(self.session)
                if twin is None:
                    raise ServescopeError("the fit stored no profile in the session (is its folder writable?)")
                self.post_message(TwinFitted(ask, twin, time.monotonic() - t0))
                self.post_message(TwinProgress(ask, f"predicting {len(q.loads)} loads of {q.workload.name} ..."))
            t0 = time.monotonic()
            check_whatif_loads(twin, q.loads, q.knobs, where="loads: concurrency")  # a load the twin can hold
            preds = predict(twin, q.workload, list(q.loads), q.knobs)
            self.post_message(WhatIfPredicted(ask, q, preds, time.monotonic() - t0))
        except Abandoned:
            return
        except ServescopeError as e:
            self.post_message(WhatIfFailed(ask, e.message))
        except Exception as e:  # noqa: BLE001 - an unforeseen failure is one line on this screen, not a traceback
            self.post_message(WhatIfFailed(ask, f"the twin failed: {type(e).__name__}: {e}"))

    # ---- the answers ---------------------------------------------------------------------------------------
    @on(TwinProgress)
    def _progress(self, msg: TwinProgress) -> None:
        if msg.ask == self.asked:
            self._status(msg.text)

    @on(TwinFitted)
    def _fitted(self, msg: TwinFitted) -> None:
        self.twin, self.twin_error = msg.twin, ""
        self.query_one("#wi-head", Static).update(self._head_text())
        self.query_one("#wi-gmu", Input).placeholder = self._measured_text("gpu")
        self.query_one("#wi-seqs", Input).placeholder = self._measured_text("seqs")
        self.notify(f"fitted the twin in {msg.seconds:.1f} s; stored in {self.session.path.name}/twin/",
                    title="what if", timeout=6, markup=False)

    def _head_text(self) -> Content:
        info = self.session.info
        name = info.name if info.name is not None else self.session.path.name
        return Content("\n".join(clean_text(line) for line in (
            f"what if: {name} ({info.target.url}, model {info.model})", self._twin_line())))

    @on(WhatIfFailed)
    def _failed(self, msg: WhatIfFailed) -> None:
        if msg.ask != self.asked:
            return
        self.busy = False
        self.predictions = []
        self.query_one(PredictionCurve).predicted = ()
        self.query_one("#wi-table", FitTable).clear()
        self._note()
        self._status(" ".join(msg.message.split()), error=True)  # one line, however the message was written

    @on(WhatIfPredicted)
    def _predicted(self, msg: WhatIfPredicted) -> None:
        if msg.ask != self.asked:
            return
        self.busy = False
        self.question, self.predictions = msg.question, msg.predictions
        q = msg.question
        self._show_measured(q.workload.name)
        curve = self.query_one(PredictionCurve)
        curve.predicted = tuple(
            PredictedPoint(float(p.load.concurrency or 0), p.load.label, float(p.summary.output_tok_s or 0),
                           float(p.summary.per_user_tok_s.mean or 0),
                           *(p.band.get("output_tok_s") or (None, None)))
            for p in msg.predictions)
        t = self.query_one("#wi-table", FitTable)
        t.set_rows({p.load.label: prediction_row(p, self._measured_tok_s(p.load)) for p in msg.predictions})
        n = sum(p.extrapolated for p in msg.predictions)
        self._status(f"predicted {len(msg.predictions)} load{'s' if len(msg.predictions) != 1 else ''} of "
                     f"{q.workload.name} in {msg.seconds:.1f} s" + (f", {n} extrapolated (*)" if n else "")
                     + f"; server {q.knobs.label()}")
        self._note()

    def _measured_tok_s(self, load: Load) -> float | None:
        pt = self.measured.get(load.concurrency or -1)
        return pt.aggregate_tok_s if pt is not None else None

    def _show_measured(self, workload: str) -> None:
        """The session's completed, server-bound cells of `workload` on the chart (solid)."""
        rows = self.session.cells.to_dicts() if self.session.cells.height else []
        pts: dict[int, CurvePoint] = {}
        for row, s in zip(rows, self.summaries, strict=False):
            c = row.get("concurrency")
            if (s is None or row.get("workload") != workload or not c or (row.get("status") or "done") != "done"
                    or s.client_bound or row.get("server_variant")):
                continue
            pts.setdefault(int(c), CurvePoint(float(c), f"c={int(c)}", float(s.output_tok_s or 0),
                                              float(s.per_user_tok_s.mean or 0)))
        self.measured = pts
        curve = self.query_one(PredictionCurve)
        curve.measured = tuple(pts.values())
        what = "output tok/s vs load, measured (solid) and predicted" if pts else "output tok/s vs load, predicted"
        curve.title = f"{workload}: {what}" if workload else what

    @on(DataTable.RowHighlighted, "#wi-table")
    def _note(self) -> None:
        """Under the table: why the highlighted load is extrapolated (the load first; whole at 160 columns)."""
        t = self.query_one("#wi-table", FitTable)
        key = t.current_key
        p = next((p for p in self.predictions if p.load.label == key), None)
        why = self.query_one("#wi-why", Static)
        why.update(plain(f"{p.load.label}* {why_text(p)}" if p is not None and p.extrapolated else ""))
        why.display = p is not None and p.extrapolated

    def on_unmount(self) -> None:
        self.left.set()

    def action_back(self) -> None:
        self.app.pop_screen()
