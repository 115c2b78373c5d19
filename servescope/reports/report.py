"""A session as a document (servescope.reports.document): built once by `report_document()` and rendered as
Markdown that GitHub renders (tables and Mermaid `xychart-beta` charts; servescope.reports.render_md), as HTML with
its figures (servescope.reports.htmlreport), or as csv or json for scripts. `render_report(session,
compare_with=[...])` adds the comparison's delta tables."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence

import polars as pl

from servescope import __version__
from servescope.core.errors import ServescopeError
from servescope.core.health import client_text
from servescope.core.results import CellResult, ServerWindow, finite, rate_limit_line
from servescope.core.secrets import redact_command
from servescope.core.textsafe import clean_text
from servescope.core.tls import reuse_problem, target_tls_text
from servescope.reports.compare_doc import comparison_blocks, thinking_blocks
from servescope.reports.document import Block, Code, Document, FigureGroup, bullets, heading, para
from servescope.reports.figures import FigureSpec
from servescope.reports.quality_doc import quality_blocks
from servescope.reports.render_md import render_markdown as markdown_of
from servescope.reports.report_sections import (
    CHARTS,
    EXTRA_DEFINITIONS,
    SessionReport,
    _plural,
    definitions_blocks,
    setup_blocks,
    workload_blocks,
    workloads_blocks,
)
from servescope.reports.serving_doc import session_serving_blocks
from servescope.reports.tunereport import TUNE_FIGURE_KEY, tune_blocks
from servescope.reports.twin_doc import twin_blocks
from servescope.sessions.compare import (
    CellView,
    Comparison,
    apply_slos,
    cell_views,
    choose_slos,
    compare_sessions,
    derive,
    session_label,
    thinking_costs,
)
from servescope.sessions.provenance import measured_by
from servescope.sessions.quality import result_dict
from servescope.sessions.stats import DRIFT_MIN_PCT, WARMUP_RATIO, drift, measured, seed_for, warm_up
from servescope.sessions.store import Session, summary_columns
from servescope.sessions.twin import twin_record

__all__ = ["CHARTS", "EXTRA_DEFINITIONS", "FORMATS", "SessionReport", "abnormal_notes", "build", "cells_frame",
           "csv_rows", "render_csv", "render_markdown", "render_report", "report_document", "stability_notes"]

FORMATS = ("md", "csv", "json")

def build(session: Session, slos: Mapping[str, float] | None = None, label_key: str | None = None,
          include_bound: bool = False) -> SessionReport:
    used, source = choose_slos([session], slos)
    views = cell_views(session)
    apply_slos(session, views, used)
    everything = cell_views(session, include_skipped=True)
    skipped = [v for v in everything if not v.has_summary]
    label = session_label(session, label_key)
    rep = SessionReport(session, label, views, skipped, used, source, derive(label, views + skipped, include_bound),
                        thinking_costs(label, session, views), [], session.quality(), twin_record(session))
    rep.notes = abnormal_notes(rep)
    return rep


# ---- notes on anything abnormal ---------------------------------------------------------------------
def abnormal_notes(rep: SessionReport) -> list[str]:
    s = rep.session
    notes: list[str] = []
    status = s.status
    if status != "completed":
        msg = clean_text(s.info.message)
        what = "sweep" if rep.speed else "quality probe"
        notes.append(f"the {what} did not complete (status {status})" + (f": {msg}" if msg else ""))
    for v in rep.skipped:
        notes.append(f"{v.workload} {v.load}: {v.status}" + (f" ({v.reason})" if v.reason else ""))
    refused = s.meta.get("ignore_eos_dropped")
    if isinstance(refused, str) and refused:  # the server refused ignore_eos (engine/runner.py): outputs may be short
        notes.append(f"the server refused ignore_eos ({clean_text(refused)[:120]}): it was dropped for the session, "
                     "so outputs may end before max_tokens")
    kv = None
    for v in rep.views:
        cell = f"{v.workload} {v.load}"
        sm = v.summary
        if v.status not in ("done", ""):
            notes.append(f"{cell}: cell {v.status}" + (f" ({v.reason})" if v.reason else ""))
        failed = sm.requests_failed
        total = sm.requests
        if failed:
            what = "; ".join(f"{e.status if e.status is not None else '?'} x{e.len}"
                             + (f" ({clean_text(e.error)[:80]})" if e.error else "")
                             for e in sm.errors if e.status != "rate_limited")
            notes.append(f"{cell}: {failed} of {total} requests failed" + (f": {what}" if what else ""))
        if sm.connections is not None and v.concurrency:  # keep-alive held? (core/tls.py)
            reuse = reuse_problem(sm.connections.opened, v.concurrency, total)
            if reuse:
                notes.append(f"{cell}: {reuse}")
        if sm.mostly_rate_limited:
            notes.append(f"{cell}: {rate_limit_line(sm)}")
        elif sm.requests_rate_limited:
            notes.append(f"{cell}: {sm.requests_rate_limited} of {total} requests were rate-limited (HTTP 429), "
                         "counted apart from the failures")
        if sm.rate_limit_retries:
            notes.append(f"{cell}: {sm.rate_limit_retries} rate-limited requests were sent again (--retry-after) "
                         f"after {finite(sm.retry_wait_s) or 0:,.1f} s of waits in all; latencies are the served "
                         "attempts', the waits are in client queueing")
        server = sm.server or ServerWindow()
        pre = finite(server.preemptions)
        if pre and pre > 0:
            notes.append(f"{cell}: the server preempted {pre:.0f} requests (KV cache full: requests were evicted "
                         "and recomputed)")
        for counter in ("requests_success", "generation_tokens"):
            c = server.value(counter)
            if c is not None and c < 0:
                notes.append(f"{cell}: the server's {counter} counter went backwards: the server restarted "
                             "during this cell")
                break
        kv = finite(server.kv_cache_tokens) or kv
        need_in = finite(sm.input_tokens_mean) or finite(sm.input_tokens_requested)
        need_out = finite(sm.output_tokens_mean)
        if kv and v.concurrency and need_in is not None and need_out is not None:
            need = v.concurrency * (need_in + need_out)
            if need > kv:
                notes.append(f"{cell}: {v.concurrency} users need up to ~{need:,.0f} KV tokens, above the server's "
                             f"KV cache of {kv:,.0f} tokens: expect queueing and preemptions")
        q = finite(server.queue_ms_mean)
        ttft = finite(sm.ttft_ms.mean)
        if q is not None and ttft and q > 100 and q > 0.5 * ttft:
            notes.append(f"{cell}: requests waited {q:,.0f} ms on average in the server's queue "
                         f"({q / ttft:.0%} of TTFT): {queue_cause(v, waiting_samples(s, v))}")
        mm = sm.input_tokens_mismatch
        req = finite(sm.input_tokens_requested)
        if sm.input_lengths == "calibrated" and req:  # no /tokenize: sized on the server's usage, a few tokens off each
            got = finite(sm.input_tokens_mean)
            off = f" ({(got - req) / req:+.1%} on average)" if got is not None else ""
            notes.append(f"{cell}: input lengths are calibrated on the server's usage, not exact (no /tokenize): "
                         f"{got or 0:,.0f} tokens measured for {req:,.0f} requested{off}")
        elif mm is not None and req:
            worst = finite(mm.max_abs) or 0
            if worst > max(2.0, 0.01 * req):
                notes.append(f"{cell}: prompts differ from the requested length by up to {worst:.0f} tokens "
                             f"(mean {finite(mm.mean) or 0:+.1f}); requested {req:,.0f} on average")
        oreq, omean = finite(sm.output_tokens_requested), finite(sm.output_tokens_mean)
        if sm.output_check is not None:  # usage against the stream, above max_tokens, short despite ignore_eos
            notes += [f"{cell}: {clean_text(n)}" for n in sm.output_check.notes]
        if (sm.output_check is None or not sm.output_check.short) and oreq and omean is not None \
                and omean < 0.95 * oreq:
            notes.append(f"{cell}: outputs averaged {omean:,.0f} tokens of {oreq:,.0f} requested "
                         "(the model stopped early: EOS honoured, or the context ran out)")
        cq = finite(sm.client_queue_ms.p99)
        if cq is not None and cq > 10 and v.rate is not None and not sm.rate_limit_retries:  # retries: said above
            notes.append(f"{cell}: p99 client queueing {cq:,.1f} ms: requests left later than scheduled "
                         "(the client or its connection cap fell behind; latencies exclude that wait)")
        if v.slo_unknown:
            notes.append(f"{cell}: no per-request data: cannot judge it against these SLOs")
        ch = sm.client
        if ch is not None and ch.verdict in ("bound", "strained"):
            notes.append(f"{cell}: client {client_text(ch)}" + (
                " (its figures measure the load generator; capacity, knee and peak leave it out unless "
                "--include-bound; run the load from more cores or a stronger host)" if ch.verdict == "bound" else
                ": its timestamps may be late by up to the loop lag"))
        notes += stability_notes(s, v)
    src = measured_by(s.info)
    if src.imported:
        how = (" with per-request data (every figure computed with servescope's formulas from its timestamps)"
               if src.rebuilt else " without per-request data (the tool's aggregates"
               + (": --save-detailed was not used)" if src.tool == "vllm-bench" else ")"))
        notes.append(f"imported from {clean_text(src.tool_name)}{how}; it lacks: "
                     + "; ".join(f"{k} ({clean_text(str(v))})" for k, v in src.lacks.items()))
    return notes


KV_FULL = 0.90  # a KV cache used this much at its peak is full: requests wait for room (or are preempted)
PINNED = 0.80  # batch slots: running sat at its peak in this share of the samples that caught requests waiting
RUNNING_HELD = 0.90  # without the samples: running averaged this share of its peak over the cell


def waiting_samples(session: Session, v: CellView) -> list[tuple[float, float]] | None:
    """(running, waiting) of each telemetry.parquet sample inside the cell's measured window (its first request
    sent to its last answer, on the same clock) that caught a request waiting; None without the samples."""
    path = session.path / "telemetry.parquet"
    df = session.requests(v.index)
    if not path.is_file() or df.height == 0 or not {"sent_ns", "end_ns"} <= set(df.columns):
        return None
    if "warmup" in df.columns:
        df = df.filter(~pl.col("warmup"))
    t0, t1 = df["sent_ns"].min(), df["end_ns"].max()
    try:
        tele = pl.read_parquet(path, columns=["t_ns", "num_requests_running", "num_requests_waiting"])
    except Exception:  # noqa: BLE001 - a damaged or older telemetry file: the window's figures decide
        return None
    if not isinstance(t0, int) or not isinstance(t1, int):
        return None
    inside = tele.filter(pl.col("t_ns").is_between(t0, t1)).drop_nulls()
    return [(float(r), float(w)) for r, w in zip(inside["num_requests_running"], inside["num_requests_waiting"],
                                                 strict=True) if w > 0]


def queue_cause(v: CellView, samples: Sequence[tuple[float, float]] | None = None) -> str:
    """Why a cell's requests waited in the server's queue, as its /metrics telemetry over the cell shows it:
    - the KV cache: it filled (peak at or over 90%) or the server preempted requests;
    - batch slots: running held at its peak while requests waited (in the `samples` that caught one waiting:
      waiting_samples; without them, running averaged near its peak over the cell), the KV cache not full: the
      server's cap on running requests;
    - prefill: running climbed while requests waited, the KV cache not full: the server admitted waiting
      requests only as fast as it prefilled their prompts;
    - unknown, saying what is missing (no telemetry, or no sample caught a request waiting)."""
    sm = v.summary
    t = sm.telemetry
    server = sm.server or ServerWindow()
    pre = finite(server.preemptions) or (finite(t.preemptions) if t is not None else None)
    kv = finite(t.kv_cache_usage_peak) if t is not None else None
    kv_text = f"KV cache peak {kv:.0%}" if kv is not None else "KV cache use not reported"
    if (pre is not None and pre > 0) or (kv is not None and kv >= KV_FULL):
        what = ", ".join(x for x in (f"peak {kv:.0%}" if kv is not None else "",
                                     f"{pre:.0f} requests preempted" if pre else "") if x)
        return f"the KV cache was full ({what}): requests waited for room in it"
    running, waiting = (finite(t.running_max), finite(t.waiting_max)) if t is not None else (None, None)
    if t is None or not t.available or running is None or waiting is None:
        return ("the cause is unknown: no /metrics samples of running and waiting requests in this cell "
                f"({kv_text})")
    if waiting <= 0 or samples == []:
        return (f"the cause is unknown: no /metrics sample caught a request waiting (running up to {running:.0f}, "
                f"{kv_text}; sample more often with --telemetry-interval)")
    if samples:
        held = sum(1 for r, _ in samples if r >= running - 0.5) >= PINNED * len(samples)
    else:
        mean = finite(t.running_mean)
        held = mean is not None and mean >= RUNNING_HELD * running
    if held:
        return (f"the server's batch slots were full: at most {running:.0f} requests ran at once while up to "
                f"{waiting:.0f} waited, {kv_text} (its cap on running requests: vLLM's --max-num-seqs)")
    return (f"prefill-bound: running requests climbed to {running:.0f} while up to {waiting:.0f} waited, "
            f"{kv_text}: the server admitted waiting requests only as fast as it prefilled their prompts")


def stability_notes(session: Session, v: CellView) -> list[str]:
    """Drift within a cell (first vs last third of its requests by send time, beyond noise and by more than
    10%) and a warm-up effect (its first 5% of requests much slower to the first token): servescope.sessions.stats."""
    pr = measured(session.requests(v.index))
    if pr is None:
        return []
    cell = f"{v.workload} {v.load}"
    out = []
    w = warm_up(pr)
    if w is not None:
        out.append(f"{cell}: warm-up effect: its first {_plural(w.requests, 'request')} took {w.first_ttft_ms:,.0f} "
                   f"ms to the first token (p50), {w.ratio:.1f}x the rest's {w.rest_ttft_ms:,.0f} ms (over "
                   f"{WARMUP_RATIO:g}x): add warmup requests (--warmup) so the cell measures a warm server")
    for d in drift(pr, seed=seed_for(0, v.index)):
        what = "TTFT p50" if d.figure.startswith("ttft") else "per-request tok/s p50"
        j = d.judgement
        ci = ("no interval" if j.ci is None else f"95% interval {j.ci[0]:+.0f}% to {j.ci[1]:+.0f}%"
              if f"{j.ci[0]:+.0f}" != f"{j.ci[1]:+.0f}" else "no spread: deterministic server")
        moved = "rose" if (j.delta_pct or 0) > 0 else "fell"
        out.append(f"{cell}: drift within the cell: {what} {moved} {abs(j.delta_pct or 0):.0f}% ({ci}) from "
                   f"the first third of its requests to the last ({_plural(d.requests, 'request')} each, by send "
                   f"time; {d.first:,.1f} -> {d.last:,.1f}), beyond noise and over {DRIFT_MIN_PCT:g}%: the "
                   "server's state changed during the cell (a filling cache, throttling, other load)")
    return out


def _tls_part(rep: SessionReport) -> str:
    """An https target's TLS handshake and connect time (measured apart from the TTFT) and how it was verified."""
    text = target_tls_text(rep.session.meta.get("target"))
    return f" ({clean_text(text)})" if text else ""


