"""The sections of a session's Markdown report: setup, workloads, metric definitions, each workload's results
table with its Mermaid charts. `servescope.reports.report` assembles them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from servescope.core.health import BUNCHED_SHARE, CPU_UTIL, LOOP_LAG_P99_MS, SEND_LATE_P99_MS
from servescope.core.metrics import FORMULAS, SLO_ATTAINMENT
from servescope.core.quality import QualityResult
from servescope.core.results import CellResult, Dist, finite, metric_label
from servescope.core.secrets import redact_command
from servescope.core.textsafe import clean_text, md_escape
from servescope.sessions.answers import completed
from servescope.sessions.compare import CellView, Comparison, ThinkingCost, WorkloadAnswers, fmt_num, slo_text
from servescope.sessions.quality import load_quality_rows, synthetic_note
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



# ---- Markdown ---------------------------------------------------------------------------------------
def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c if c else "-" for c in cells) + " |"


def _sep(n: int, numeric_from: int = 99) -> str:
    return "|" + "|".join("---:" if i >= numeric_from else "---" for i in range(n)) + "|"


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


def _setup(rep: SessionReport) -> list[str]:
    m = rep.session.info
    t = m.target
    server = m.server
    kv = None
    for v in rep.views:
        sv = v.summary.server
        if sv is not None and finite(sv.kv_cache_tokens):
            kv = finite(sv.kv_cache_tokens)
            break
    tune = m.kind == "tune" and rep.session.meta.get("tune")
    loads = tune.get("loads") if isinstance(tune, Mapping) else None
    load_txt = (f"searched: concurrency {', '.join(map(str, loads))} (the tune section's path says which cells ran)"
                if isinstance(loads, list) and loads else planned_load(rep.session).text())
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
    out = ["## Setup", "", "| | |", "|---|---|"]
    out += [f"| {k} | {md_escape(v)} |" for k, v in rows]
    return out + [""]


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


def _workloads(rep: SessionReport) -> list[str]:
    out = ["## Workloads", "",
           "A benchmark lies unless it states its length distributions: requested is what the workload asked "
           "for, measured is what the server counted (`usage`).", "",
           _row(["workload", "api", "thinking", "input requested", "input measured", "output requested",
                 "output measured", "reasoning tokens (mean)"]),
           _sep(8)]
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
        out.append(_row([md_escape(name), md_escape(str(w.get("api", "?"))), think, md_escape(inp),
                         md_escape(_measured(rep.session, rep.views, name, "prompt_tokens", "input_tokens_mean")),
                         md_escape(_dist_text(w.get("output_tokens"))),
                         md_escape(_measured(rep.session, rep.views, name, "output_tokens", "output_tokens_mean")),
                         fmt_num(sum(rs) / len(rs)) if rs else "-"]))
    return out + [""]


def _definitions(with_client: bool = False) -> list[str]:
    out = ["## Metric definitions", "", "| metric | definition |", "|---|---|"]
    for k, v in FORMULAS.items():
        out.append(f"| `{k}` | {md_escape(v)} |")
    for k, v in EXTRA_DEFINITIONS.items():
        out.append(f"| {k} | {md_escape(v)} |")
    if with_client:
        limits = (f"strained / bound above: CPU {CPU_UTIL[0]:.0%} / {CPU_UTIL[1]:.0%}, loop lag p99 "
                  f"{LOOP_LAG_P99_MS[0]:g} / {LOOP_LAG_P99_MS[1]:g} ms, sends late p99 {SEND_LATE_P99_MS[0]:g} / "
                  f"{SEND_LATE_P99_MS[1]:g} ms, bunched tokens {BUNCHED_SHARE[0]:.0%} / {BUNCHED_SHARE[1]:.0%}")
        out.append(f"| client | {md_escape(CLIENT_DEFINITION)}; {md_escape(limits)} |")
    return out + [""]


def _client_cell(sm: CellResult) -> str:
    """`ok 23% / 0.4 ms`, `**BOUND** 96% / 130 ms` (CPU share of a core, wait included; loop lag p99)."""
    c = sm.client
    if c is None:
        return "-"
    cpu = finite(c.cpu_util)
    demand = None if cpu is None else cpu + (finite(c.cpu_wait_share) or 0.0)
    lag = finite(c.loop_lag_ms.p99)
    figs = f"{demand:.0%} / {fmt_num(lag)} ms" if demand is not None and lag is not None else ""
    verdict = "**BOUND**" if c.verdict == "bound" else md_escape(c.verdict or "?")
    return f"{verdict} {figs}".strip()


def _trio(d: Dist) -> str:
    return " / ".join(fmt_num(d.stat(p)) for p in ("p50", "p90", "p99"))


def _mermaid_text(s: str) -> str:
    return clean_text(s).replace('"', "'").replace("`", "'")


def xychart(title: str, x_label: str, categories: Sequence[str], y_label: str,
            series: Sequence[Sequence[float]]) -> list[str]:
    """A Mermaid xychart-beta block: one line per series, all as long as the categories."""
    ymax = max((v for s in series for v in s), default=0.0)
    top = _nice_ceiling(ymax)
    cats = ", ".join(f'"{_mermaid_text(c)}"' for c in categories)
    out = ["```mermaid", "xychart-beta", f'    title "{_mermaid_text(title)}"',
           f'    x-axis "{_mermaid_text(x_label)}" [{cats}]', f'    y-axis "{_mermaid_text(y_label)}" 0 --> {top:g}']
    for s in series:
        out.append("    line [" + ", ".join(_chart_num(v) for v in s) + "]")
    return out + ["```"]


def _chart_num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def _nice_ceiling(v: float) -> float:
    if v <= 0 or math.isnan(v):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * mag >= v * 1.05:
            return m * mag
    return 10 * mag


CHARTS = (("output_tok_s", "aggregate output tok/s"), ("per_user_tok_s.mean", metric_label("per_user_tok_s.mean")),
          ("ttft_ms.p99", metric_label("ttft_ms.p99")))


def _charts_for(workload: str, series: Mapping[str, Sequence[CellView]], x_kind: str) -> list[str]:
    """series: label -> that session's cells of this workload (same x levels, in order)."""
    first = next(iter(series.values()))
    if len(first) < 2:
        return []
    cats = [str(v.concurrency) if x_kind == "concurrency" else f"{v.rate:g}" for v in first]
    x_label = "concurrency (users)" if x_kind == "concurrency" else "request rate (req/s)"
    out: list[str] = []
    for key, label in CHARTS:
        lines: list[list[float]] = []
        for views in series.values():
            vals = [v.summary.value(key) for v in views]
            if any(x is None for x in vals):
                lines = []
                break
            lines.append([float(x) for x in vals if x is not None])
        if not lines:
            continue
        out += xychart(f"{workload}: {label} vs {x_kind}", x_label, cats, label, lines) + [""]
    if out and len(series) > 1:
        legend = ", ".join(f"line {i + 1}: {md_escape(lb)}" for i, lb in enumerate(series))
        out.append(f"Lines in each chart, in order: {legend}.")
        out.append("")
    return out


