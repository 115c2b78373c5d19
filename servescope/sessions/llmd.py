"""llm-d's benchmark report (llm-d/llm-d-benchmark, `llmdbenchmark/analysis/benchmark_report/`): read as cells,
and a session written as one report per cell.

A report is one run of one load: `scenario` (the stack serving the model, and the load: its harness tool, its
sequence lengths, its rate or concurrency) and its results (schema 0.2: `results.request_performance.aggregate`;
0.1: `metrics`): request counts, latency and throughput statistics with their units. Reports hold aggregates only:
an import keeps them and lists what they lack; the definitions of its figures are its harness's (a report servescope
wrote has servescope's). Units are taken at their word: an ITL in `ms/token` or `s/token` is servescope's ITL per
token (`itl_token_ms`), one in `ms` or `s` its ITL per chunk gap (`itl_ms`).

`export_reports()` writes schema 0.1 by default (top-level `version`, `scenario`, `metrics`: the names scripts rely
on) or 0.2 (`version`, `run`, `scenario`, `results`); both schema files and their source are in
tests/sessions/data/llmd/. Every figure servescope has a place for in the schema goes in, in the schema's units, and
the workload, load, window and definitions as servescope names them (0.2: `scenario.load.native.config.servescope`;
0.1: `scenario.load.metadata.servescope`), so a report servescope wrote imports back to the same cells.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from servescope import __version__
from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.results import CellResult, CellWindow, Dist
from servescope.core.textsafe import clean_text
from servescope.sessions.importcommon import (
    MAX_TOKENS,
    ImportedCell,
    ReadResult,
    Values,
    aggregate_summary,
    dist_table,
    read_json,
    read_yaml,
)
from servescope.sessions.measurement import window_label
from servescope.sessions.provenance import (
    SERVER_USAGE,
    SERVESCOPE_DEFINITIONS,
    TOOL_DEFINITIONS,
    SourceMeta,
    measured_by,
)
from servescope.sessions.store import Session, atomic_write
from servescope.sessions.views import CellView, cell_views
from servescope.workloads.spec import DistTable, WorkloadTable

FORMAT = "llmd-report"
SCHEMA_VERSIONS = ("0.1", "0.2")  # what export writes; 0.1 by default (its top-level keys are the contract's)
DEFAULT_SCHEMA = "0.1"
HINT = "the file is damaged or not an llm-d benchmark report (schema 0.1 or 0.2)"
LACKS = {
    "per_request": "a benchmark report holds aggregates only: no interval and no SLO judgement",
    "ttfo_ms": "not in the report",
    "per_user_tok_s": "not in the report",
    "prefill_tok_s": "not in the report",
    "slo_met_fraction": "needs per-request data: capacity at the SLOs is unknown",
    "server": "no /metrics deltas",
}
# the report's latency statistics -> servescope's figures
_LATENCY = {"time_to_first_token": "ttft_ms", "time_per_output_token": "tpot_ms", "inter_token_latency": "itl_ms",
            "request_latency": "e2e_ms"}
_SCALE = {"s": 1000.0, "ms": 1.0, "s/token": 1000.0, "ms/token": 1.0}
_PER_TOKEN = ("s/token", "ms/token")
# schema 0.1's load generators (its WorkloadGenerator enum) by the import formats whose tools they are; a tool the
# enum has no name for (servescope, AIPerf) writes vllm-benchmark, whose definitions servescope's figures share, and
# names itself in scenario.load.metadata.tool
_GENERATOR_01 = {"guidellm": "guidellm", "inference-perf": "inference-perf", "vllm-bench": "vllm-benchmark"}
# the harness names a report gives its load tool -> the import formats whose definitions they used
_HARNESS = {"guidellm": "guidellm", "aiperf": "aiperf", "inference-perf": "inference-perf",
            "inference_perf": "inference-perf", "vllm-benchmark": "vllm-bench", "vllm_benchmark": "vllm-bench",
            "vllm-bench": "vllm-bench", "servescope": "servescope"}


def detect(data: object) -> bool:
    if not isinstance(data, Mapping):
        return False
    version = str(data.get("version", ""))
    return version.startswith("0.") and ("results" in data or "metrics" in data) and "scenario" in data or (
        version.startswith("0.2") and "run" in data and "results" in data)


def load(path: Path) -> object:
    """A report file's data: JSON, else YAML (None when it is neither)."""
    data = read_json(path)
    return data if data is not None else read_yaml(path)


