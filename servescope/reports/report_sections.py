"""The sections of a session's report as document blocks (servescope.reports.document): setup, workloads, metric
definitions, each workload's results table with its answers, its charts (Mermaid) and its figures.
`servescope.reports.report` assembles them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from servescope.core.health import BUNCHED_SHARE, CPU_UTIL, LOOP_LAG_P99_MS, SEND_LATE_P99_MS
from servescope.core.metrics import FORMULAS, SLO_ATTAINMENT
from servescope.core.quality import QualityResult
from servescope.core.results import CellResult, Dist, finite, metric_label
from servescope.core.secrets import redact_command
from servescope.core.textsafe import clean_text
from servescope.reports.document import (
    Block,
    Chart,
    Code,
    Column,
    Content,
    Figure,
    Formula,
    Formulas,
    Mermaid,
    Num,
    Strong,
    bullets,
    content,
    heading,
    para,
    right,
    row,
    table,
)
from servescope.reports.measure_doc import mark_parts, measurement_blocks
from servescope.reports.quality_doc import load_quality_blocks
from servescope.reports.serving_doc import energy_cells, energy_columns, serving_blocks
from servescope.sessions.answers import completed
from servescope.sessions.compare import CellView, Comparison, ThinkingCost, WorkloadAnswers, fmt_num, slo_text
from servescope.sessions.quality import synthetic_note
from servescope.sessions.store import Session
from servescope.sessions.twin import TwinRecord
from servescope.sessions.views import planned_load


@dataclass
class SessionReport:
    """One session as a report reads it (servescope.reports.report.build())."""

    session: Session
    label: str
    views: list[CellView]
    skipped: list[CellView]
    slos: dict[str, float]
    slos_source: str
    answers: list[WorkloadAnswers]
    thinking: list[ThinkingCost]
    notes: list[str]
    quality: QualityResult | None = None  # quality.json, when the session holds it
    twin: TwinRecord | None = None  # SESSION/twin: the fitted twin and its track record

    @property
    def speed(self) -> bool:
        """The report has speed sections: a sweep's (even without cells), not a quality probe's alone."""
        return bool(self.views or self.skipped) or self.session.info.kind != "quality"



EXTRA_DEFINITIONS: dict[str, str] = {
    "percentiles": "p50/p90/p95/p99 by linear interpolation over the cell's successful requests (ITL: over all gaps)",
    "slo_met": f"share of a cell's requests that succeeded within every SLO; a cell meets the SLOs at >= {SLO_ATTAINMENT:.0%}",
    "capacity": "the highest load level whose cell meets the SLOs",
    "knee": "the concurrency that maximises aggregate output tok/s x mean per-user tok/s; past it, extra "
            "aggregate throughput costs more per-user speed than it gains",
}
CLIENT_DEFINITION = (
    "the load generator's own health over the cell: ok, strained or bound (the client, not the server, "
    "limited the cell) by the worst of: CPU (process CPU time / wall time, plus the loop thread's wait for a "
    "CPU, as a share of one core), event-loop lag p99 (how late a 10 ms timer ran), open-loop sends late "
    "against their schedule p99, and the share of tokens stamped at the same ns as the request's previous one "
    "(read in one piece)")



# ---- blocks ----------------------------------------------------------------------------------------
def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _dist_text(d: object) -> str:
    if not isinstance(d, Mapping):
        return "-"
    kind = d.get("dist", "fixed")
    if kind == "fixed":
        return f"{d.get('value')}"
    if kind == "uniform":
        return f"{d.get('min')}-{d.get('max')} (uniform)"
    return f"N({d.get('mean')}, {d.get('std')}) in [{d.get('min')}, {d.get('max')}]"


def _measured(session: Session, views: Sequence[CellView], workload: str, column: str, summary_key: str) -> str:
    idx = [v.index for v in views if v.base == workload]
    frames = [session.requests(i) for i in idx]
    frames = [f for f in frames if f.height and column in f.columns]
    if frames:
        df = pl.concat([f.select("status", column, *(["warmup"] if "warmup" in f.columns else [])) for f in frames],
                       how="diagonal_relaxed")
        if "warmup" in df.columns:
            df = df.filter(~pl.col("warmup"))
        s = df.filter((pl.col("status") == "ok") & (pl.col(column) >= 0))[column]
        if s.len():
            return (f"mean {fmt_num(float(s.mean()))}, p50 {fmt_num(float(s.median()))}, "  # type: ignore[arg-type]
                    f"{int(s.min())}-{int(s.max())}")  # type: ignore[arg-type]
    vals = [v.summary.value(summary_key) for v in views if v.base == workload]
    got = [x for x in vals if x is not None]
    return f"mean {fmt_num(sum(got) / len(got))} (no per-request data)" if got else "-"


def setup_blocks(rep: SessionReport) -> list[Block]:
    m = rep.session.info
    t = m.target
    server = m.server
    kv = None
    for v in rep.views:
        sv = v.summary.server
        if sv is not None and finite(sv.kv_cache_tokens):
            kv = finite(sv.kv_cache_tokens)
            break
    loads = m.tune.loads if m.kind == "tune" and m.tune is not None else []
    load_txt = (f"searched: concurrency {', '.join(map(str, loads))} (the tune section's path says which cells ran)"
                if loads else planned_load(rep.session).text())
    tags = m.tags
    dates = clean_text(m.started_at if m.started_at is not None else "?")
    if m.ended_at:
        dates += f" to {clean_text(m.ended_at)}"
    gpu_txt = gpu_text(m.gpu)
    args = server.args if server else None
    rows = [
        ("target", clean_text(t.url)),
        ("server", clean_text({"vllm": "vLLM", "llamacpp": "llama.cpp"}.get(t.engine or "vllm", "OpenAI-compatible server")
                              + f" {t.version or '(version not reported)'}")),
        ("server arguments", redact_command(clean_text(" ".join(map(str, args)) if isinstance(args, list)
                                                     else str(args)))
         if args else _no_args_text(rep.session.info.kind, bool(server and server.launch))),
        *([("server variants", "; ".join(f"{i + 1}: {redact_command(clean_text(str(v)))}"
                                       for i, v in enumerate(server.variants))
            + " (the sweep ran once per variant, the server relaunched; each variant's results have their own "
              "section)")] if server and server.variants else []),
        ("model", clean_text(m.model)),
        ("max model length", f"{m.max_model_len:,}" if m.max_model_len is not None else "not reported"),
        ("KV cache", _kv_text(kv, m.kv_budget)),
        ("GPU", gpu_txt),
        ("tags", ", ".join(f"{k}={clean_text(str(v))}" for k, v in tags.items()) or "none"),
        ("date", dates),
        ("status", rep.session.status),
        ("load", load_txt),
        ("SLOs", f"{slo_text(rep.slos)} ({rep.slos_source})"),
        ("client", f"servescope {clean_text(m.servescope_version)} on {clean_text(m.host)}, "
                   f"tokenizer: {clean_text(t.tokenizer if t.tokenizer is not None else '?')}"),
    ]
    if not rep.speed:  # a quality probe alone: no load, no SLOs, no KV cache figures
        rows = [r for r in rows if r[0] not in ("KV cache", "load", "SLOs")]
    return [heading(2, "Setup"), table((Column(""), Column("")), [row(k, v) for k, v in rows], headless=True)]


def _no_args_text(kind: str | None, launched: bool) -> str:
    """The setup's server arguments when the session has none recorded."""
    if kind == "tune":
        return "searched (see the tune section; each cell's own session holds the arguments it ran with)"
    if launched:
        return "not reported by the server servescope launched"
    return "not known (servescope did not launch the server)"


