"""What two sessions were measured with, fact by fact, and which figures a difference changes the meaning of.

`compare` and `gate` already refuse to judge sessions that measured differently in a way that touches every figure
(servescope version, warmup, max model length, tokenizer, client host, the workload's measured lengths:
sessions.compare.mismatches). A session imported from another tool differs in more ways, most of which touch some
figures only: the tool's token counts (the server's usage or its own tokenizer), where its TTFT clock stops, how it
takes ITL and TPOT, its percentile method, its throughput's time base, streaming, ignore_eos, the requests per cell.
Each fact below names the figures whose meaning it changes; a figure touched by a fact that differs is shown but not
judged (its verdict reads `not comparable (FACT)`, no winner is called, gate refuses it unless --allow-mismatch names
the fact), the others are judged as usual. A ramp and an open or closed loop are part of a cell's load: cells of
different loads are never set side by side.

Sessions all measured by servescope show nothing new (the table is for sessions some tool other than servescope
measured, `Comparability.shown`), unless their windows differ (below). Warmup, ramp and closed or open loop are rows
of the table when they differ, for what they are: a warmup that differs leaves no cell judged (compare's mismatch), a
ramp or a loop that differs makes different loads, whose cells are not set side by side.

The measurement window: servescope's figures are over each cell's steady window by default (`--window steady`: sent
once the load was at its target, to the last send; its rates over that span, the ramp and the drain after the last
send left out; sessions.measurement), the other tools' (and `--window whole`'s) over the whole run. A rate is then
divided by another span of time and counts other tokens: the rates are not judged. The per-request figures (TTFT,
TPOT, ITL, E2E, their means and percentiles) are judged: each is one request's own time, defined alike; the window
only chooses which requests are in the sample, and without a ramp (the peers' regime, `--ramp 0`) every request was
sent while the load was at its target, so both samples are the same requests; a ramp that differs is its own row,
and makes cells of different loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from servescope.core.jsontypes import JsonObject
from servescope.core.textsafe import clean_text
from servescope.sessions.measurement import window_label
from servescope.sessions.provenance import SourceMeta, measured_by
from servescope.sessions.store import Session
from servescope.sessions.views import cell_views, planned_load

# figures by what they are made of (a metric key's part before the "."; "cost" for the cost figures)
_TOKEN_FIGURES = ("output_tok_s", "total_tok_s", "input_tokens_mean", "output_tokens_mean", "tpot_ms", "itl_token_ms",
                  "per_user_tok_s", "prefill_tok_s", "cost", "goodput_req_s")
_PERCENTILES = ("p50", "p90", "p95", "p99")
_RATE_FIGURES = ("output_tok_s", "total_tok_s", "request_s", "goodput_req_s", "cost")
# the windows a session's figures are over, as the window row says them
WINDOW_STEADY = "steady window (load at its target, to the last send)"
WINDOW_WHOLE = "whole run"
_WHOLE_RUN_TOOLS = ("vllm-bench", "guidellm", "aiperf", "inference-perf")  # they report over their whole run


@dataclass(frozen=True)
class Fact:
    key: str
    label: str  # as the table and the verdicts name it (`not comparable (TTFT definition)`)
    figures: tuple[str, ...]  # the figures (metric keys before the ".") whose meaning a difference changes
    meaning: str  # what a difference changes, in words
    percentiles: bool = False  # it changes every percentile figure (p50, p90, p95, p99) instead
    note: str = ""  # what the table says a difference changes when it names no figure ("" : nothing)


FACTS: tuple[Fact, ...] = (
    Fact("tool", "tool", (), "nothing by itself: the rows below say what the tools did differently"),
    Fact("token_basis", "token counts", _TOKEN_FIGURES,
         "token counts, token throughput and per-token times count tokens differently"),
    Fact("ttft", "TTFT definition", ("ttft_ms", "ttfo_ms", "tpot_ms", "prefill_tok_s"),
         "TTFT stops its clock at another event (and TPOT and prefill tok/s, built on it, follow)"),
    Fact("itl", "ITL definition", ("itl_ms", "itl_token_ms"), "ITL is taken over other gaps"),
    Fact("tpot", "TPOT definition", ("tpot_ms",), "TPOT is another formula"),
    Fact("e2e", "E2E definition", ("e2e_ms", "per_user_tok_s"), "E2E ends at another event"),
    Fact("percentiles", "percentile method", (), "percentiles are taken another way (means are not)",
         percentiles=True),
    Fact("throughput", "throughput definition", ("output_tok_s", "total_tok_s", "request_s", "goodput_req_s", "cost"),
         "throughput is divided by another time"),
    Fact("streaming", "streaming", ("ttft_ms", "ttfo_ms", "itl_ms", "itl_token_ms", "tpot_ms", "prefill_tok_s"),
         "without streaming the first token arrives with the last"),
    Fact("ignore_eos", "ignore_eos", ("output_tokens_mean", "output_tok_s", "total_tok_s", "e2e_ms", "per_user_tok_s",
                                      "request_s", "goodput_req_s", "cost"),
         "outputs may stop early on one side: output lengths and what depends on them differ"),
    Fact("requests", "requests per cell", (), "nothing: each delta's interval accounts for the sample size"),
    Fact("window", "measurement window", _RATE_FIGURES,
         "rates are over another span of time (the steady window leaves the ramp and the drain out); per-request "
         "figures are not touched"),
    # whole-cell facts: a warmup that differs is compare's mismatch (no cell judged); a ramp or a loop that differs
    # makes cells of different loads, never set side by side. The rows say how each session stands.
    Fact("warmup", "warmup", (), "every figure: no cell is judged (the mismatch below)",
         note="every figure (no cell is judged)"),
    Fact("ramp", "ramp", (), "the load: cells of different ramps are different loads, not set side by side",
         note="the load (cells of different ramps are not joined)"),
    Fact("loop", "closed or open loop", (), "the load: a concurrency and a request rate are different loads",
         note="the load (concurrency and rate cells are not joined)"),
)
FACT_LABELS = {f.key: f.label for f in FACTS}


def affects(fact: Fact, metric: str) -> bool:
    """Whether a difference in `fact` changes the meaning of figure `metric` ("ttft_ms.p50", "output_tok_s")."""
    base, _, stat = metric.partition(".")
    if fact.percentiles:
        return stat in _PERCENTILES
    return base in fact.figures


@dataclass
class FactRow:
    fact: Fact
    values: list[str]  # per session ("" where unknown)
    figures: list[str] = field(default_factory=list)  # the compared figures whose meaning the difference changes

    def to_dict(self, labels: Sequence[str]) -> JsonObject:
        return {"fact": self.fact.key, "label": self.fact.label, "values": dict(zip(labels, self.values, strict=True)),
                "changes": self.fact.meaning, "figures": list(self.figures)}


@dataclass
class Comparability:
    """The comparability table: each session's tool, the facts that differ, and the figures left unjudged."""

    tools: list[str]  # per session: "servescope 0.1.0", "GuideLLM 0.8.1"
    rebuilt: list[bool]  # per session: its figures are servescope's formulas (measured, or rebuilt records)
    rows: list[FactRow]  # the facts that differ between sessions that state them
    not_judged: dict[str, list[str]]  # figure -> the labels of the facts that differ for it
    shown: bool  # some session was measured by another tool

    def why(self, metric: str) -> str:
        """Why figure `metric` is not judged ("" when it is)."""
        return ", ".join(self.not_judged.get(metric, []))

    def to_dict(self, labels: Sequence[str]) -> JsonObject:
        """The top-level `comparability` key of `compare --format json`."""
        return {"tools": [{"session": lb, "tool": t, "rebuilt": r}
                          for lb, t, r in zip(labels, self.tools, self.rebuilt, strict=True)],
                "shown": self.shown, "differences": [r.to_dict(labels) for r in self.rows],
                "not_judged": {k: v for k, v in self.not_judged.items()}}