# ---- import ---------------------------------------------------------------------------------------------------
def read(paths: Sequence[Path], workload_name: str | None) -> ReadResult:
    cells: list[ImportedCell] = []
    tools: dict[str, str | None] = {}
    dates: list[str] = []
    versions: set[str] = set()
    stated: list[tuple[dict[str, str], str]] = []
    for p in paths:
        data = load(p)
        if not detect(data) or not isinstance(data, Mapping):
            raise ServescopeError(f"{p}: not an llm-d benchmark report; {HINT}")
        v = Values(str(p), HINT)
        cell, tool, version, date = _cell(v, p, data, workload_name)
        tools[tool] = version
        stated.append(_stated(v, data))
        versions.add(clean_text(str(data.get("version")))[:10])
        if date:
            dates.append(date)
        cells.append(cell)
    harness = next(iter(tools)) if len(tools) == 1 else ""
    fmt = _HARNESS.get(harness.lower(), "")
    if fmt == "servescope":
        defs, basis = dict(SERVESCOPE_DEFINITIONS), SERVER_USAGE
    elif fmt in TOOL_DEFINITIONS:
        defs, basis = dict(TOOL_DEFINITIONS[fmt]), "unknown"
    else:
        defs = {k: f"as {harness or 'the harnesses'} defines it" for k in SERVESCOPE_DEFINITIONS}
        basis = "unknown"
    if stated and all(s == stated[0] and s[0] for s in stated):  # a report servescope wrote: its own definitions
        defs, basis = dict(stated[0][0]), stated[0][1] or basis
    measured = ", ".join(f"{t} {v}" if v else t for t, v in tools.items())
    lacks = dict(LACKS)
    has_gap = any(c.summary.itl_ms.mean is not None for c in cells)
    has_token = any(c.summary.itl_token_ms.mean is not None for c in cells)
    if not has_gap:
        lacks["itl_ms"] = "the report's ITL is per token (itl_token_ms), not per chunk gap" if has_token else \
            "not in the report"
    if not has_token:
        lacks["itl_token_ms"] = "the report's ITL is per chunk gap (itl_ms), not per token" if has_gap else \
            "not in the report"
    return ReadResult(tool=FORMAT, cells=cells, tool_version=None, harness=clean_text(measured)[:120] or None,
                      format=f"llm-d benchmark report (schema {', '.join(sorted(versions))})", token_basis=basis,
                      tool_token_basis=basis, warmup="unknown", ramp="unknown", definitions=defs, lacks=lacks,
                      dates=dates)


def _stats(v: Values, key: str, raw: object, want: str) -> dict[str, float | None]:
    """A Statistics block in servescope's unit (`want`: "ms", "count", "tokens/s"): {} when absent."""
    t = v.table(key, raw)
    if not t:
        return {}
    units = v.text(f"{key}.units", t.get("units"))
    scale = 1.0
    if want == "ms":
        if units not in _SCALE:
            raise v.bad(f"{key}.units", units, "s, ms, s/token or ms/token")
        scale = _SCALE[units]
    out: dict[str, float | None] = {}
    for ours, theirs in (("mean", "mean"), ("std", "stddev"), ("min", "min"), ("max", "max"), ("p50", "p50"),
                         ("p90", "p90"), ("p95", "p95"), ("p99", "p99")):
        x = v.num(f"{key}.{theirs}", t.get(theirs), lo=0.0, hi=1e15)
        out[ours] = x * scale if x is not None else None
    return out


_DURATION = re.compile(r"^P(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)$")


