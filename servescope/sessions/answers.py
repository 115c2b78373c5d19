"""What a session answers on its own, per workload: capacity at the SLOs, the knee, the peak throughput, and
the cost of thinking mode (definitions in servescope.sessions.compare and docs/compare.md);
servescope.reports.compare_doc shows them.

Only *completed* cells (status `done`) answer: a cell the user skipped or stopped, one that was interrupted or
lost its server measured a partial load, so it is left out, and each answer says which cells it left out and
why (`WorkloadAnswers.left_out`). A cell whose client was `bound` (core/health.py: the load generator, not the
server, limited it) measured the client, so it is left out too, named with its reason (`WorkloadAnswers.bound`),
unless the caller asks to include it (`include_bound`, `--include-bound`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servescope.core.cost import is_api, is_gpu
from servescope.core.results import finite
from servescope.core.slo import attains
from servescope.sessions import series_name
from servescope.sessions.store import Session
from servescope.sessions.views import CellView, fmt_num, slo_text

# ---- which cells answer ------------------------------------------------------------------------------
COMPLETED = "done"  # the one cell status whose figures a curve, a capacity, a knee or a peak may use


def is_completed(v: CellView) -> bool:
    return v.has_summary and (v.status or COMPLETED) == COMPLETED


def completed(views: Sequence[CellView]) -> list[CellView]:
    """The cells that ran to their end (curves, capacity, knee, peak and SLO figures use only these)."""
    return [v for v in views if is_completed(v)]


def client_bound(v: CellView) -> bool:
    """The cell's client was `bound`: its figures measure the load generator, not the server."""
    return v.has_summary and v.summary.client_bound


def answering(views: Sequence[CellView], include_bound: bool = False) -> list[CellView]:
    """The cells an answer (capacity, knee, peak) uses: completed ones, less the client-bound ones unless
    `include_bound`."""
    return [v for v in completed(views) if include_bound or not client_bound(v)]


def bound_out(views: Sequence[CellView], include_bound: bool = False) -> list[str]:
    """The completed cells left out because their client was bound: `c=256 (CPU 96% of a core (bound above
    90%))`, one string per cell ([] with `include_bound`)."""
    if include_bound:
        return []
    out = []
    for v in completed(views):
        if client_bound(v):
            c = v.summary.client
            why = "; ".join(c.reasons) if c is not None and c.reasons else "client bound"
            out.append(f"{v.load} ({why})")
    return out


def left_out(views: Sequence[CellView]) -> list[str]:
    """Why each other cell is left out: `c=16 (stopped: stopped by the user)`, one string per cell."""
    out = []
    for v in views:
        if is_completed(v):
            continue
        status = v.status if v.has_summary or v.status else "skipped"
        why = f"{status}: {v.reason}" if v.reason and v.reason != status else status
        out.append(f"{v.load} ({why})")
    return out


# ---- derived answers --------------------------------------------------------------------------------
@dataclass
class Capacity:
    level: float | None  # highest load level meeting the SLOs; None when no cell meets them
    unit: str  # "concurrency" | "req/s"
    not_reached: bool  # the highest measured level still meets the SLOs
    unknown: bool = False  # no cell could be judged
    why_unknown: str = "no per-request data for these SLOs"
    saturated_at: str = ""  # the lowest completed load marked saturated ("c=32"; "" when none was)

    def text(self) -> str:
        if self.unknown:
            return f"unknown ({self.why_unknown})"
        if self.level is None:
            return "none: even the lowest load misses the SLOs"
        lv = _level_text(self.level, self.unit)
        if self.saturated_at:  # past saturation more load only queues: the SLOs, not the server's room, decide here
            if self.not_reached:
                return (f"{lv} (the highest level measured still meets them; the server saturated at "
                        f"{self.saturated_at}, so more load adds queueing, not throughput)")
            return f"{lv} (the server saturated at {self.saturated_at})"
        return f"{lv} (not reached: the highest level measured still meets them)" if self.not_reached else lv


@dataclass
class Knee:
    concurrency: int | None
    not_reached: bool
    aggregate_tok_s: float | None = None
    per_user_tok_s: float | None = None
    levels: int = 0  # completed concurrency levels it was found from
    saturated_at: str = ""  # the lowest completed concurrency marked saturated ("c=32"; "" when none was)

    def text(self) -> str:
        if self.concurrency is None:
            if self.levels == 1:
                return "needs at least two completed concurrency levels (one completed)"
            return "needs at least two completed concurrency levels"
        s = (f"c={self.concurrency} ({fmt_num(self.aggregate_tok_s)} tok/s aggregate, "
             f"{fmt_num(self.per_user_tok_s)} tok/s per user)")
        if self.saturated_at:
            return s + f"; the server saturated at {self.saturated_at} (its queue stood or grew, its throughput no " \
                       "longer rose with the load)"
        return s + ", not reached: the highest concurrency measured" if self.not_reached else s