def _turn_tables(views: Sequence[CellView]) -> list[str]:
    """Per turn index of each conversation or agent cell: TTFT p50/p90, input tokens and the cached share."""
    out: list[str] = []
    for v in views:
        turns = v.summary.turns
        if not turns:
            continue
        out += [f"**{md_escape(v.load)}, per turn** (turn k resends turns 1..k-1 with the model's replies; cached from "
                "the usage's cached tokens):", ""]
        head = ["turn", "ok / failed", "TTFT ms p50", "TTFT ms p90", "input tokens (mean)", "cached"]
        out += [_row(head), _sep(len(head), numeric_from=1)]
        for t in turns:
            hit = finite(t.prefix_cache_hit_rate)
            out.append(_row([str(t.turn), f"{t.requests_ok} / {t.requests_failed}", fmt_num(finite(t.ttft_ms_p50)),
                             fmt_num(finite(t.ttft_ms_p90)), fmt_num(finite(t.input_tokens_mean)),
                             f"{hit:.0%}" if hit is not None else "-"]))
        cv = v.summary.conversations
        if cv is not None:
            out.append("")
            out.append(f"Conversations: {cv.started} started, {cv.complete} complete"
                       + (f"; complete ones took p50 {fmt_num(finite(cv.duration_s.p50))} s, p90 "
                          f"{fmt_num(finite(cv.duration_s.p90))} s (first turn sent to last reply, think time "
                          "included)" if cv.complete else ""))
        out.append("")
    return out


def _cost_note(views: Sequence[CellView]) -> list[str]:
    """What the cost column is, with each distinct basis (a GPU's names its throughput: one per cell)."""
    bases = list(dict.fromkeys(c.basis for v in views if (c := v.summary.cost) is not None))
    what = ("Cost: USD per 1M output tokens (all the cell's spend over its output tokens; the formulas are in "
            "docs/hosted.md). ")
    if len(bases) == 1:
        return [md_escape(what + f"Basis: {bases[0]}."), ""]
    return [md_escape(what + "Basis, by cell:"), "",
            *[f"- {md_escape(v.load)}: {md_escape(c.basis)}" for v in views if (c := v.summary.cost) is not None], ""]


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


