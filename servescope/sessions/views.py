"""A saved session's cells as the comparison and the report read them: `CellView` (a cell's plan row and its
typed summary), the SLOs a session is judged by, and the number formats every table shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import msgspec
import polars as pl

from servescope.core.jsontypes import JsonObject
from servescope.core.metrics import per_request
from servescope.core.results import CellResult
from servescope.core.secrets import redact_command
from servescope.core.slo import SLO_ATTAINMENT, slo_met, slo_terms
from servescope.core.textsafe import clean_text
from servescope.sessions import series_name
from servescope.sessions.store import Session

N = TypeVar("N", int, float)
M = TypeVar("M")

# "usable" in the field reports (seed 004): TTFT < 3 s and > 20 tok/s per user. Used when no SLOs were set.
DEFAULT_SLOS: dict[str, float] = {"ttft_ms": 3000.0, "per_user_tok_s": 20.0}


def fmt_num(v: float | None) -> str:
    """Numbers as a person writes them in a table: 3,373 / 183.7 / 6.12 / 0.052."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1 or a == 0:
        return f"{v:.2f}"
    return f"{v:.3g}"


def fmt_pct(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:+.1f}%"


def slo_text(slos: Mapping[str, float]) -> str:
    if not slos:
        return "none"
    return ", ".join(slo_terms(slos)) + f" for at least {SLO_ATTAINMENT:.0%} of requests"


class LoadPlan(NamedTuple):
    """The load a cell was planned with (its row's columns in cells.parquet), reduced to what tells two loads
    apart: comparisons join sessions' cells on (workload, LoadPlan), never on the label people read."""

    concurrency: int | None
    rate: float | None
    arrival: str | None = None  # open loops only; "gamma" with its burstiness
    burstiness: float | None = None
    ramp_s: float | None = None
    pattern: str | None = None
    max_concurrency: int | None = None

    @classmethod
    def of_row(cls, row: Mapping[str, object]) -> LoadPlan:
        conc, rate = _opt_int(row.get("concurrency")), _opt_float(row.get("rate"))
        ramp = _opt_float(row.get("ramp_s")) or None
        if rate is None:
            return cls(conc, None, ramp_s=ramp)
        arrival = str(row.get("arrival") or "poisson")
        burst = _opt_float(row.get("burstiness")) if arrival == "gamma" else None
        pattern = row.get("pattern")
        return cls(None, rate, arrival, burst, ramp, str(pattern) if pattern else None,
                   _opt_int(row.get("max_concurrency")) or None)


class ReadsPlan:
    """`concurrency` and `rate` read from a `plan` (a CellView's, a ComparedCell's), never stored beside it."""

    plan: LoadPlan

    @property
    def concurrency(self) -> int | None:
        return self.plan.concurrency

    @property
    def rate(self) -> float | None:
        return self.plan.rate


@dataclass
class CellView(ReadsPlan):
    """A saved cell as readers take it: its plan (`plan`, the load; `workload`, `load` the label people read)
    and its result (`summary`, the CellResult as stored). Everything else is a function of those two."""

    index: int
    workload: str
    load: str
    plan: LoadPlan  # the load as planned: what comparisons join on
    status: str
    reason: str
    summary: CellResult = field(default_factory=CellResult)
    base: str = ""  # the workload's own name (without the server variant)
    variant: str = ""  # the server variant's arguments ("" when the server was not relaunched per variant)
    has_summary: bool = True  # False for a cell that never ran (skipped)
    slo_unknown: bool = False  # no per-request data to judge it against other SLOs than its own

    def __post_init__(self) -> None:
        if not self.base:
            self.base = self.workload

    @property
    def key(self) -> tuple[str, LoadPlan]:
        """What comparisons join on: the workload (with its server variant) and the planned load."""
        return (self.workload, self.plan)

    @property
    def x(self) -> float | None:
        return float(self.concurrency) if self.concurrency is not None else self.rate

    def summary_dict(self) -> JsonObject:
        """The summary as stored (plus `slo_unknown` when set), {} for a cell without one."""
        if not self.has_summary:
            return {}
        d = self.summary.to_dict()
        if self.slo_unknown:
            d["slo_unknown"] = True
        return d