def report_document(rep: SessionReport, others: Sequence[SessionReport] = (), comparison: Comparison | None = None,
                    figures: Sequence[FigureSpec] | None = None) -> Document:
    """The report as a document. With `figures` (the specs servescope.reports.figures makes for it), each figure
    is placed in the section it belongs to: a workload's at the end of its results, the search's in the tune
    section, the comparison's after its delta tables, the others (context, telemetry) in a Figures section before
    the notes."""
    m = rep.session.info
    model = clean_text(m.model).rstrip("/").split("/")[-1]
    speed = rep.speed and m.kind != "tune"  # a tune session's cells are sessions of their own (its section)
    what = (f"{_plural(len(rep.views), 'cell')} over {_plural(len({v.workload for v in rep.views}), 'workload')}"
            if speed else ("tune search" if m.kind == "tune" else "quality probe"))
    specs = list(figures or ())
    workloads = list(dict.fromkeys(v.workload for v in rep.views)) if speed else []
    by_section: dict[str, list[str]] = {}
    rest: list[str] = []
    compared: list[str] = []
    for f in specs:
        if f.kind == "compare":
            (compared if comparison is not None else rest).append(f.name)
        elif f.kind == "tune" and m.kind == "tune":
            by_section.setdefault(TUNE_FIGURE_KEY, []).append(f.name)
        elif f.workload is not None and f.workload in workloads:
            by_section.setdefault(f.workload, []).append(f.name)
        else:
            rest.append(f.name)
    blocks: list[Block] = [
        heading(1, f"servescope report: {rep.label}"),
        para(f"{model} on {clean_text(m.target.url)}{_tls_part(rep)}: {what} (session ", Code(rep.session.path.name),
             ")."),
        *setup_blocks(rep)]
    if speed:
        blocks += workloads_blocks(rep)
        blocks += definitions_blocks(with_client=any(v.summary.client is not None for v in rep.views))
        for w in workloads:
            blocks += workload_blocks(rep, w, comparison, others, by_section.get(w, []))
        blocks += session_serving_blocks(rep.views, 2)  # speculation on vs off, the servers' start-up
        blocks += thinking_blocks(rep.thinking, 2)
    if rep.quality is not None:
        blocks += quality_blocks(rep.session, rep.quality, 2)
    if rep.twin is not None:
        blocks += twin_blocks(rep.twin, 2)
    if m.kind == "tune":
        tune = tune_blocks(rep.session.meta.get("tune"), 2, by_section.get(TUNE_FIGURE_KEY, []))
        blocks += tune
        if not tune:
            rest += by_section.get(TUNE_FIGURE_KEY, [])
    if rest:
        blocks.append(FigureGroup(2, "Figures", tuple(rest)))
    blocks.append(heading(2, "Notes"))
    if rep.notes:
        blocks.append(bullets(rep.notes))
    elif speed:
        blocks.append(para("Nothing abnormal: no failed requests, preemptions, KV cache saturation, length mismatches "
                           "or server restarts."))
    else:
        blocks.append(para("Nothing abnormal."))
    if comparison is not None:
        blocks += comparison_blocks(comparison, 2, compared)
    blocks.append(para(f"Generated by servescope {__version__}."))
    return Document(f"servescope report: {rep.label}", blocks)


