"""GuideLLM's benchmarks JSON (`guidellm run --output kind=json`, GuideLLM 0.8: `metadata.version` 2): every
benchmark of the file is a cell.

Each benchmark keeps its requests (successful, errored, incomplete) with their timings: the request's start, its
first token, its first output token, its last token, how many token iterations it streamed, its end. servescope
rebuilds a record from each and computes every figure with its own formulas. GuideLLM keeps no per-chunk time:
the chunks are spread evenly from the first token to the last, so ITL is each request's mean gap (the comparability
check says so). Where GuideLLM kept only a sample of a benchmark's requests (`sample_size`), the benchmark's
aggregates are imported instead, and what they lack is listed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from servescope.core.results import CellResult
from servescope.core.textsafe import clean_text
from servescope.sessions.importcommon import (
    MAX_TOKENS,
    ImportedCell,
    ReadResult,
    Stamps,
    Values,
    aggregate_summary,
    rebuilt_summary,
    records,
    workload,
)
from servescope.sessions.provenance import (
    CLIENT_TOKENIZER,
    ITL_MEAN_GAP,
    SERVER_USAGE,
    SERVESCOPE_DEFINITIONS,
    TOOL_DEFINITIONS,
)

FORMAT = "guidellm"
HINT = "the file is damaged or not the benchmarks JSON GuideLLM 0.8 writes (guidellm run --output kind=json)"

LACKS_REBUILT = {
    "itl_ms": "GuideLLM keeps no per-chunk times: each request's chunks are spread evenly from its first token to "
              "its last, so ITL is that request's mean gap",
    "itl_token_ms": "as itl_ms",
    "reasoning_tokens": "not recorded by GuideLLM",
    "server": "no /metrics deltas (preemptions, KV cache, server-side TTFT)",
}
LACKS_SAMPLED = {
    **LACKS_REBUILT,
    "per_request": "GuideLLM kept a sample of the requests (sample_size): its aggregates are imported, with no "
                   "interval and no SLO judgement",
    "ttfo_ms": "not in GuideLLM's aggregates as servescope defines it",
    "per_user_tok_s": "needs per-request data",
    "prefill_tok_s": "needs per-request data",
    "slo_met_fraction": "needs per-request data: capacity at the SLOs is unknown",
}


def detect(data: object) -> bool:
    if not isinstance(data, Mapping):
        return False
    meta = data.get("metadata")
    bench = data.get("benchmarks")
    if isinstance(meta, Mapping) and "guidellm_version" in meta:
        return True
    return isinstance(bench, list) and bool(bench) and isinstance(bench[0], Mapping) \
        and bench[0].get("type_") == "generative_benchmark"


def read(path: Path, data: Mapping[str, object], workload_name: str | None) -> ReadResult:
    v = Values(str(path), HINT)
    meta = v.table("metadata", data.get("metadata"))
    version = v.text("metadata.guidellm_version", meta.get("guidellm_version")) or None
    spec = v.table("config.spec", v.table("config", data.get("config")).get("spec"))
    backend = v.table("config.spec.backend", spec.get("backend"))
    tok = v.table("config.spec.tokenizer", spec.get("tokenizer"))
    datas = [v.table("config.spec.data[]", d) for d in v.items("config.spec.data", spec.get("data"))]
    benches = v.items("benchmarks", data.get("benchmarks"), limit=10_000)
    if not benches:
        raise v.fail("it holds no benchmark")
    want_in = v.count("config.spec.data[0].prompt_tokens", datas[0].get("prompt_tokens"), hi=MAX_TOKENS) \
        if datas else None
    want_out = v.count("config.spec.data[0].output_tokens", datas[0].get("output_tokens"), hi=MAX_TOKENS) \
        if datas else None
    cells: list[ImportedCell] = []
    usage: bool | None = None
    eos: set[bool] = set()
    warmups: list[str] = []
    ramps: list[str] = []
    sampled = False
    for bi, b in enumerate(benches):
        where = f"benchmarks[{bi}]"
        bt = v.table(where, b)
        cfg = v.table(f"{where}.config", bt.get("config"))
        prefer = v.flag(f"{where}.config.prefer_response_metrics", cfg.get("prefer_response_metrics"))
        usage = usage if prefer is None else prefer
        strat = v.table(f"{where}.config.strategy", cfg.get("strategy"))
        conc, rate, arrival, cap, ramp, label = _load(v, where, strat)
        ramps.append(f"{ramp:g} s" if ramp else "none")
        warmups.append(_phase(v, f"{where}.config.warmup", cfg.get("warmup")))
        reqs = v.table(f"{where}.requests", bt.get("requests"))
        metrics = v.table(f"{where}.metrics", bt.get("metrics"))
        totals = v.table(f"{where}.metrics.request_totals", metrics.get("request_totals"))
        ok_list = v.items(f"{where}.requests.successful", reqs.get("successful"))
        err_list = v.items(f"{where}.requests.errored", reqs.get("errored"))
        inc_list = v.items(f"{where}.requests.incomplete", reqs.get("incomplete"))
        n_ok = v.count(f"{where}.metrics.request_totals.successful", totals.get("successful"))
        n_err = v.count(f"{where}.metrics.request_totals.errored", totals.get("errored"))
        whole = (n_ok is None or n_ok == len(ok_list)) and (n_err is None or n_err == len(err_list))
        u = prefer is not False
        for r in ok_list[:1]:  # what GuideLLM asked of the server: its request body (ignore_eos)
            if (x := _body_flag(r, "ignore_eos")) is not None:
                eos.add(x)
        stamps = [_stamps(v, f"{where}.requests.successful[{i}]", r, "", u) for i, r in enumerate(ok_list)]
        stamps += [_stamps(v, f"{where}.requests.errored[{i}]", r, "error", u) for i, r in enumerate(err_list)]
        stamps += [_stamps(v, f"{where}.requests.incomplete[{i}]", r, "cancelled", u) for i, r in enumerate(inc_list)]
        duration = v.num(f"{where}.duration", bt.get("duration"))
        reported = _reported(v, where, metrics, duration)
        if whole and ok_list:
            recs = records([s for s, _ in stamps], v, f"{where}.requests")
            for rec, (_, status) in zip(recs, stamps, strict=True):
                if status == "cancelled":
                    rec.status = "cancelled"
            df, summary = rebuilt_summary(recs)
            ins = [float(s.prompt_tokens) for s, st in stamps if not st and s.prompt_tokens is not None]
            outs = [float(s.output_tokens) for s, st in stamps if not st]
            detailed = True
        else:
            sampled = sampled or bool(ok_list)
            df = None
            summary = _aggregates(v, where, metrics, duration, n_ok or len(ok_list), n_err or len(err_list))
            ins = [summary.input_tokens_mean or 0.0]
            outs = [summary.output_tokens_mean or 0.0]
            detailed = False
        api = "chat" if "chat" in str(backend.get("request_format") or "") else "completions"
        name = workload_name or _name(want_in, want_out, ins, outs)
        wl = workload(name, api, ins, outs, f"imported from {path.name}")
        cells.append(ImportedCell(wl, conc, rate, cap, arrival, summary, df, str(path), detailed, reported,
                                  clean_text(str(backend.get("model") or ""))[:200], {}, ramp, 0, label))
    all_rebuilt = all(c.detailed for c in cells)
    defs = dict(SERVESCOPE_DEFINITIONS, itl=ITL_MEAN_GAP) if all_rebuilt else dict(TOOL_DEFINITIONS[FORMAT])
    basis = SERVER_USAGE if usage is not False else CLIENT_TOKENIZER
    return ReadResult(
        tool=FORMAT, cells=cells, tool_version=version, format=f"GuideLLM benchmarks JSON (version "
        f"{v.text('metadata.version', meta.get('version')) or '?'})", token_basis=basis, tool_token_basis=basis,
        tokenizer=v.text("config.spec.tokenizer.model", tok.get("model")) or None,
        warmup=_one(warmups), ramp=_one(ramps), streaming=v.flag("config.spec.backend.stream", backend.get("stream")),
        ignore_eos=next(iter(eos)) if len(eos) == 1 else None, definitions=defs, lacks=dict(LACKS_SAMPLED if sampled else LACKS_REBUILT),
        notes=["GuideLLM kept a sample of some benchmarks' requests: those cells hold its aggregates"] if sampled
        else [])


def _body_flag(raw: object, key: str) -> bool | None:
    """A flag of the request body GuideLLM recorded (its `request_args`, a JSON text); None when it is not there."""
    args = raw.get("request_args") if isinstance(raw, Mapping) else None
    if not isinstance(args, str) or len(args) > 1_000_000:
        return None
    try:
        doc = json.loads(args)
    except (ValueError, RecursionError):
        return None
    body = doc.get("body") if isinstance(doc, Mapping) else None
    flag = body.get(key) if isinstance(body, Mapping) else None
    return flag if isinstance(flag, bool) else None


def _one(texts: Sequence[str]) -> str:
    got = list(dict.fromkeys(texts))
    return got[0] if len(got) == 1 else ", ".join(got)


def _name(want_in: int | None, want_out: int | None, ins: Sequence[float], outs: Sequence[float]) -> str:
    i = want_in if want_in is not None else round(sum(ins) / len(ins)) if ins else 0
    o = want_out if want_out is not None else round(sum(outs) / len(outs)) if outs else 0
    return f"guidellm-in{i}-out{o}"


def _load(v: Values, where: str, strat: Mapping[str, object]
          ) -> tuple[int | None, float | None, str | None, int | None, float | None, str]:
    """(concurrency, rate, arrival, max concurrency, ramp s, GuideLLM's label) of a benchmark's strategy."""
    kind = v.text(f"{where}.config.strategy.type_", strat.get("type_"))
    ramp = v.num(f"{where}.config.strategy.rampup_duration", strat.get("rampup_duration")) or None
    streams = v.count(f"{where}.config.strategy.streams", strat.get("streams"), lo=1)
    cap = v.count(f"{where}.config.strategy.max_concurrency", strat.get("max_concurrency"), lo=1)
    rate = v.num(f"{where}.config.strategy.rate", strat.get("rate"), hi=1e9)
    if kind == "synchronous":
        return 1, None, None, None, ramp, "synchronous"
    if kind == "concurrent":
        if streams is None:
            raise v.bad(f"{where}.config.strategy.streams", None, "the concurrent strategy's streams")
        return streams, None, None, None, ramp, f"concurrent@{streams}"
    if kind == "throughput":
        if cap is None:
            raise v.bad(f"{where}.config.strategy.max_concurrency", None, "the throughput strategy's limit")
        return cap, None, None, None, ramp, f"throughput (max {cap})"
    if kind in ("constant", "poisson", "async"):
        if rate is None or rate <= 0:
            raise v.bad(f"{where}.config.strategy.rate", rate, "a request rate above 0")
        arrival = "poisson" if kind == "poisson" else "constant"
        return None, rate, arrival, cap, ramp, f"{kind}@{rate:g}"
    raise v.bad(f"{where}.config.strategy.type_", kind, "synchronous, concurrent, throughput, constant or poisson")


def _phase(v: Values, where: str, raw: object) -> str:
    """GuideLLM's warmup setting as text: "none", "N s", "P% of the requests"."""
    t = v.table(where, raw)
    pct = v.num(f"{where}.percent", t.get("percent"), hi=100)
    val = v.num(f"{where}.value", t.get("value"), hi=1e9)
    if pct:
        return f"{pct:g}% of the requests"
    if val:
        return f"{val:g} s" if "duration" in str(t.get("mode") or "duration") else f"{val:g} requests"
    return "none"


def _stamps(v: Values, where: str, raw: object, status: str, usage: bool) -> tuple[Stamps, str]:
    r = v.table(where, raw)
    info = v.table(f"{where}.info", r.get("info"))
    t = v.table(f"{where}.info.timings", info.get("timings"))
    start = v.num(f"{where}.info.timings.request_start", t.get("request_start"))
    if start is None:
        start = v.need(f"{where}.request_start_time", r.get("request_start_time"))
    end = v.num(f"{where}.info.timings.request_end", t.get("request_end"))
    err = v.text(f"{where}.info.error", info.get("error"), limit=500)
    s = Stamps(
        start=start, end=end,
        first_token=v.num(f"{where}.info.timings.first_token_iteration", t.get("first_token_iteration")),
        first_content=v.num(f"{where}.info.timings.first_output_token_iteration",
                            t.get("first_output_token_iteration")),
        scheduled=v.num(f"{where}.info.timings.targeted_start", t.get("targeted_start")),
        last_token=v.num(f"{where}.info.timings.last_token_iteration", t.get("last_token_iteration")),
        n_chunks=v.count(f"{where}.info.timings.token_iterations", t.get("token_iterations"), hi=MAX_TOKENS),
        output_tokens=v.count(f"{where}.output_tokens", r.get("output_tokens"), hi=MAX_TOKENS) or 0,
        prompt_tokens=v.count(f"{where}.prompt_tokens", r.get("prompt_tokens"), hi=MAX_TOKENS),
        usage=usage,
        cached_tokens=v.count(f"{where}.cached_tokens", r.get("cached_tokens"), hi=MAX_TOKENS),
        error=err or ("failed" if status == "error" else ""))
    if status == "cancelled" and s.first_token is None:
        s.error = "incomplete: the benchmark ended first"
    s.input_requested = s.prompt_tokens
    s.output_requested = s.output_tokens
    return s, status


_DISTS = {"ttft_ms": "time_to_first_token_ms", "ttfo_ms": "time_to_first_output_token_ms",
          "tpot_ms": "inter_token_latency_ms", "e2e_ms": "request_latency"}


def _stats(v: Values, where: str, raw: object, scale: float) -> dict[str, float | None]:
    """A GuideLLM distribution's successful requests as servescope's statistics (its percentiles as it took them)."""
    d = v.table(where, v.table(where, raw).get("successful"))
    pct = v.table(f"{where}.successful.percentiles", d.get("percentiles"))
    out: dict[str, float | None] = {}
    for ours, theirs in (("mean", "mean"), ("std", "std_dev"), ("min", "min"), ("max", "max")):
        x = v.num(f"{where}.successful.{theirs}", d.get(theirs), lo=0.0, hi=1e15)
        out[ours] = x * scale if x is not None else None
    for p in ("p50", "p90", "p95", "p99"):
        x = v.num(f"{where}.successful.percentiles.{p}", pct.get(p), lo=0.0, hi=1e15)
        out[p] = x * scale if x is not None else None
    return out


def _aggregates(v: Values, where: str, metrics: Mapping[str, object], duration: float | None, ok: int,
                failed: int) -> CellResult:
    dists = {ours: _stats(v, f"{where}.metrics.{theirs}", metrics.get(theirs), 1000.0 if ours == "e2e_ms" else 1.0)
             for ours, theirs in _DISTS.items()}
    rate = _stats(v, f"{where}.metrics.requests_per_second", metrics.get("requests_per_second"), 1.0)
    out = _stats(v, f"{where}.metrics.output_tokens_per_second", metrics.get("output_tokens_per_second"), 1.0)
    tot = _stats(v, f"{where}.metrics.tokens_per_second", metrics.get("tokens_per_second"), 1.0)
    pin = _stats(v, f"{where}.metrics.prompt_token_count", metrics.get("prompt_token_count"), 1.0)
    pout = _stats(v, f"{where}.metrics.output_token_count", metrics.get("output_token_count"), 1.0)
    return aggregate_summary(ok=ok, failed=failed, wall_s=duration, input_mean=pin["mean"], output_mean=pout["mean"],
                             request_s=rate["mean"], output_tok_s=out["mean"], total_tok_s=tot["mean"], dists=dists)


def _reported(v: Values, where: str, metrics: Mapping[str, object], duration: float | None) -> dict[str, float]:
    """GuideLLM's own headline figures for the benchmark (kept beside the rebuilt ones)."""
    out: dict[str, float] = {}
    for key, theirs, stat in (("requests_per_second", "requests_per_second", "mean"),
                              ("output_tokens_per_second", "output_tokens_per_second", "mean"),
                              ("time_to_first_token_ms_p50", "time_to_first_token_ms", "p50"),
                              ("inter_token_latency_ms_p50", "inter_token_latency_ms", "p50"),
                              ("time_per_output_token_ms_p50", "time_per_output_token_ms", "p50"),
                              ("request_latency_s_p50", "request_latency", "p50")):
        x = _stats(v, f"{where}.metrics.{theirs}", metrics.get(theirs), 1.0).get(stat)
        if x is not None:
            out[key] = x
    if duration is not None:
        out["duration_s"] = duration
    return out