def _duration(v: Values, key: str, raw: object) -> float | None:
    """An ISO-8601 duration ("PT49.97S") or a number of seconds."""
    if raw is None:
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return v.num(key, raw)
    m = _DURATION.match(v.text(key, raw, limit=60))
    if m is None or not any(m.groups()):
        raise v.bad(key, raw, "an ISO-8601 duration such as PT49.97S")
    h, mi, s = (float(x) if x else 0.0 for x in m.groups())
    return v.num(key, h * 3600 + mi * 60 + s)


def _seq(v: Values, key: str, raw: object) -> DistTable | None:
    t = v.table(key, raw)
    if not t:
        return None
    value = v.num(f"{key}.value", t.get("value"), hi=MAX_TOKENS)
    lo = v.num(f"{key}.min", t.get("min"), hi=MAX_TOKENS)
    hi = v.num(f"{key}.max", t.get("max"), hi=MAX_TOKENS)
    if value is None:
        return None
    if t.get("distribution") == "uniform" and lo is not None and hi is not None and lo <= hi:
        return {"dist": "uniform", "min": round(lo), "max": round(hi)}
    return {"dist": "fixed", "value": round(value)}


def _cell(v: Values, path: Path, data: Mapping[str, object], workload_name: str | None
          ) -> tuple[ImportedCell, str, str | None, str]:
    version = v.text("version", data.get("version"))
    scenario = v.table("scenario", data.get("scenario"))
    load = v.table("scenario.load", scenario.get("load"))
    if version.startswith("0.2"):
        std = v.table("scenario.load.standardized", load.get("standardized"))
        native = v.table("scenario.load.native", load.get("native"))
        ncfg = native.get("config")
        ncfg = ncfg if isinstance(ncfg, Mapping) else {}
        ours = v.table("scenario.load.native.config.servescope", ncfg.get("servescope"))
        nload = ncfg.get("load")  # a harness's own load settings (inference-perf: its load.type)
        native_arrival = str(nload.get("type")) if isinstance(nload, Mapping) and nload.get("type") in (
            "constant", "poisson") else None
        tool = v.text("scenario.load.standardized.tool", std.get("tool")) or "unknown"
        tool_version = v.text("scenario.load.standardized.tool_version", std.get("tool_version")) or None
        results = v.table("results", data.get("results"))
        agg = v.table("results.request_performance.aggregate", v.table(
            "results.request_performance", results.get("request_performance")).get("aggregate"))
        base = "results.request_performance.aggregate"
        run = v.table("run", data.get("run"))
        time = v.table("run.time", run.get("time"))
        wall = _duration(v, "run.time.duration", time.get("duration"))
        date = v.text("run.time.start", time.get("start"))
        rate = v.num("scenario.load.standardized.rate_qps", std.get("rate_qps"), hi=1e9)
        conc_raw = std.get("concurrency")
        conc = None if isinstance(conc_raw, float) and math.isinf(conc_raw) else \
            v.count("scenario.load.standardized.concurrency", conc_raw, lo=1)
        in_seq, out_seq = (_seq(v, "scenario.load.standardized.input_seq_len", std.get("input_seq_len")),
                           _seq(v, "scenario.load.standardized.output_seq_len", std.get("output_seq_len")))
        model = _model(v, scenario)
    else:  # 0.1: its load generator is an enum; a report servescope wrote names the real tool in load.metadata
        meta = load.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        tool = v.text("scenario.load.metadata.tool", meta.get("tool")) or \
            v.text("scenario.load.name", load.get("name")) or "unknown"
        tool_version = v.text("scenario.load.metadata.tool_version", meta.get("tool_version")) or None
        ours = v.table("scenario.load.metadata.servescope", meta.get("servescope"))
        agg = v.table("metrics", data.get("metrics"))
        base = "metrics"
        time = v.table("metrics.time", agg.get("time"))
        wall = v.num("metrics.time.duration", time.get("duration"))  # seconds (schema 0.1's Time)
        start = v.num("metrics.time.start", time.get("start"), hi=1e11)  # seconds from the Unix epoch
        date = datetime.fromtimestamp(start, UTC).isoformat() if start else ""
        args = v.table("scenario.load.args", load.get("args"))
        # the rate: inference-perf's qps_values (one number: one stage), vllm-benchmark's request_rate ("inf" for none)
        rate = None
        for key in ("qps_values", "request_rate"):
            raw = args.get(key)
            if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
                rate = v.num(f"scenario.load.args.{key}", raw, hi=1e9)
                break
        conc = v.count("scenario.load.args.max_concurrency", args.get("max_concurrency"), lo=1)
        in_seq = out_seq = None
        native_arrival = None
        model = v.text("scenario.model.name", v.table("scenario.model", scenario.get("model")).get("name"))
    ours_at = _OURS_AT["0.2" if version.startswith("0.2") else "0.1"]
    reqs = v.table(f"{base}.requests", agg.get("requests"))
    total = v.count(f"{base}.requests.total", reqs.get("total")) or 0
    failures = v.count(f"{base}.requests.failures", reqs.get("failures")) or 0
    incomplete = v.count(f"{base}.requests.incomplete", reqs.get("incomplete")) or 0
    if failures + incomplete > total:
        raise v.fail(f"{base}.requests: {failures} failures and {incomplete} incomplete of {total} requests")
    ok = total - failures - incomplete
    lat = v.table(f"{base}.latency", agg.get("latency"))
    thr = v.table(f"{base}.throughput", agg.get("throughput"))
    dists = {ours_key: _stats(v, f"{base}.latency.{theirs}", lat.get(theirs), "ms")
             for theirs, ours_key in _LATENCY.items()}
    itl = lat.get("inter_token_latency")
    if isinstance(itl, Mapping) and itl.get("units") in _PER_TOKEN:  # per token, not per chunk gap
        dists["itl_token_ms"] = dists.pop("itl_ms")
    in_len = _stats(v, f"{base}.requests.input_length", reqs.get("input_length"), "count")
    out_len = _stats(v, f"{base}.requests.output_length", reqs.get("output_length"), "count")

    def rate_of(key: str) -> float | None:
        if version.startswith("0.2"):  # a Statistics: its mean
            return _stats(v, f"{base}.throughput.{key}", thr.get(key), "rate").get("mean")
        key01 = {"request_rate": "requests_per_sec", "output_token_rate": "output_tokens_per_sec",
                 "total_token_rate": "total_tokens_per_sec"}[key]  # 0.1: a number, tokens or requests per second
        return v.num(f"{base}.throughput.{key01}", thr.get(key01), hi=1e15)

    summary = aggregate_summary(ok=ok, failed=failures, wall_s=wall, input_mean=in_len.get("mean"),
                                output_mean=out_len.get("mean"), request_s=rate_of("request_rate"),
                                output_tok_s=rate_of("output_token_rate"), total_tok_s=rate_of("total_token_rate"),
                                dists=dists)
    window = v.text(f"{ours_at}.window", ours.get("window"))  # the window a report servescope wrote was over
    if window in ("steady", "whole"):
        summary = msgspec.structs.replace(summary, window=CellWindow(kind=window, basis="as the report states"))
    if conc is None and rate is None:
        c = v.count(f"{ours_at}.concurrency", ours.get("concurrency"), lo=1)
        if c is None and "scenario" not in data:  # inference-perf writes these beside its own reports
            raise ServescopeError(f"{v.where}: a partial report (no scenario: no load, no model), as inference-perf "
                                  "writes beside its own reports; import that reports folder instead "
                                  "(--from inference-perf reads its per-request file)")
        if c is None:
            raise v.fail("its load states neither a rate (rate_qps) nor a concurrency")
        conc = c
    if rate is not None:
        conc = None
    arrival = v.text(f"{ours_at}.arrival", ours.get("arrival")) or \
        (native_arrival or "poisson" if rate is not None else None)
    cap = v.count(f"{ours_at}.max_concurrency", ours.get("max_concurrency"), lo=1)
    ramp = v.num(f"{ours_at}.ramp_s", ours.get("ramp_s"), hi=1e7)
    name = workload_name or v.text(f"{ours_at}.workload", ours.get("workload")) or \
        f"{clean_text(tool)[:40]}-in{round(in_len.get('mean') or 0)}-out{round(out_len.get('mean') or 0)}"
    api = v.text(f"{ours_at}.api", ours.get("api")) or "completions"
    wl: WorkloadTable = {"name": name, "api": "chat" if api == "chat" else "completions",
                         "input_tokens": in_seq or dist_table([in_len.get("mean") or 0.0]),
                         "output_tokens": out_seq or dist_table([out_len.get("mean") or 0.0]),
                         "prefix_tokens": 0, "dataset": "", "seed": 0, "source": f"imported from {path.name}"}
    reported = {k: x for k, x in (("output_token_rate", summary.output_tok_s), ("request_rate", summary.request_s))
                if x is not None}
    cell = ImportedCell(wl, conc, rate, cap if rate is not None else None, arrival if rate is not None else None,
                        summary, None, str(path), False, reported, clean_text(model)[:200], {}, ramp, 0,
                        f"{tool} report")
    return cell, tool, tool_version, date