def render_markdown(rep: SessionReport, others: Sequence[SessionReport] = (),
                    comparison: Comparison | None = None) -> str:
    """The report as Markdown, its charts as Mermaid blocks (`servescope report`)."""
    return markdown_of(report_document(rep, others, comparison))


# ---- csv and json -----------------------------------------------------------------------------------
def cells_frame(reps: Sequence[SessionReport]) -> pl.DataFrame:
    """Every cell of the sessions as stored in cells.parquet (nested columns included), with the session."""
    frames = []
    for r in reps:
        df = r.session.cells
        if df.height == 0:
            continue
        df = df.drop([c for c in ("summary_json",) if c in df.columns])
        frames.append(df.with_columns(session=pl.lit(r.label), session_dir=pl.lit(r.session.path.name))
                      .select("session", "session_dir", pl.exclude("session", "session_dir")))
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def _dotted(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """{'ttft_ms': {'p50': 1.0}} -> {'ttft_ms.p50': 1.0}; lists stay whole (written as JSON)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_dotted(v, key + "."))
        else:
            out[key] = v
    return out


def _csv_value(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, (int, str)):
        return str(v)
    return json.dumps(v, default=str, allow_nan=True)


def csv_rows(reps: Sequence[SessionReport]) -> tuple[list[str], list[dict[str, object]]]:
    """One flat row per cell: the session, the cell's plan (workload, load, status...), then every summary
    figure as a dotted column (`ttft_ms.p50`, `server.preemptions`); lists (errors) as JSON text."""
    columns: dict[str, None] = {"session": None, "session_dir": None}
    rows: list[dict[str, object]] = []
    for r in reps:
        recs = r.session.cells.to_dicts()
        summs = []
        for rec in recs:
            js = rec.pop("summary_json", None)
            cs = CellResult.from_json(js) if isinstance(js, str) else None
            summs.append(cs.to_dict() if cs is not None else {})
        stored: set[str] = set()  # the summaries' flat copies in cells.parquet (`ttft_ms_p50`): not repeated
        for summ in summs:
            stored |= set(summary_columns(summ)) | set(summ)
        for rec, summ in zip(recs, summs, strict=True):
            row: dict[str, object] = {"session": r.label, "session_dir": r.session.path.name}
            row.update({k: v for k, v in rec.items() if k not in stored})
            if "server_variant" in row and isinstance(row["server_variant"], str):
                row["server_variant"] = redact_command(row["server_variant"])
            row.update(_dotted(summ))
            columns.update(dict.fromkeys(row))
            rows.append(row)
    return list(columns), rows


def render_csv(reps: Sequence[SessionReport]) -> str:
    cols, rows = csv_rows(reps)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for row in rows:
        w.writerow([_csv_value(row.get(c)) for c in cols])
    return buf.getvalue()


def _import_table(session: Session) -> dict[str, object] | None:
    """The report JSON's `import` (as sessions imported before the [source] table stored it): None when servescope
    measured the session."""
    src = measured_by(session.info)
    if not src.imported:
        return None
    return {"format": src.tool if src.tool != "vllm-bench" else "vllm-bench-serve", "files": src.files,
            "detailed": src.rebuilt, "dates": src.dates, "lacks": src.lacks}


def _rep_dict(r: SessionReport) -> dict[str, object]:
    m = r.session.meta  # as stored: the json report passes these tables through unchanged
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
        "import": _import_table(r.session),
        "source": measured_by(r.session.info).to_dict() if measured_by(r.session.info).imported else None,
        "slos": r.slos,
        "slos_source": r.slos_source,
        "cells": [{"index": v.index, "workload": v.workload, "load": v.load, "concurrency": v.concurrency,
                   "rate": v.rate, "status": v.status, "summary": v.summary_dict()} for v in r.views],
        "skipped": [{"workload": v.workload, "load": v.load, "status": v.status, "reason": v.reason}
                    for v in r.skipped],
        "answers": [
            {"workload": a.workload, "capacity": a.capacity.level, "capacity_unit": a.capacity.unit,
             "capacity_not_reached": a.capacity.not_reached, "capacity_unknown": a.capacity.unknown,
             "knee_concurrency": a.knee.concurrency, "knee_not_reached": a.knee.not_reached,
             "peak_output_tok_s": a.peak_output_tok_s, "peak_load": a.peak_load,
             "left_out_client_bound": a.bound, "include_bound": a.include_bound}
            for a in r.answers
        ],
        "thinking": [{"thinking_on": t.thinking_on, "thinking_off": t.thinking_off, "loads": t.loads,
                      "e2e_ratio": t.e2e_ratio, "ttfo_ratio": t.ttfo_ratio, "capacity_ratio": t.capacity_ratio}
                     for t in r.thinking],
        "notes": r.notes,
        **({"kind": r.session.info.kind} if r.session.info.kind != "sweep" else {}),
        **({"tune": m.get("tune")} if r.session.info.kind == "tune" else {}),
        **({"quality": {**result_dict(r.quality), "settings": m.get("quality")}} if r.quality is not None else {}),
        **({"twin": {"fit": r.twin.fit, "efficiency": r.twin.efficiency, "confirmations": r.twin.confirmations}}
           if r.twin is not None else {}),
    }


def build_all(session: Session, compare_with: Sequence[Session] = (), slos: Mapping[str, float] | None = None,
              label_key: str | None = None, include_bound: bool = False,
              ) -> tuple[SessionReport, list[SessionReport], Comparison | None]:
    """The report of `session`, the others' (judged by the same SLOs) and, with others, their comparison, each
    report labelled as the comparison labels it: what every report format renders."""
    comparison = None
    if compare_with:
        comparison = compare_sessions([session, *compare_with], label_key=label_key, slos=slos,
                                      include_bound=include_bound)
        slos = comparison.slos
    rep = build(session, slos, label_key, include_bound)
    others = [build(s, rep.slos, label_key, include_bound) for s in compare_with]
    if comparison is not None:
        rep.slos_source = comparison.slos_source
        rep.label = comparison.labels[0]
        for o, lb in zip(others, comparison.labels[1:], strict=True):
            o.label = lb
    return rep, others, comparison


def render_report(session: Session, compare_with: Sequence[Session] = (), fmt: str = "md",
                  slos: Mapping[str, float] | None = None, label_key: str | None = None,
                  include_bound: bool = False) -> str:
    """The report of `session` (plus delta tables against `compare_with`) as md, csv or json text; client-bound
    cells count in capacity, knee and peak only with `include_bound`."""
    if fmt not in FORMATS:
        raise ServescopeError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")
    rep, others, comparison = build_all(session, compare_with, slos, label_key, include_bound)
    if fmt == "md":
        return render_markdown(rep, others, comparison)
    if fmt == "csv":
        return render_csv([rep, *others])
    doc = {"servescope_version": __version__, "report": _rep_dict(rep),
           "compared_with": [_rep_dict(o) for o in others],
           "comparison": comparison.to_dict() if comparison is not None else None}
    return json.dumps(doc, indent=2, default=str) + "\n"