def facts_of(session: Session) -> tuple[SourceMeta, dict[str, str]]:
    """A session's source and the value of each fact for it ("" where it does not say)."""
    info = session.info
    src = measured_by(info)
    load = planned_load(session)
    if src.imported:
        requests = src.requests
        eos = src.ignore_eos
    else:
        requests = load.requests
        sweep_load = (info.sweep or {}).get("load")
        eos_raw = sweep_load.get("ignore_eos", True) if isinstance(sweep_load, dict) else True
        eos = eos_raw if isinstance(eos_raw, bool) else True
    lo, hi = (min(requests), max(requests)) if requests else (None, None)
    out = {
        "tool": clean_text(src.tool_name),
        "token_basis": "" if src.token_basis == "unknown" else clean_text(src.token_basis),
        **{k: clean_text(src.definitions.get(k, "")) for k in ("ttft", "itl", "tpot", "e2e", "percentiles",
                                                               "throughput")},
        "streaming": "" if src.streaming is None else ("on" if src.streaming else "off"),
        "ignore_eos": "" if eos is None else ("on" if eos else "off"),
        "requests": "" if lo is None else (str(lo) if lo == hi else f"{lo}-{hi}"),
        "window": _window(src, session),
        "warmup": _warmup(src, load.warmups),
        "ramp": _ramp(src, session),
        "loop": ("" if src.loop == "unknown" else clean_text(src.loop)) if src.imported else
        " and ".join(x for x, have in (("closed", load.concurrency), ("open", load.rates)) if have),
    }
    return src, out