def _workload_section(rep: SessionReport, workload: str, comparison: Comparison | None,
                      others: Sequence[SessionReport]) -> list[str]:
    views = [v for v in rep.views if v.workload == workload]
    out = [f"## Results: {md_escape(workload)}", ""]
    limited = any(v.summary.requests_rate_limited for v in views)
    head = ["load", "ok / failed / 429" if limited else "ok / failed", "TTFT ms p50 / p90 / p99", "TPOT ms p50 / p90 / p99", "ITL ms p50 / p90 / p99",
            "E2E ms p50 / p90 / p99", "output tok/s", "per-user tok/s (mean)", "goodput req/s", "SLO met"]
    cache = any(finite(v.summary.prefix_cache_hit_rate) is not None for v in views)
    if cache:
        head.append("prefix cache hit")
    client = any(v.summary.client is not None for v in views)
    if client:
        head.append("client")
    cost = any(v.summary.cost is not None for v in views)
    if cost:
        head.append("cost $/1M out tok")
    out += [_row(head), _sep(len(head), numeric_from=6)]
    for v in views:
        sm = v.summary
        frac = finite(sm.slo_met_fraction)
        hit = finite(sm.prefix_cache_hit_rate)
        out.append(_row([
            md_escape(v.load) + (f" **{md_escape(v.status)}**" if v.status not in ("done", "") else ""),
            f"{sm.requests_ok} / {sm.requests_failed}" + (f" / {sm.requests_rate_limited or 0}" if limited else ""),
            _trio(sm.ttft_ms), _trio(sm.tpot_ms), _trio(sm.itl_ms), _trio(sm.e2e_ms),
            fmt_num(finite(sm.output_tok_s)), fmt_num(finite(sm.per_user_tok_s.mean)),
            fmt_num(finite(sm.goodput_req_s)), f"{frac:.0%}" if frac is not None else "-",
            *([f"{hit:.1%}" if hit is not None else "-"] if cache else []),
            *([_client_cell(sm)] if client else []),
            *([fmt_num(sm.value("cost", "usd_per_1m_output_tokens"))] if cost else []),
        ]))
    out.append("")
    if limited:
        out += ["ok / failed / 429: the cell's requests that succeeded, that failed, and that the server refused by "
                "its rate limit (HTTP 429: counted apart from the failed ones, and measured in no latency figure).", ""]
    if client:
        out += ["Client: the load generator's own health in the cell (see the definitions): `ok`, `strained`, or "
                "**BOUND** when the client, not the server, limited the cell; CPU as a share of one core "
                "(with its wait for a CPU), loop lag p99 in ms.", ""]
    if cache:
        out += ["Prefix cache hit: cached / prompt tokens of the cell's successful requests, from the usage's "
                "`prompt_tokens_details.cached_tokens` when the server sent it, else from its `/metrics` prefix-cache "
                "counters over the cell.", ""]
    if cost:
        out += _cost_note(views)
    out += _turn_tables(views)
    quality_rows = load_quality_rows(views)
    if quality_rows and (synthetic := synthetic_note(rep.session.info.target.url)):
        quality_rows = [f"**{md_escape(synthetic[0].upper() + synthetic[1:])}.**", "", *quality_rows]
    out += quality_rows
    ans = next((a for a in rep.answers if a.workload == workload), None)
    if ans:
        out.append(f"- **Capacity at the SLOs:** {md_escape(ans.capacity.text())}")
        out.append(f"- **Knee:** {md_escape(ans.knee.text())}")
        if ans.peak_output_tok_s is not None:
            out.append(f"- **Peak aggregate throughput:** {fmt_num(ans.peak_output_tok_s)} output tok/s at "
                       f"{md_escape(ans.peak_load)}")
        at = next((v for v in completed(views) if ans.capacity.level is not None and v.x == ans.capacity.level
                   and v.summary.cost is not None), None)
        if at is not None and at.summary.cost is not None:
            c = at.summary.cost
            out.append(f"- **Cost at capacity:** ${fmt_num(finite(c.usd_per_1m_output_tokens))} per 1M output tokens "
                       f"(${fmt_num(finite(c.usd_per_1m_total_tokens))} per 1M tokens in all) at "
                       f"{md_escape(at.load)}: {md_escape(c.basis)}")
        if ans.left_out:
            out.append(f"- **Left out of these answers and the charts** (not completed): "
                       f"{md_escape(', '.join(ans.left_out))}")
        if ans.bound:
            out.append(f"- **Left out of these answers** (client bound: the load generator, not the server, "
                       f"limited them; `--include-bound` counts them): {md_escape(', '.join(ans.bound))}")
        elif ans.include_bound and any(v.summary.client_bound for v in views):
            out.append("- Client-bound cells are counted in these answers (`--include-bound`).")
        out.append("")
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
    out += _charts_for(workload, series, x_kind)
    return out