def _kv_text(kv: float | None, budget: Mapping[str, object] | None) -> str:
    """The KV cache as the server reported it: vLLM's from /metrics, llama.cpp's as its parallel slots."""
    slots, slot_tokens = (budget.get("slots"), budget.get("slot_tokens")) if budget is not None else (None, None)
    if isinstance(slots, (int, float)) and slots:
        return (f"{int(slots)} slots x {int(slot_tokens) if isinstance(slot_tokens, (int, float)) else 0:,} tokens (llama.cpp /props: "
                "one request per slot, more wait in the server; it reports no KV-cache usage)")
    return f"{kv:,.0f} tokens (from /metrics)" if kv else "not reported"


WORKLOAD_COLUMNS = (Column("workload"), Column("api"), Column("thinking"), Column("input requested", unit="tokens"),
                    Column("input measured", unit="tokens"), Column("output requested", unit="tokens"),
                    Column("output measured", unit="tokens"),
                    Column("reasoning tokens (mean)", unit="tokens", stat="mean"))


def workloads_blocks(rep: SessionReport) -> list[Block]:
    rows = []
    present = {v.base for v in rep.views}
    for w in rep.session.info.workloads:
        if w.get("name") not in present:
            continue
        name = str(w["name"])
        think = {True: "on", False: "off"}.get(bool(w["thinking"]), "") if "thinking" in w else "server default"
        inp = _dist_text(w.get("input_tokens"))
        if w.get("dataset"):
            inp = f"dataset {clean_text(str(w['dataset'])).split('/')[-1]}"
        if w.get("prefix_tokens"):
            inp += f", {w['prefix_tokens']} shared prefix"
        reas = [finite(v.summary.reasoning_tokens_mean) for v in rep.views if v.base == name]
        rs = [r for r in reas if r is not None]
        rows.append(row(name, str(w.get("api", "?")), think, inp,
                        _measured(rep.session, rep.views, name, "prompt_tokens", "input_tokens_mean"),
                        _dist_text(w.get("output_tokens")),
                        _measured(rep.session, rep.views, name, "output_tokens", "output_tokens_mean"),
                        Num(fmt_num(sum(rs) / len(rs)) if rs else "-")))
    return [heading(2, "Workloads"),
            para("A benchmark lies unless it states its length distributions: requested is what the workload asked "
                 "for, measured is what the server counted (", Code("usage"), ")."),
            table(WORKLOAD_COLUMNS, rows)]