# where a report servescope wrote keeps servescope's own names for its workload, load, window and definitions
_OURS_AT = {"0.2": "scenario.load.native.config.servescope", "0.1": "scenario.load.metadata.servescope"}


def _ours(v: Values, data: Mapping[str, object]) -> Mapping[str, object]:
    """The servescope block of a report servescope wrote ({} otherwise)."""
    load = v.table("scenario.load", v.table("scenario", data.get("scenario")).get("load"))
    if str(data.get("version", "")).startswith("0.2"):
        cfg = v.table("scenario.load.native", load.get("native")).get("config")
        return v.table(_OURS_AT["0.2"], cfg.get("servescope")) if isinstance(cfg, Mapping) else {}
    meta = load.get("metadata")
    return v.table(_OURS_AT["0.1"], meta.get("servescope")) if isinstance(meta, Mapping) else {}


def _stated(v: Values, data: Mapping[str, object]) -> tuple[dict[str, str], str]:
    """The definitions and token basis a report servescope wrote states for its figures (({}, "") otherwise)."""
    at = _OURS_AT["0.2" if str(data.get("version", "")).startswith("0.2") else "0.1"]
    ours = _ours(v, data)
    raw = v.table(f"{at}.definitions", ours.get("definitions"))
    defs = {k: v.text(f"{at}.definitions.{k}", x) for k, x in raw.items() if k in SERVESCOPE_DEFINITIONS}
    return defs, v.text(f"{at}.token_basis", ours.get("token_basis"))