@dataclass
class WorkloadAnswers:
    session: str  # label
    workload: str
    capacity: Capacity
    knee: Knee
    peak_output_tok_s: float | None
    peak_load: str
    left_out: list[str] = field(default_factory=list)  # the cells not completed, with why ("c=16 (stopped: ...)")
    bound: list[str] = field(default_factory=list)  # completed cells left out: their client was bound, with why
    include_bound: bool = False  # the client-bound cells were counted (`--include-bound`)

    def left_out_text(self) -> str:
        """"" when every cell completed (and none was client bound), else the sentences naming the cells the
        answers leave out."""
        parts = []
        if self.left_out:
            parts.append("left out (not completed): " + ", ".join(self.left_out))
        if self.bound:
            parts.append(BOUND_NOTE + ", ".join(self.bound))
        return "; ".join(parts)


BOUND_NOTE = ("left out (client bound: the load generator, not the server, limited them; --include-bound counts "
              "them): ")


@dataclass
class ThinkingCost:
    session: str
    thinking_on: str
    thinking_off: str
    loads: list[str]
    e2e_ratio: list[float | None]
    ttfo_ratio: list[float | None]
    capacity_on: Capacity
    capacity_off: Capacity
    visible_output_on: float | None
    visible_output_off: float | None
    reasoning_tokens_on: float | None

    @property
    def e2e_ratio_median(self) -> float | None:
        vals = [v for v in self.e2e_ratio if v is not None]
        return statistics.median(vals) if vals else None

    @property
    def capacity_ratio(self) -> float | None:
        a, b = self.capacity_on.level, self.capacity_off.level
        if a is None or b is None or b == 0:
            return None
        return a / b


def _level_text(level: float, unit: str) -> str:
    return f"c={int(level)}" if unit == "concurrency" else f"{level:g} req/s"


def saturated_at(views: Sequence[CellView], closed: bool | None = None) -> str:
    """The lowest load of the completed cells marked saturated (`c=32`, `8 req/s`; engine/saturation.py), among the
    closed-loop cells (`closed` True), the open-loop ones (False) or either (None); "" when none was."""
    marked = [v for v in completed(views) if v.summary.saturation is not None and v.summary.saturation.saturated
              and v.x is not None and (closed is None or (v.concurrency is not None) == closed)]
    return min(marked, key=lambda v: v.x or 0.0).load if marked else ""


def capacity(views: Sequence[CellView], include_bound: bool = False) -> Capacity:
    """The highest load whose completed cell meets the SLOs (cells not completed, and client-bound ones unless
    `include_bound`, are left out)."""
    done = completed(views)
    views = answering(views, include_bound)
    closed = [v for v in views if v.concurrency is not None]
    pts = closed or [v for v in views if v.rate is not None]
    unit = "concurrency" if closed else "req/s"
    judged = [(v.x, v.summary.slo_met_fraction) for v in pts if v.x is not None]
    known = [(x, f) for x, f in judged if f is not None]
    if not views:
        why = "no completed cell whose client kept up" if done else "no completed cell"
        return Capacity(None, unit, False, unknown=True, why_unknown=why)
    if not known:
        return Capacity(None, unit, False, unknown=True)
    ok = [x for x, f in known if attains(f)]
    if not ok:
        return Capacity(None, unit, False)
    best = max(ok)
    return Capacity(best, unit, best == max(x for x, _ in known), saturated_at=saturated_at(pts, bool(closed)))


def knee(views: Sequence[CellView], include_bound: bool = False) -> Knee:
    """The completed concurrency level that maximises aggregate x per-user tok/s (client-bound cells left out
    unless `include_bound`)."""
    pts = []
    for v in answering(views, include_bound):
        if v.concurrency is None:
            continue
        a, u = finite(v.summary.output_tok_s), finite(v.summary.per_user_tok_s.mean)
        if a is not None and u is not None:
            pts.append((v.concurrency, a, u))
    pts.sort()
    if len(pts) < 2:
        return Knee(None, False, levels=len(pts))
    best = max(pts, key=lambda p: (p[1] * p[2], -p[0]))
    sat = saturated_at(answering(views, include_bound), closed=True)
    # the highest concurrency is a knee "not reached" only while nothing says the server saturated
    return Knee(best[0], best[0] == pts[-1][0] and not sat, best[1], best[2], levels=len(pts), saturated_at=sat)