def _warmup(src: SourceMeta, warmups: Sequence[int]) -> str:
    """'none', '8 requests', '10 s' ("" where the files do not say): an import's as its tool's file says it,
    servescope's from its cells' plans."""
    if src.imported:
        return "" if src.warmup == "unknown" else clean_text(src.warmup)
    ws = [w for w in warmups if w]
    return ", ".join(f"{w} requests" for w in ws) if ws else "none"


def _window(src: SourceMeta, session: Session) -> str:
    """What the session's figures are over: WINDOW_STEADY, WINDOW_WHOLE, both joined when its cells differ ("" where
    the files do not say: an llm-d report of an unknown harness)."""
    kinds = {window_label(v.summary) for v in cell_views(session) if v.has_summary and v.summary.window is not None}
    if src.imported and not kinds:  # the tools report over their whole run; an llm-d report over its harness's
        harness = (src.harness or "").split(" ")[0].lower() if src.tool == "llmd-report" else src.tool
        known = _WHOLE_RUN_TOOLS + ("inference_perf", "vllm-benchmark", "vllm_benchmark")
        return WINDOW_WHOLE if harness in known else ""
    if not kinds:  # servescope's cells measured before windows: the whole cell
        kinds = {"whole"}
    return " and ".join(WINDOW_STEADY if k == "steady" else WINDOW_WHOLE for k in sorted(kinds, reverse=True))


def _ramp(src: SourceMeta, session: Session) -> str:
    """'none', '5 s' ("" where the files do not say)."""
    if src.imported:
        return "" if src.ramp == "unknown" else clean_text(src.ramp)
    ramps = sorted({r for v in cell_views(session) if (r := v.plan.ramp_s)})
    return ", ".join(f"{r:g} s" for r in ramps) if ramps else "none"


def comparability(sessions: Sequence[Session], metrics: Sequence[str]) -> Comparability:
    """The facts of the sessions side by side; the figures among `metrics` each differing fact leaves unjudged."""
    got = [facts_of(s) for s in sessions]
    sources = [g[0] for g in got]
    values = [g[1] for g in got]
    tools = {s.tool_name for s in sources}
    rows: list[FactRow] = []
    not_judged: dict[str, list[str]] = {}
    for fact in FACTS:
        vals = [v.get(fact.key, "") for v in values]
        known = {x for x in vals if x}
        if fact.key == "tool":
            rows.append(FactRow(fact, vals))
            continue
        if len(known) < 2:
            continue
        figs = [m for m in metrics if affects(fact, m)]
        rows.append(FactRow(fact, vals, figs))
        for m in figs:
            not_judged.setdefault(m, []).append(fact.label)
    # servescope's own sessions show nothing new (their differences are compare's mismatches) unless their windows
    # differ, nor do sessions of one tool that measured alike
    # the window is the exception: servescope sessions over different windows are measured differently too
    shown = any(s.imported for s in sources) and (len(tools) > 1 or len(rows) > 1) or \
        any(r.fact.key == "window" for r in rows)
    if not shown:
        rows, not_judged = [], {}
    return Comparability([clean_text(s.tool_name) for s in sources], [s.rebuilt for s in sources], rows, not_judged,
                         shown)