def _opt_int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


def _opt_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


class PlannedLoad(NamedTuple):
    """The loads a session's cells were planned with, each value once in plan order: read from the cells'
    plans ([[cells]]), the one place a session stores its load."""

    concurrency: list[int]
    rates: list[float]
    arrivals: list[str]
    requests: list[int]
    durations_s: list[float]
    warmups: list[int]

    def text(self) -> str:
        """`concurrency 1, 8; 32 requests per cell; 2 warmup requests`, as the report's set-up states it."""
        arrival = f" {'/'.join(self.arrivals)}" if self.arrivals else ""
        out = (f"concurrency {', '.join(map(str, self.concurrency))}" if self.concurrency else
               f"rates {', '.join(f'{r:g}' for r in self.rates)}/s{arrival}" if self.rates else
               "each workload's defaults")
        if self.requests:
            out += f"; {'-'.join(str(n) for n in _ends(self.requests))} requests per cell"
        if self.durations_s:
            out += f"; {'-'.join(f'{d:g}' for d in _ends(self.durations_s))} s per cell"
        if any(self.warmups):
            out += f"; {'-'.join(str(n) for n in _ends(self.warmups))} warmup requests"
        return out


def _ends(values: list[N]) -> list[N]:
    """One value, or the smallest and the largest."""
    return values[:1] if len(set(values)) == 1 else [min(values), max(values)]


def planned_load(session: Session) -> PlannedLoad:
    """The session's loads from its cells' plans (a session without planned cells: from its cells' rows)."""
    planned: Sequence[Mapping[str, object]] = [msgspec.structs.asdict(c) for c in session.info.cells]
    if not planned and session.cells.height:
        planned = session.cells.to_dicts()

    def distinct(key: str, conv: Callable[[object], M | None]) -> list[M]:
        out: list[M] = []
        for c in planned:
            v = conv(c.get(key))
            if v is not None and v not in out:
                out.append(v)
        return out

    return PlannedLoad(distinct("concurrency", _opt_int), distinct("rate", _opt_float),
                       distinct("arrival", _opt_str),
                       distinct("requests_planned", _opt_int), distinct("duration_s_planned", _opt_float),
                       distinct("warmup", _opt_int))


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def workload_order(session: Session) -> list[str]:
    return session.info.workload_names


def cell_views(session: Session, include_skipped: bool = False) -> list[CellView]:
    """The session's cells in plan order (workload order, then load), with their summaries."""
    rows = session.cells.to_dicts() if session.cells.height else []
    summaries = session.summaries()
    views: list[CellView] = []
    for row, summ in zip(rows, summaries or [None] * len(rows), strict=False):
        status = str(row.get("status") or "done")
        if summ is None and not include_skipped:
            continue
        conc = _opt_int(row.get("concurrency"))
        rate = _opt_float(row.get("rate"))
        label = row.get("load_label") or (f"c={conc}" if conc is not None else
                                          f"rate {rate:g}/s" if rate is not None else "load not recorded")
        base = str(row.get("workload"))
        variant = redact_command(clean_text(str(row.get("server_variant") or "")))  # older sessions: no secret
        views.append(CellView(int(row.get("index", len(views))), series_name(base, variant), str(label),
                              LoadPlan.of_row(row), status, clean_text(str(row.get("reason") or "")),
                              summ or CellResult(), base, variant, has_summary=summ is not None))
    order = {w: i for i, w in enumerate(workload_order(session))}
    vorder: dict[str, int] = {}
    for v in sorted(views, key=lambda v: v.index):
        vorder.setdefault(v.variant, len(vorder))
    views.sort(key=lambda v: (order.get(v.base, len(order)), vorder[v.variant], v.rate is not None, v.x or 0.0,
                              v.index))
    return views