def peak(views: Sequence[CellView], include_bound: bool = False) -> tuple[float | None, str]:
    """The highest aggregate output tok/s of a completed cell (not client bound unless `include_bound`), and
    its load."""
    best: tuple[float | None, str] = (None, "")
    for v in answering(views, include_bound):
        a = finite(v.summary.output_tok_s)
        if a is not None and (best[0] is None or a > best[0]):
            best = (a, v.load)
    return best


def derive(label: str, views: Sequence[CellView], include_bound: bool = False) -> list[WorkloadAnswers]:
    out = []
    for w in dict.fromkeys(v.workload for v in views):
        wv = [v for v in views if v.workload == w]
        pk, pl_ = peak(wv, include_bound)
        out.append(WorkloadAnswers(label, w, capacity(wv, include_bound), knee(wv, include_bound), pk, pl_,
                                   left_out(wv), bound_out(wv, include_bound), include_bound))
    return out


def _shape_key(w: Mapping[str, object]) -> tuple[object, ...]:
    return (w.get("api"), repr(w.get("input_tokens")), w.get("prefix_tokens", 0), w.get("dataset", ""),
            w.get("kind", "single"), repr(w.get("turns")), w.get("context_tokens"))


def thinking_costs(label: str, session: Session, views: Sequence[CellView]) -> list[ThinkingCost]:
    wls = session.info.workloads
    present = {v.base for v in views}
    out = []
    for on in wls:
        if on.get("thinking") is not True or on.get("name") not in present:
            continue
        offs = [w for w in wls if w.get("thinking") is not True and w.get("name") in present
                and _shape_key(w) == _shape_key(on)]
        if not offs:
            continue
        offs.sort(key=lambda w: (w.get("output_tokens") != on.get("output_tokens"), w.get("thinking") is not False))
        off = offs[0]
        # the same load of the same server variant, thinking on vs off
        von = {series_name(v.load, v.variant): v for v in views if v.base == on["name"]}
        voff = {series_name(v.load, v.variant): v for v in views if v.base == off["name"]}
        loads = [ld for ld in von if ld in voff]

        def ratio(a: float | None, b: float | None) -> float | None:
            return a / b if a is not None and b else None

        def visible(vs: Mapping[str, CellView]) -> float | None:
            vals = []
            for v in vs.values():
                o, r = finite(v.summary.output_tokens_mean), finite(v.summary.reasoning_tokens_mean)
                if o is not None:
                    vals.append(o - (r or 0.0))
            return statistics.fmean(vals) if vals else None

        reasoning = [finite(v.summary.reasoning_tokens_mean) for v in von.values()]
        rs = [r for r in reasoning if r is not None]
        out.append(ThinkingCost(
            label, str(on["name"]), str(off["name"]), loads,
            [ratio(finite(von[ld].summary.e2e_ms.p50), finite(voff[ld].summary.e2e_ms.p50))
             for ld in loads],
            [ratio(finite(von[ld].summary.ttfo_ms.p50), finite(voff[ld].summary.ttfo_ms.p50))
             for ld in loads],
            capacity(list(von.values())), capacity(list(voff.values())),
            visible(von), visible(voff), statistics.fmean(rs) if rs else None,
        ))
    return out