def definitions_blocks(with_client: bool = False) -> list[Block]:
    rows = [Formula(k, v) for k, v in FORMULAS.items()]
    rows += [Formula(k, v, code=False) for k, v in EXTRA_DEFINITIONS.items()]
    if with_client:
        limits = (f"strained / bound above: CPU {CPU_UTIL[0]:.0%} / {CPU_UTIL[1]:.0%}, loop lag p99 "
                  f"{LOOP_LAG_P99_MS[0]:g} / {LOOP_LAG_P99_MS[1]:g} ms, sends late p99 {SEND_LATE_P99_MS[0]:g} / "
                  f"{SEND_LATE_P99_MS[1]:g} ms, bunched tokens {BUNCHED_SHARE[0]:.0%} / {BUNCHED_SHARE[1]:.0%}")
        rows.append(Formula("client", f"{clean_text(CLIENT_DEFINITION)}; {limits}", code=False))
    return [heading(2, "Metric definitions"), Formulas(tuple(rows))]


def _client_cell(sm: CellResult) -> Content:
    """`ok 23% / 0.4 ms`, `**BOUND** 96% / 130 ms` (CPU share of a core, wait included; loop lag p99)."""
    c = sm.client
    if c is None:
        return (Num("-"),)
    cpu = finite(c.cpu_util)
    demand = None if cpu is None else cpu + (finite(c.cpu_wait_share) or 0.0)
    lag = finite(c.loop_lag_ms.p99)
    figs = f"{demand:.0%} / {fmt_num(lag)} ms" if demand is not None and lag is not None else ""
    verdict: Content = (Strong("BOUND"),) if c.verdict == "bound" else (c.verdict or "?",)
    return content(*verdict, (" ", Num(figs)) if figs else None)


