"""A session as a document: Markdown that GitHub renders (tables and Mermaid `xychart-beta` charts), or csv
or json for scripts. `render_report(session, compare_with=[...])` adds the delta tables of a comparison."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from servescope import __version__
from servescope.core.metrics import FORMULAS, SLO_ATTAINMENT
from servescope.core.textsafe import clean_text, md_escape
from servescope.sessions.compare import (
    CellView,
    Comparison,
    ThinkingCost,
    WorkloadAnswers,
    apply_slos,
    cell_views,
    choose_slos,
    compare_sessions,
    derive,
    fmt_num,
    metric_value,
    session_label,
    slo_text,
    thinking_costs,
    thinking_markdown,
)
from servescope.sessions.store import Session

FORMATS = ("md", "csv", "json")

EXTRA_DEFINITIONS: dict[str, str] = {
    "percentiles": "p50/p90/p95/p99 by linear interpolation over the cell's successful requests (ITL: over all gaps)",
    "slo_met": f"share of a cell's requests that succeeded within every SLO; a cell meets the SLOs at >= {SLO_ATTAINMENT:.0%}",
    "capacity": "the highest load level whose cell meets the SLOs",
    "knee": "the concurrency that maximises aggregate output tok/s x mean per-user tok/s; past it, extra "
            "aggregate throughput costs more per-user speed than it gains",
}


@dataclass
class SessionReport:
    session: Session
    label: str
    views: list[CellView]
    skipped: list[CellView]
    slos: dict[str, float]
    slos_source: str
    answers: list[WorkloadAnswers]
    thinking: list[ThinkingCost]
    notes: list[str]


def build(session: Session, slos: Mapping[str, float] | None = None, label_key: str | None = None) -> SessionReport:
    used, source = choose_slos([session], slos)
    views = cell_views(session)
    apply_slos(session, views, used)
    everything = cell_views(session, include_skipped=True)
    skipped = [v for v in everything if not v.summary]
    label = session_label(session, label_key)
    rep = SessionReport(session, label, views, skipped, used, source, derive(label, views),
                        thinking_costs(label, session, views), [])
    rep.notes = abnormal_notes(rep)
    return rep


# ---- notes on anything abnormal ---------------------------------------------------------------------
def abnormal_notes(rep: SessionReport) -> list[str]:
    s = rep.session
    notes: list[str] = []
    status = s.status
    if status != "completed":
        msg = clean_text(str(s.meta.get("message", "")))
        notes.append(f"the sweep did not complete (status {status})" + (f": {msg}" if msg else ""))
    for v in rep.skipped:
        notes.append(f"{v.workload} {v.load}: {v.status}" + (f" ({v.reason})" if v.reason else ""))
    kv = None
    for v in rep.views:
        cell = f"{v.workload} {v.load}"
        sm = v.summary
        if v.status not in ("done", ""):
            notes.append(f"{cell}: cell {v.status}" + (f" ({v.reason})" if v.reason else ""))
        failed = int(metric_value(sm, "requests_failed") or 0)
        total = failed + int(metric_value(sm, "requests_ok") or 0)
        if failed:
            errs = sm.get("errors") or []
            what = "; ".join(f"{e.get('status', '?')} x{e.get('len', '?')}"
                             + (f" ({clean_text(str(e.get('error')))[:80]})" if e.get("error") else "")
                             for e in errs if isinstance(e, Mapping))
            notes.append(f"{cell}: {failed} of {total} requests failed" + (f": {what}" if what else ""))
        raw_server = sm.get("server")
        server: Mapping[str, Any] = raw_server if isinstance(raw_server, Mapping) else {}
        pre = metric_value(server, "preemptions")
        if pre and pre > 0:
            notes.append(f"{cell}: the server preempted {pre:.0f} requests (KV cache full: requests were evicted "
                         "and recomputed)")
        for counter in ("requests_success", "generation_tokens"):
            c = metric_value(server, counter)
            if c is not None and c < 0:
                notes.append(f"{cell}: the server's {counter} counter went backwards: the server restarted "
                             "during this cell")
                break
        kv = metric_value(server, "kv_cache_tokens") or kv
        need_in = metric_value(sm, "input_tokens_mean") or metric_value(sm, "input_tokens_requested")
        need_out = metric_value(sm, "output_tokens_mean")
        if kv and v.concurrency and need_in is not None and need_out is not None:
            need = v.concurrency * (need_in + need_out)
            if need > kv:
                notes.append(f"{cell}: {v.concurrency} users need up to ~{need:,.0f} KV tokens, above the server's "
                             f"KV cache of {kv:,.0f} tokens: expect queueing and preemptions")
        q = metric_value(server, "queue_ms_mean")
        ttft = metric_value(sm, "ttft_ms.mean")
        if q is not None and ttft and q > 100 and q > 0.5 * ttft:
            notes.append(f"{cell}: requests waited {q:,.0f} ms on average in the server's queue "
                         f"({q / ttft:.0%} of TTFT): the server is saturated (KV cache or batch slots)")
        mm = sm.get("input_tokens_mismatch")
        req = metric_value(sm, "input_tokens_requested")
        if isinstance(mm, Mapping) and req:
            worst = metric_value(mm, "max_abs") or 0
            if worst > max(2.0, 0.01 * req):
                notes.append(f"{cell}: prompts differ from the requested length by up to {worst:.0f} tokens "
                             f"(mean {metric_value(mm, 'mean') or 0:+.1f}); requested {req:,.0f} on average")
        oreq, omean = metric_value(sm, "output_tokens_requested"), metric_value(sm, "output_tokens_mean")
        if oreq and omean is not None and omean < 0.95 * oreq:
            notes.append(f"{cell}: outputs averaged {omean:,.0f} tokens of {oreq:,.0f} requested "
                         "(the model stopped early: EOS honoured, or the context ran out)")
        cq = metric_value(sm, "client_queue_ms.p99")
        if cq is not None and cq > 10 and v.rate is not None:
            notes.append(f"{cell}: p99 client queueing {cq:,.1f} ms: requests left later than scheduled "
                         "(the client or its connection cap fell behind; latencies exclude that wait)")
        if sm.get("slo_unknown"):
            notes.append(f"{cell}: no per-request data: cannot judge it against these SLOs")
    imp = s.meta.get("import")
    if isinstance(imp, Mapping):
        fmt = clean_text(str(imp.get("format", "?")))
        lacks = imp.get("lacks") or {}
        notes.append(f"imported from {fmt}" + (" with per-request data" if imp.get("detailed") else
                                               " without per-request data (--save-detailed was not used)")
                     + "; it lacks: " + "; ".join(f"{k} ({clean_text(str(v))})" for k, v in lacks.items()))
    return notes


# ---- Markdown ---------------------------------------------------------------------------------------
def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c if c else "-" for c in cells) + " |"


def _sep(n: int, numeric_from: int = 99) -> str:
    return "|" + "|".join("---:" if i >= numeric_from else "---" for i in range(n)) + "|"


def _dist_text(d: Any) -> str:
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
    vals = [metric_value(v.summary, summary_key) for v in views if v.base == workload]
    got = [x for x in vals if x is not None]
    return f"mean {fmt_num(sum(got) / len(got))} (no per-request data)" if got else "-"


def _setup(rep: SessionReport) -> list[str]:
    m = rep.session.meta
    t = m.get("target") or {}
    server = m.get("server") if isinstance(m.get("server"), Mapping) else {}
    gpu = m.get("gpu")
    kv = None
    for v in rep.views:
        sv = v.summary.get("server")
        if isinstance(sv, Mapping) and metric_value(sv, "kv_cache_tokens"):
            kv = metric_value(sv, "kv_cache_tokens")
            break
    load = m.get("load") or {}
    conc = load.get("concurrency")
    rates = load.get("rates")
    load_txt = (f"concurrency {', '.join(map(str, conc))}" if conc else
                f"rates {', '.join(f'{r:g}' for r in rates)}/s {load.get('arrival', '')}" if rates else
                "each workload's defaults")
    if load.get("requests"):
        load_txt += f"; {load['requests']} requests per cell"
    if load.get("duration_s"):
        load_txt += f"; {load['duration_s']:g} s per cell"
    if load.get("warmup"):
        load_txt += f"; {load['warmup']} warmup requests"
    tags = m.get("tags") or {}
    dates = clean_text(str(m.get("started_at", "?")))
    if m.get("ended_at"):
        dates += f" to {clean_text(str(m['ended_at']))}"
    gpu_txt = "not recorded"
    if isinstance(gpu, Mapping):
        gpu_txt = ", ".join(f"{k} {clean_text(str(v))}" for k, v in gpu.items())
    elif gpu:
        gpu_txt = clean_text(str(gpu))
    args = server.get("args") if server else None
    rows = [
        ("target", clean_text(str(t.get("url", "?")))),
        ("server version", clean_text(str(t.get("version") or "not reported"))),
        ("server arguments", clean_text(" ".join(map(str, args)) if isinstance(args, list) else str(args))
         if args else "not known (servescope did not launch the server)"),
        *([("server variants", "; ".join(f"{i + 1}: {clean_text(str(v))}" for i, v in enumerate(server["variants"]))
            + " (the sweep ran once per variant, the server relaunched; each variant's results have their own "
              "section)")] if server and server.get("variants") else []),
        ("model", clean_text(str(m.get("model", "?")))),
        ("max model length", f"{m['max_model_len']:,}" if isinstance(m.get("max_model_len"), int) else "not reported"),
        ("KV cache", f"{kv:,.0f} tokens (from /metrics)" if kv else "not reported"),
        ("GPU", gpu_txt),
        ("tags", ", ".join(f"{k}={clean_text(str(v))}" for k, v in tags.items()) or "none"),
        ("date", dates),
        ("status", rep.session.status),
        ("load", load_txt),
        ("SLOs", f"{slo_text(rep.slos)} ({rep.slos_source})"),
        ("client", f"servescope {clean_text(str(m.get('servescope_version', '?')))} on "
                   f"{clean_text(str(m.get('host', '?')))}, tokenizer: {clean_text(str(t.get('tokenizer', '?')))}"),
    ]
    out = ["## Setup", "", "| | |", "|---|---|"]
    out += [f"| {k} | {md_escape(v)} |" for k, v in rows]
    return out + [""]


def _workloads(rep: SessionReport) -> list[str]:
    out = ["## Workloads", "",
           "A benchmark lies unless it states its length distributions: requested is what the workload asked "
           "for, measured is what the server counted (`usage`).", "",
           _row(["workload", "api", "thinking", "input requested", "input measured", "output requested",
                 "output measured", "reasoning tokens (mean)"]),
           _sep(8)]
    present = {v.base for v in rep.views}
    for w in rep.session.meta.get("workloads", []):
        if not isinstance(w, Mapping) or w.get("name") not in present:
            continue
        name = str(w["name"])
        think = {True: "on", False: "off"}.get(bool(w["thinking"]), "") if "thinking" in w else "server default"
        inp = _dist_text(w.get("input_tokens"))
        if w.get("dataset"):
            inp = f"dataset {clean_text(str(w['dataset'])).split('/')[-1]}"
        if w.get("prefix_tokens"):
            inp += f", {w['prefix_tokens']} shared prefix"
        reas = [metric_value(v.summary, "reasoning_tokens_mean") for v in rep.views if v.base == name]
        rs = [r for r in reas if r is not None]
        out.append(_row([md_escape(name), md_escape(str(w.get("api", "?"))), think, md_escape(inp),
                         md_escape(_measured(rep.session, rep.views, name, "prompt_tokens", "input_tokens_mean")),
                         md_escape(_dist_text(w.get("output_tokens"))),
                         md_escape(_measured(rep.session, rep.views, name, "output_tokens", "output_tokens_mean")),
                         fmt_num(sum(rs) / len(rs)) if rs else "-"]))
    return out + [""]


def _definitions() -> list[str]:
    out = ["## Metric definitions", "", "| metric | definition |", "|---|---|"]
    for k, v in FORMULAS.items():
        out.append(f"| `{k}` | {md_escape(v)} |")
    for k, v in EXTRA_DEFINITIONS.items():
        out.append(f"| {k} | {md_escape(v)} |")
    return out + [""]


def _trio(sm: Mapping[str, Any], key: str) -> str:
    return " / ".join(fmt_num(metric_value(sm, f"{key}.{p}")) for p in ("p50", "p90", "p99"))


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
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * mag >= v * 1.05:
            return m * mag
    return 10 * mag


CHARTS = (("output_tok_s", "aggregate output tok/s"), ("per_user_tok_s.mean", "per-user tok/s (mean)"),
          ("ttft_ms.p99", "TTFT p99 ms"))


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
            vals = [metric_value(v.summary, key) for v in views]
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


def _workload_section(rep: SessionReport, workload: str, comparison: Comparison | None,
                      others: Sequence[SessionReport]) -> list[str]:
    views = [v for v in rep.views if v.workload == workload]
    out = [f"## Results: {md_escape(workload)}", ""]
    head = ["load", "ok / failed", "TTFT ms p50 / p90 / p99", "TPOT ms p50 / p90 / p99", "ITL ms p50 / p90 / p99",
            "E2E ms p50 / p90 / p99", "output tok/s", "per-user tok/s", "goodput req/s", "SLO met"]
    out += [_row(head), _sep(len(head), numeric_from=6)]
    for v in views:
        sm = v.summary
        frac = metric_value(sm, "slo_met_fraction")
        out.append(_row([
            md_escape(v.load),
            f"{int(metric_value(sm, 'requests_ok') or 0)} / {int(metric_value(sm, 'requests_failed') or 0)}",
            _trio(sm, "ttft_ms"), _trio(sm, "tpot_ms"), _trio(sm, "itl_ms"), _trio(sm, "e2e_ms"),
            fmt_num(metric_value(sm, "output_tok_s")), fmt_num(metric_value(sm, "per_user_tok_s.mean")),
            fmt_num(metric_value(sm, "goodput_req_s")), f"{frac:.0%}" if frac is not None else "-",
        ]))
    out.append("")
    ans = next((a for a in rep.answers if a.workload == workload), None)
    if ans:
        out.append(f"- **Capacity at the SLOs:** {md_escape(ans.capacity.text())}")
        out.append(f"- **Knee:** {md_escape(ans.knee.text())}")
        if ans.peak_output_tok_s is not None:
            out.append(f"- **Peak aggregate throughput:** {fmt_num(ans.peak_output_tok_s)} output tok/s at "
                       f"{md_escape(ans.peak_load)}")
        out.append("")
    closed = [v for v in views if v.concurrency is not None]
    x_kind = "concurrency" if closed else "rate"
    base = closed or [v for v in views if v.rate is not None]
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


def render_markdown(rep: SessionReport, others: Sequence[SessionReport] = (),
                    comparison: Comparison | None = None) -> str:
    m = rep.session.meta
    model = clean_text(str(m.get("model", "?"))).rstrip("/").split("/")[-1]
    out = [f"# servescope report: {md_escape(rep.label)}", "",
           f"{md_escape(model)} on {md_escape(clean_text(str((m.get('target') or {}).get('url', '?'))))}: "
           f"{_plural(len(rep.views), 'cell')} over {_plural(len({v.workload for v in rep.views}), 'workload')} "
           f"(session `{md_escape(rep.session.path.name).replace('`', '')}`).", ""]
    out += _setup(rep)
    out += _workloads(rep)
    out += _definitions()
    for w in dict.fromkeys(v.workload for v in rep.views):
        out += _workload_section(rep, w, comparison, others)
    if rep.thinking:
        out += thinking_markdown(rep.thinking, 2)
    out += ["## Notes", ""]
    if rep.notes:
        out += [f"- {md_escape(n)}" for n in rep.notes]
    else:
        out.append("Nothing abnormal: no failed requests, preemptions, KV cache saturation, length mismatches "
                   "or server restarts.")
    out.append("")
    if comparison is not None:
        out.append(comparison.to_markdown(level=2))
    out.append(f"Generated by servescope {__version__}.")
    return "\n".join(out).rstrip() + "\n"


# ---- csv and json -----------------------------------------------------------------------------------
def cells_frame(reps: Sequence[SessionReport]) -> pl.DataFrame:
    frames = []
    for r in reps:
        df = r.session.cells
        if df.height == 0:
            continue
        df = df.drop([c for c in ("summary_json",) if c in df.columns])
        frames.append(df.with_columns(session=pl.lit(r.label), session_dir=pl.lit(r.session.path.name))
                      .select("session", "session_dir", pl.exclude("session", "session_dir")))
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def _rep_dict(r: SessionReport) -> dict[str, Any]:
    m = r.session.meta
    return {
        "label": r.label,
        "session_dir": str(r.session.path),
        "name": m.get("name"),
        "model": m.get("model"),
        "target": m.get("target"),
        "tags": m.get("tags") or {},
        "status": r.session.status,
        "started_at": m.get("started_at"),
        "workloads": m.get("workloads"),
        "import": m.get("import"),
        "slos": r.slos,
        "slos_source": r.slos_source,
        "cells": [{"index": v.index, "workload": v.workload, "load": v.load, "concurrency": v.concurrency,
                   "rate": v.rate, "status": v.status, "summary": v.summary} for v in r.views],
        "skipped": [{"workload": v.workload, "load": v.load, "status": v.status, "reason": v.reason}
                    for v in r.skipped],
        "answers": [
            {"workload": a.workload, "capacity": a.capacity.level, "capacity_unit": a.capacity.unit,
             "capacity_not_reached": a.capacity.not_reached, "capacity_unknown": a.capacity.unknown,
             "knee_concurrency": a.knee.concurrency, "knee_not_reached": a.knee.not_reached,
             "peak_output_tok_s": a.peak_output_tok_s, "peak_load": a.peak_load}
            for a in r.answers
        ],
        "thinking": [{"thinking_on": t.thinking_on, "thinking_off": t.thinking_off, "loads": t.loads,
                      "e2e_ratio": t.e2e_ratio, "ttfo_ratio": t.ttfo_ratio, "capacity_ratio": t.capacity_ratio}
                     for t in r.thinking],
        "notes": r.notes,
    }


def render_report(session: Session, compare_with: Sequence[Session] = (), fmt: str = "md",
                  slos: Mapping[str, float] | None = None, label_key: str | None = None) -> str:
    """The report of `session` (plus delta tables against `compare_with`) as md, csv or json text."""
    if fmt not in FORMATS:
        from servescope.core.errors import ServescopeError

        raise ServescopeError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")
    comparison = None
    if compare_with:
        comparison = compare_sessions([session, *compare_with], label_key=label_key, slos=slos)
        slos = comparison.slos
    rep = build(session, slos, label_key)
    others = [build(s, rep.slos, label_key) for s in compare_with]
    if comparison is not None:
        rep.slos_source = comparison.slos_source
        rep.label = comparison.labels[0]
        for o, lb in zip(others, comparison.labels[1:], strict=True):
            o.label = lb
    if fmt == "md":
        return render_markdown(rep, others, comparison)
    if fmt == "csv":
        buf = io.StringIO()
        cells_frame([rep, *others]).write_csv(buf)
        return buf.getvalue()
    doc = {"servescope_version": __version__, "report": _rep_dict(rep),
           "compared_with": [_rep_dict(o) for o in others],
           "comparison": comparison.to_dict() if comparison is not None else None}
    return json.dumps(doc, indent=2, default=str) + "\n"