# ---- cost at capacity: your GPU against a hosted API ---------------------------------------------------
@dataclass
class CostAtCapacity:
    """One workload of a GPU session (its cells priced by `--gpu-hour`) against an API session (priced by
    `--price`): what a million output tokens cost at the GPU's capacity at the SLOs, on each side (core/cost.py
    has the formulas). The API's figure is its cell at the same load; without one, the median over its cells."""

    workload: str
    gpu: str  # the GPU session's label
    api: str  # the API session's label
    capacity: Capacity  # the GPU's, at the SLOs
    gpu_usd: float | None = None  # per 1M output tokens, the GPU's cell at its capacity
    gpu_usd_total: float | None = None  # per 1M tokens (input and output)
    api_usd: float | None = None
    api_usd_total: float | None = None
    api_same_load: bool = True  # the API's figure is from its cell at the same load
    api_left_out: str = ""  # why the API's cell at that load is not used (client bound, not completed)
    api_slo_met: float | None = None  # the share of the API cell's requests within the SLOs

    def text(self, slos: Mapping[str, float]) -> str:
        """`at these SLOs (...), 16 users cost $0.79 per 1M output tokens on this GPU (gpu) vs $10.85 on the API
        (api)`, with what the API's cell at that load says about the SLOs."""
        at = f"at these SLOs ({slo_text(slos)})"
        cap = self.capacity
        if cap.unknown or cap.level is None:
            why = cap.text() if cap.unknown else "no load meets them on this GPU"
            return f"{at}: {why} ({self.gpu}); the API ({self.api}) costs {_usd(self.api_usd)} per 1M output tokens"
        n = f"{int(cap.level)} users" if cap.unit == "concurrency" else f"{cap.level:g} req/s"
        if cap.not_reached:
            n = f"{n} (the most measured; more may meet them)"
        api = f"{_usd(self.api_usd)} on the API ({self.api})"
        if not self.api_same_load:
            why = f"its cell at this load is left out: {self.api_left_out}" if self.api_left_out else \
                "it has no cell at this load"
            api += f" (the median of its cells: {why})"
        elif self.api_slo_met is not None:
            meets = attains(self.api_slo_met)
            api += (f", which {'meets' if meets else 'misses'} them at this load ({self.api_slo_met:.0%} of its "
                    "requests within them)")
        both = (f"; per 1M tokens in all (input and output) {_usd(self.gpu_usd_total)} vs {_usd(self.api_usd_total)}"
                if self.gpu_usd_total is not None and self.api_usd_total is not None else "")
        return (f"{at}, {n} cost {_usd(self.gpu_usd)} per 1M output tokens on this GPU ({self.gpu}) vs {api}"
                + both)


def _usd(v: float | None) -> str:
    if v is None:
        return "an unknown amount"
    return f"${v:,.2f}" if v >= 0.1 else f"${v:.3g}"


def cost_at_capacity(labels: Sequence[str], views: Sequence[Sequence[CellView]],
                     include_bound: bool = False) -> list[CostAtCapacity]:
    """For each GPU session (its cells' cost from `--gpu-hour`) and each API session (from `--price`) among
    `labels`, per workload both ran: the cost per 1M output tokens at the GPU's capacity at the SLOs (the views
    carry the SLOs the comparison applied), on each side."""
    gpus = [i for i, vs in enumerate(views) if any(is_gpu(v.summary.cost) for v in vs if v.has_summary)]
    apis = [i for i, vs in enumerate(views) if any(is_api(v.summary.cost) for v in vs if v.has_summary)]
    out = []
    for g in gpus:
        for a in apis:
            for w in dict.fromkeys(v.workload for v in views[g]):
                gv = [v for v in views[g] if v.workload == w]
                av = answering([v for v in views[a] if v.workload == w], include_bound)
                if not av:
                    continue
                cap = capacity(gv, include_bound)
                row = CostAtCapacity(w, labels[g], labels[a], cap)
                at = next((v for v in answering(gv, include_bound) if v.x == cap.level), None) \
                    if cap.level is not None else None
                if at is not None and at.summary.cost is not None:
                    row.gpu_usd = finite(at.summary.cost.usd_per_1m_output_tokens)
                    row.gpu_usd_total = finite(at.summary.cost.usd_per_1m_total_tokens)
                same = next((v for v in av if at is not None and v.plan == at.plan), None)
                if same is not None and same.summary.cost is not None:
                    row.api_usd = finite(same.summary.cost.usd_per_1m_output_tokens)
                    row.api_usd_total = finite(same.summary.cost.usd_per_1m_total_tokens)
                    row.api_slo_met = finite(same.summary.slo_met_fraction)
                else:
                    row.api_same_load = False  # the API's median over its cells is all there is
                    there = next((v for v in views[a] if at is not None and v.plan == at.plan), None)
                    if there is not None:
                        row.api_left_out = ("client bound" if client_bound(there) and is_completed(there)
                                            else there.status or "not completed")
                    outs = [x for v in av if v.summary.cost is not None
                            and (x := finite(v.summary.cost.usd_per_1m_output_tokens)) is not None]
                    tots = [x for v in av if v.summary.cost is not None
                            and (x := finite(v.summary.cost.usd_per_1m_total_tokens)) is not None]
                    row.api_usd = statistics.median(outs) if outs else None
                    row.api_usd_total = statistics.median(tots) if tots else None
                out.append(row)
    return out