def _trio(d: Dist) -> Num:
    return Num(" / ".join(fmt_num(d.stat(p)) for p in ("p50", "p90", "p99")))


def _chart_values(s: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(x) for x in s)


CHARTS = (("output_tok_s", "aggregate output tok/s"), ("per_user_tok_s.mean", metric_label("per_user_tok_s.mean")),
          ("ttft_ms.p99", metric_label("ttft_ms.p99")))


def charts_block(workload: str, series: Mapping[str, Sequence[CellView]], x_kind: str) -> Mermaid | None:
    """series: label -> that session's cells of this workload (same x levels, in order)."""
    first = next(iter(series.values()))
    if len(first) < 2:
        return None
    cats = tuple(str(v.concurrency) if x_kind == "concurrency" else f"{v.rate:g}" for v in first)
    x_label = "concurrency (users)" if x_kind == "concurrency" else "request rate (req/s)"
    charts: list[Chart] = []
    for key, label in CHARTS:
        lines: list[tuple[float, ...]] = []
        for views in series.values():
            vals = [v.summary.value(key) for v in views]
            if any(x is None for x in vals):
                lines = []
                break
            lines.append(_chart_values([x for x in vals if x is not None]))
        if lines:
            charts.append(Chart(f"{workload}: {label} vs {x_kind}", x_label, cats, label, tuple(lines)))
    if not charts:
        return None
    legend = ("Lines in each chart, in order: " + ", ".join(f"line {i + 1}: {lb}" for i, lb in enumerate(series))
              + ".") if len(series) > 1 else ""
    return Mermaid(tuple(charts), content(legend))


TURN_COLUMNS = (Column("turn"), right("ok / failed"), right("TTFT ms p50", "ms", "p50"),
                right("TTFT ms p90", "ms", "p90"), right("input tokens (mean)", "tokens", "mean"), right("cached"))


def _turn_blocks(views: Sequence[CellView]) -> list[Block]:
    """Per turn index of each conversation or agent cell: TTFT p50/p90, input tokens and the cached share."""
    out: list[Block] = []
    for v in views:
        turns = v.summary.turns
        if not turns:
            continue
        out.append(para(Strong(f"{clean_text(v.load)}, per turn"), " (turn k resends turns 1..k-1 with the model's "
                        "replies; cached from the usage's cached tokens):"))
        rows = []
        for t in turns:
            hit = finite(t.prefix_cache_hit_rate)
            rows.append(row(Num(str(t.turn)), Num(f"{t.requests_ok} / {t.requests_failed}"),
                            Num(fmt_num(finite(t.ttft_ms_p50))), Num(fmt_num(finite(t.ttft_ms_p90))),
                            Num(fmt_num(finite(t.input_tokens_mean))), Num(f"{hit:.0%}" if hit is not None else "-")))
        out.append(table(TURN_COLUMNS, rows))
        cv = v.summary.conversations
        if cv is not None:
            out.append(para(f"Conversations: {cv.started} started, {cv.complete} complete"
                            + (f"; complete ones took p50 {fmt_num(finite(cv.duration_s.p50))} s, p90 "
                               f"{fmt_num(finite(cv.duration_s.p90))} s (first turn sent to last reply, think time "
                               "included)" if cv.complete else "")))
    return out


def _cost_blocks(views: Sequence[CellView]) -> list[Block]:
    """What the cost column is, with each distinct basis (a GPU's names its throughput: one per cell)."""
    bases = list(dict.fromkeys(c.basis for v in views if (c := v.summary.cost) is not None))
    what = ("Cost: USD per 1M output tokens (all the cell's spend over its output tokens; the formulas are in "
            "docs/hosted.md). ")
    if len(bases) == 1:
        return [para(what + f"Basis: {bases[0]}.")]
    return [para(what + "Basis, by cell:"),
            bullets(f"{v.load}: {c.basis}" for v in views if (c := v.summary.cost) is not None)]