def _model(v: Values, scenario: Mapping[str, object]) -> str:
    for i, c in enumerate(v.items("scenario.stack", scenario.get("stack"), limit=1000)):
        std = v.table(f"scenario.stack[{i}].standardized", v.table(f"scenario.stack[{i}]", c).get("standardized"))
        m = std.get("model")
        name = v.table(f"scenario.stack[{i}].standardized.model", m).get("name") if isinstance(m, Mapping) else m
        if name:
            return v.text(f"scenario.stack[{i}].standardized.model.name", name)
    return ""


# ---- export ---------------------------------------------------------------------------------------------------
def _statistics(d: Dist, units: str, scale: float = 1.0) -> JsonObject | None:
    """A servescope distribution as the report's Statistics (None when it has no mean)."""
    if d.mean is None:
        return None
    out: JsonObject = {"units": units, "mean": d.mean * scale}
    for ours, theirs in (("std", "stddev"), ("min", "min"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"),
                         ("p99", "p99"), ("max", "max")):
        x = d.stat(ours)
        if x is not None:
            out[theirs] = max(x * scale, 0.0) if theirs == "stddev" else x * scale
    return out


def _seq_len(table: object, measured: float | None) -> JsonObject:
    """A workload's length distribution as the report's SequenceLength."""
    t = table if isinstance(table, Mapping) else {}
    kind = t.get("dist")
    nums = {k: t.get(k) for k in ("value", "min", "max", "mean", "std")}

    def num(k: str) -> float | None:
        x = nums.get(k)
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    if kind == "fixed" and num("value") is not None:
        return {"distribution": "fixed", "value": num("value")}
    if kind == "uniform" and num("min") is not None and num("max") is not None:
        lo, hi = num("min") or 0.0, num("max") or 0.0
        out: JsonObject = {"distribution": "uniform", "value": (lo + hi) / 2, "min": int(lo)}
        if hi >= 1:
            out["max"] = int(hi)
        return out
    if kind in ("normal", "gaussian") and num("mean") is not None:
        out = {"distribution": "gaussian", "value": num("mean")}
        if num("std") is not None:
            out["std_dev"] = max(num("std") or 0.0, 0.0)
        return out
    return {"distribution": "other", "value": max(measured or 0.0, 0.0)}


def _iso_duration(seconds: float | None) -> str | None:
    return f"PT{seconds!r}S" if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


@dataclass(frozen=True)
class _Cell:
    """What both schema versions say of one cell."""

    cv: CellView
    s: CellResult
    src: SourceMeta
    ours: JsonObject  # the workload, load, window and definitions as servescope names them
    engine: str
    model: str
    tool: str
    tool_version: str
    uid: str
    description: str


def _cell_of(session: Session, index: int) -> _Cell:
    views = {cv.index: cv for cv in cell_views(session)}
    cv = views.get(index)
    if cv is None or not cv.has_summary:
        raise ServescopeError(f"{session.path.name}: cell {index} has no figures to export")
    info = session.info
    src: SourceMeta = measured_by(info)
    s: CellResult = cv.summary
    wl: Mapping[str, object] = next((w for w in info.workloads if str(w.get("name")) == cv.base), {})
    plan = cv.plan
    ours: JsonObject = {
        "workload": cv.workload, "api": str(wl.get("api") or "completions"), "load": cv.load,
        "concurrency": plan.concurrency, "rate": plan.rate, "arrival": plan.arrival,
        "max_concurrency": plan.max_concurrency, "ramp_s": plan.ramp_s, "window": window_label(s),
        "session": session.path.name, "cell": cv.index, "measured_by": src.tool_name,
        "definitions": dict(src.definitions), "token_basis": src.token_basis}
    ours = {k: x for k, x in ours.items() if x is not None}
    return _Cell(
        cv, s, src, ours, clean_text(info.target.engine or ("imported" if src.imported else "unknown")),
        clean_text(info.model), "servescope" if not src.imported else src.tool,
        __version__ if not src.imported else src.tool_version or "unknown",
        uuid.uuid5(uuid.NAMESPACE_URL, f"servescope:{session.path.name}:{cv.index}").hex,
        clean_text(f"servescope session {info.name or session.path.name}, cell {cv.index}: {cv.workload} {cv.load}"))


def report_of(session: Session, index: int, schema: str = DEFAULT_SCHEMA) -> JsonObject:
    """Cell `index` of the session as a benchmark report of schema `schema` ("0.1" or "0.2"), a JSON-ready dict."""
    if schema not in SCHEMA_VERSIONS:
        raise ServescopeError(f"llm-d benchmark report schema {clean_text(schema)!r}: use one of "
                              f"{', '.join(SCHEMA_VERSIONS)}")
    c = _cell_of(session, index)
    return _report_v01(session, c) if schema == "0.1" else _report_v02(session, c)


def _report_v01(session: Session, c: _Cell) -> JsonObject:
    """Schema 0.1 (llm-d-benchmark's schema_v0_1.py): `scenario` (platform, model, load) and `metrics`: `time`
    (duration in seconds), `requests` (counts; input and output lengths, tokens), `latency` (TTFT and request latency
    in ms, TPOT and ITL in ms/token: ITL per token, servescope's itl_token_ms) and `throughput` (tokens and requests
    per second, plain numbers)."""
    s, cv, info = c.s, c.cv, session.info
    missing = [what for what, x in (("measured input lengths", s.input_tokens_mean),
                                    ("measured output lengths", s.output_tokens_mean), ("a TTFT", s.ttft_ms.mean),
                                    ("a total token throughput", s.total_tok_s), ("a wall time", s.wall_s))
               if x is None]
    if missing:  # fields schema 0.1 requires
        raise ServescopeError(f"{session.path.name}: cell {cv.index} lacks {', '.join(missing)}, which llm-d "
                              "benchmark report schema 0.1 requires; export it with --llmd-schema 0.2")
    latency: JsonObject = {theirs: st for theirs, st in (
        ("time_to_first_token", _statistics(s.ttft_ms, "ms")),
        ("time_per_output_token", _statistics(s.tpot_ms, "ms/token")),
        ("inter_token_latency", _statistics(s.itl_token_ms, "ms/token")),
        ("request_latency", _statistics(s.e2e_ms, "ms"))) if st is not None}
    throughput: JsonObject = {"total_tokens_per_sec": s.total_tok_s}
    if s.output_tok_s is not None:
        throughput["output_tokens_per_sec"] = s.output_tok_s
        throughput["input_tokens_per_sec"] = max((s.total_tok_s or 0.0) - s.output_tok_s, 0.0)
    if s.request_s is not None:
        throughput["requests_per_sec"] = s.request_s
    plan = cv.plan
    args: JsonObject = {"num_prompts": s.requests_ok + s.requests_failed}  # as llm-d-benchmark's vllm-benchmark
    if plan.rate is not None:
        args["request_rate"] = plan.rate
    if (cap := plan.concurrency if plan.concurrency is not None else plan.max_concurrency) is not None:
        args["max_concurrency"] = cap
    harness = c.src.harness.split()[0].lower() if c.src.tool == FORMAT and c.src.harness else ""
    generator = _GENERATOR_01.get(_HARNESS.get(harness, c.tool), "vllm-benchmark")
    return {
        "version": "0.1",
        "scenario": {
            "description": c.description,
            "platform": {"engine": [{"name": c.engine, "version": clean_text(info.target.version or "unknown"),
                                     "args": _args(info.server.args if info.server else None)}]},
            "model": {"name": c.model},
            "load": {"name": generator, "type": clean_text(cv.workload)[:200], "args": args,
                     "metadata": {"tool": c.tool, "tool_version": c.tool_version, "servescope": c.ours}},
        },
        "metrics": {
            "time": {"duration": s.wall_s},
            "requests": {"total": s.requests_ok + s.requests_failed, "failures": s.requests_failed,
                         "input_length": {"units": "count", "mean": s.input_tokens_mean},
                         "output_length": {"units": "count", "mean": s.output_tokens_mean}},
            "latency": latency,
            "throughput": throughput,
        },
        "metadata": {"uid": c.uid, "eid": clean_text(session.path.name)},
    }


def _report_v02(session: Session, c: _Cell) -> JsonObject:
    """Schema 0.2: `run`, `scenario` (stack, load) and `results.request_performance.aggregate`."""
    s, cv, info = c.s, c.cv, session.info
    wl: Mapping[str, object] = next((w for w in info.workloads if str(w.get("name")) == cv.base), {})
    stack_cfg = hashlib.sha1(f"{c.engine}|{c.model}|{info.target.version}".encode(),
                             usedforsecurity=False).hexdigest()
    plan = cv.plan
    load_std: JsonObject = {
        "tool": c.tool,
        "tool_version": c.tool_version,
        "source": "sampled" if wl.get("dataset") else "random",
        "stage": cv.index,
        "input_seq_len": _seq_len(wl.get("input_tokens"), s.input_tokens_mean),
        "output_seq_len": _seq_len(wl.get("output_tokens"), s.output_tokens_mean),
    }
    if plan.rate is not None:
        load_std["rate_qps"] = plan.rate
    if plan.concurrency is not None:
        load_std["concurrency"] = plan.concurrency
    elif plan.max_concurrency is not None:
        load_std["concurrency"] = plan.max_concurrency
    ours = c.ours
    # requests the server refused by its rate limit (HTTP 429) are neither sent-and-answered nor failed there: left out
    requests: JsonObject = {"total": s.requests_ok + s.requests_failed, "failures": s.requests_failed}
    if s.input_tokens_mean is not None:
        requests["input_length"] = {"units": "count", "mean": s.input_tokens_mean}
    if s.output_tokens_mean is not None:
        requests["output_length"] = {"units": "count", "mean": s.output_tokens_mean}
    latency = {theirs: st for theirs, st in (
        ("time_to_first_token", _statistics(s.ttft_ms, "ms")),
        ("time_per_output_token", _statistics(s.tpot_ms, "ms/token")),
        ("inter_token_latency", _statistics(s.itl_ms, "ms")),
        ("request_latency", _statistics(s.e2e_ms, "ms"))) if st is not None}
    throughput: dict[str, JsonObject] = {theirs: {"units": units, "mean": x} for theirs, units, x in (
        ("output_token_rate", "tokens/s", s.output_tok_s), ("total_token_rate", "tokens/s", s.total_tok_s),
        ("request_rate", "queries/s", s.request_s)) if x is not None}
    if s.total_tok_s is not None and s.output_tok_s is not None:
        throughput["input_token_rate"] = {"units": "tokens/s", "mean": max(s.total_tok_s - s.output_tok_s, 0.0)}
    aggregate: JsonObject = {"requests": requests}
    if latency:
        aggregate["latency"] = latency
    if throughput:
        aggregate["throughput"] = throughput
    run_time: JsonObject = {}
    if (dur := _iso_duration(s.wall_s)) is not None:
        run_time["duration"] = dur
    return {
        "version": "0.2",
        "run": {"uid": c.uid, "eid": clean_text(session.path.name), **({"time": run_time} if run_time else {}),
                "description": c.description,
                "keywords": ["servescope", clean_text(cv.workload)[:80], clean_text(cv.load)[:80]]},
        "scenario": {
            "stack": [{
                "metadata": {"schema_version": "0.0.1", "label": "server-0", "cfg_id": stack_cfg,
                             "description": clean_text(info.target.url)[:200]},
                "standardized": {"kind": "generic", "tool": c.engine,
                                 "tool_version": clean_text(info.target.version or "unknown"), "model": c.model},
                "native": {"args": _args(info.server.args if info.server else None)}}],
            "load": {
                "metadata": {"schema_version": "0.0.1", "cfg_id": hashlib.sha1(
                    json.dumps(ours, sort_keys=True, default=str).encode(), usedforsecurity=False).hexdigest(),
                             "description": clean_text(f"{cv.workload} {cv.load}")},
                "standardized": load_std,
                "native": {"config": {"servescope": ours}}},
        },
        "results": {"request_performance": {"aggregate": aggregate}},
    }


def _args(args: object) -> JsonObject:
    """The server's recorded arguments as the report's args table (secrets were redacted when they were stored)."""
    if isinstance(args, Mapping):
        return {clean_text(str(k)): v if isinstance(v, (int, float, bool)) else clean_text(str(v))
                for k, v in args.items()}
    if isinstance(args, list):
        return {"argv": " ".join(clean_text(str(a)) for a in args)}
    if isinstance(args, str):
        return {"argv": clean_text(args)}
    return {}


def export_reports(session: Session, out: Path, schema: str = DEFAULT_SCHEMA) -> list[Path]:
    """One report of schema `schema` per cell with figures, as `cell-NNNN.json` in `out` (created); the paths
    written."""
    indices = [cv.index for cv in cell_views(session) if cv.has_summary]
    if not indices:
        raise ServescopeError(f"{session.path.name}: no cell has figures to export")
    reports = [(i, report_of(session, i, schema)) for i in indices]  # all built before anything is written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ServescopeError(f"cannot create {out}: {e.strerror}; choose another -o directory") from None
    written = []
    for i, rep in reports:
        p = out / f"cell-{i:04d}.json"
        atomic_write(p, (json.dumps(rep, indent=2) + "\n").encode())
        written.append(p)
    return written