def cell_counts(session: Session) -> tuple[int, int]:
    """(completed, planned): the cells saved as `done` and the cells the sweep planned, as every list of
    sessions shows them ("2/3": the app's Sessions screen and `servescope sessions` alike). A skipped,
    stopped or interrupted cell is planned but not completed. A tune session (`servescope tune`): the cells its
    search measured of its budget (each cell a session of its own under cells/)."""
    tune = session.info.tune if session.info.kind == "tune" else None
    if tune is not None:
        return len(tune.path), tune.budget
    planned = session.info.cells
    if planned:
        return sum(1 for c in planned if c.status == "done"), len(planned)
    st = session.cells["status"].to_list() if "status" in session.cells.columns else []  # no plan recorded
    return sum(1 for x in st if (x or "done") == "done"), session.cells.height


def status_text(session: Session) -> str:
    """The session's status as lists show it: `running (pid 123, cell 5/12)` while its runner lives,
    `interrupted` (and why, when it says running but its runner is gone), else the stored status."""
    st = session.status
    if st == "running":
        r = session.runner
        planned = session.info.cells
        finished = sum(1 for c in planned if c.status not in ("planned", "running"))
        at = f", cell {min(finished + 1, len(planned))}/{len(planned)}" if planned else ""
        stuck = f"; {r.reason}" if r.reason else ""
        return f"running (pid {r.pid or '?'}{at}{stuck})"
    if st == "interrupted" and session.info.status == "running":  # its runner died mid-sweep
        return f"interrupted (runner pid {session.runner.pid or '?'} gone)"
    return st


def session_slos(session: Session) -> dict[str, float]:
    return {str(k): float(v) for k, v in session.info.slos.items()}


def choose_slos(sessions: Sequence[Session], slos: Mapping[str, float] | None) -> tuple[dict[str, float], str]:
    """The SLOs a report or comparison judges by, and where they came from."""
    if slos:
        return dict(slos), "given on the command line"
    first = session_slos(sessions[0]) if sessions else {}
    if first:
        return first, "recorded with the session" if len(sessions) == 1 else "recorded with the first session"
    return dict(DEFAULT_SLOS), "the default, as no SLOs were recorded: usable = TTFT under 3 s and 20 tok/s per user"


def apply_slos(session: Session, views: list[CellView], slos: Mapping[str, float]) -> None:
    """Re-judge each cell against `slos` from its raw requests (slo_met_fraction, goodput_req_s).

    Cells without per-request data keep their recorded values when the SLOs are the session's own, and
    lose them otherwise (marked `slo_unknown`)."""
    own = session_slos(session) == dict(slos)
    for v in views:
        df = session.requests(v.index)
        if df.height == 0 or "sent_ns" not in df.columns:
            if not own:
                v.summary = msgspec.structs.replace(v.summary, slo_met_fraction=None, goodput_req_s=None)
                v.slo_unknown = True
            continue
        if "warmup" in df.columns:
            df = df.filter(~pl.col("warmup"))
        if "in_window" in df.columns:  # the requests the figures are over: the cell's steady window's
            df = df.filter(pl.col("in_window"))
        pr = per_request(df)
        good = pr.filter(slo_met(slos)).height
        wall = v.summary.value("wall_s") or 0.0  # the window's length
        judged = pr.filter(pl.col("status") != "cancelled").height  # a cancelled request is never judged
        v.summary = msgspec.structs.replace(v.summary, slo_met_fraction=good / judged if judged else None,
                                            goodput_req_s=good / wall if wall > 0 else None)


def session_label(session: Session, label_key: str | None = None) -> str:
    info = session.info
    if label_key and label_key in info.tags:
        return clean_text(str(info.tags[label_key])) or session.path.name
    return clean_text(str(info.name)) if info.name else session.path.name