def gpu_text(gpu: Mapping[str, object] | None) -> str:
    """session.toml's [gpu] as a person writes it: `no GPU telemetry: NVML is not available (...)`,
    `2 GPUs sampled`, or `not recorded`."""
    if gpu is None:
        return "not recorded"
    if gpu.get("available") is False:
        why = clean_text(str(gpu.get("reason") or "the GPUs could not be read"))
        return f"no GPU telemetry: {why}"
    count = gpu.get("count")
    rest = ", ".join(f"{k} {clean_text(str(v))}" for k, v in gpu.items() if k not in ("available", "count"))
    sampled = f"{count} GPU{'s' if count != 1 else ''} sampled" if isinstance(count, int) else "GPUs sampled"
    return sampled + (f" ({rest})" if rest else "")


def results_columns(limited: bool, cache: bool, client: bool, cost: bool) -> tuple[Column, ...]:
    """The results table's columns: what each figure is, its unit and statistic."""
    return (Column("load"), Column("ok / failed / 429" if limited else "ok / failed", unit="requests"),
            Column("TTFT ms p50 / p90 / p99", unit="ms", stat="p50 / p90 / p99"),
            Column("TPOT ms p50 / p90 / p99", unit="ms", stat="p50 / p90 / p99"),
            Column("ITL ms p50 / p90 / p99", unit="ms", stat="p50 / p90 / p99"),
            Column("E2E ms p50 / p90 / p99", unit="ms", stat="p50 / p90 / p99"),
            right("output tok/s", "tok/s", "aggregate"), right("per-user tok/s (mean)", "tok/s", "mean"),
            right("goodput req/s", "req/s"), right("SLO met", "share of requests"),
            *([right("prefix cache hit", "share of prompt tokens")] if cache else []),
            *([right("client", "CPU share / loop lag p99 ms")] if client else []),
            *([right("cost $/1M out tok", "USD per 1M output tokens")] if cost else []))


def workload_blocks(rep: SessionReport, workload: str, comparison: Comparison | None,
                    others: Sequence[SessionReport], figures: Sequence[str] = ()) -> list[Block]:
    """A workload's section: its results table and what the table's columns mean, its turns, its quality under
    load, its answers, its charts, and `figures` (the keys of the figures that belong here)."""
    views = [v for v in rep.views if v.workload == workload]
    out: list[Block] = [heading(2, f"Results: {workload}")]
    limited = any(v.summary.requests_rate_limited for v in views)
    cache = any(finite(v.summary.prefix_cache_hit_rate) is not None for v in views)
    client = any(v.summary.client is not None for v in views)
    cost = any(v.summary.cost is not None for v in views)
    energy = energy_columns(views)  # beside the cost, only where NVML measured it
    rows = []
    for v in views:
        sm = v.summary
        frac = finite(sm.slo_met_fraction)
        hit = finite(sm.prefix_cache_hit_rate)
        rows.append(row(
            content(v.load, (" ", Strong(v.status)) if v.status not in ("done", "") else None, mark_parts(sm)),
            Num(f"{sm.requests_ok} / {sm.requests_failed}" + (f" / {sm.requests_rate_limited or 0}" if limited else "")),
            _trio(sm.ttft_ms), _trio(sm.tpot_ms), _trio(sm.itl_ms), _trio(sm.e2e_ms),
            Num(fmt_num(finite(sm.output_tok_s))), Num(fmt_num(finite(sm.per_user_tok_s.mean))),
            Num(fmt_num(finite(sm.goodput_req_s))), Num(f"{frac:.0%}" if frac is not None else "-"),
            *([Num(f"{hit:.1%}" if hit is not None else "-")] if cache else []),
            *([_client_cell(sm)] if client else []),
            *([Num(fmt_num(sm.value("cost.usd_per_1m_output_tokens")))] if cost else []),
            *energy_cells(sm, energy),
        ))
    out.append(table((*results_columns(limited, cache, client, cost), *energy), rows))
    if limited:
        out.append(para("ok / failed / 429: the cell's requests that succeeded, that failed, and that the server "
                        "refused by its rate limit (HTTP 429: counted apart from the failed ones, and measured in no "
                        "latency figure)."))
    if client:
        out.append(para("Client: the load generator's own health in the cell (see the definitions): ", Code("ok"),
                        ", ", Code("strained"), ", or ", Strong("BOUND"), " when the client, not the server, limited "
                        "the cell; CPU as a share of one core (with its wait for a CPU), loop lag p99 in ms."))
    if cache:
        out.append(para("Prefix cache hit: cached / prompt tokens of the cell's successful requests, from the usage's ",
                        Code("prompt_tokens_details.cached_tokens"), " when the server sent it, else from its ",
                        Code("/metrics"), " prefix-cache counters over the cell."))
    out += measurement_blocks(views, [v for v in rep.skipped if v.workload == workload])  # reports/measure_doc.py
    if cost:
        out += _cost_blocks(views)
    out += serving_blocks(views)
    out += _turn_blocks(views)
    quality = load_quality_blocks(views)
    if quality and (synthetic := synthetic_note(rep.session.info.target.url)):
        quality = [para(Strong(synthetic[0].upper() + synthetic[1:] + ".")), *quality]
    out += quality
    ans = next((a for a in rep.answers if a.workload == workload), None)
    if ans:
        items: list[Content] = [content(Strong("Capacity at the SLOs:"), " ", ans.capacity.text()),
                                content(Strong("Knee:"), " ", ans.knee.text())]
        if ans.peak_output_tok_s is not None:
            items.append(content(Strong("Peak aggregate throughput:"), " ", Num(fmt_num(ans.peak_output_tok_s)),
                                 f" output tok/s at {ans.peak_load}"))
        at = next((v for v in completed(views) if ans.capacity.level is not None and v.x == ans.capacity.level
                   and v.summary.cost is not None), None)
        if at is not None and at.summary.cost is not None:
            c = at.summary.cost
            items.append(content(Strong("Cost at capacity:"), " ",
                                 Num(f"${fmt_num(finite(c.usd_per_1m_output_tokens))}"), " per 1M output tokens (",
                                 Num(f"${fmt_num(finite(c.usd_per_1m_total_tokens))}"),
                                 f" per 1M tokens in all) at {at.load}: {c.basis}"))
        if ans.left_out:
            items.append(content(Strong("Left out of these answers and the charts"), " (not completed): ",
                                 ", ".join(ans.left_out)))
        if ans.bound:
            items.append(content(Strong("Left out of these answers"), " (client bound: the load generator, not the "
                                 "server, limited them; ", Code("--include-bound"), " counts them): ",
                                 ", ".join(ans.bound)))
        elif ans.include_bound and any(v.summary.client_bound for v in views):
            items.append(content("Client-bound cells are counted in these answers (", Code("--include-bound"), ")."))
        out.append(bullets(items))
    done = completed(views)  # the charts draw completed cells only, as the answers use
    closed = [v for v in done if v.concurrency is not None]
    x_kind = "concurrency" if closed else "rate"
    base = closed or [v for v in done if v.rate is not None]
    series: dict[str, list[CellView]] = {rep.label: base}
    if comparison is not None and others:
        common = {(c.workload, c.load) for c in comparison.cells}
        keep = [v for v in base if (v.workload, v.load) in common]
        series = {comparison.labels[0]: keep}
        for o, lb in zip(others, comparison.labels[1:], strict=True):
            by = {v.key: v for v in o.views}
            series[lb] = [by[v.key] for v in keep]
        if len(keep) < 2:
            series = {rep.label: base}
    charts = charts_block(workload, series, x_kind)
    if charts is not None:
        out.append(charts)
    out += [Figure(k) for k in figures]
    return out
