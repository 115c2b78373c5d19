"""AIPerf's profile export (`aiperf profile`, AIPerf 0.13): each run folder is a cell.

- `profile_export.jsonl`, one record per request (`--export-level records`, the default): its start (ns), time to
  first token, every gap between its response chunks, its latency, its token counts (AIPerf's tokenizer, and the
  server's usage where it sent one). servescope rebuilds each record and computes every figure with its own
  formulas; token counts are the server's usage where the record has it.
- `profile_export_aiperf.json`, the run's aggregates and settings: the cell's load (its profiling phase: concurrency,
  request rate and arrival pattern, ramp) and warmup come from it; alone (no records), its aggregates are imported
  and what they lack is listed. A sweep (`--concurrency 1,4`) writes one folder per load: give the folders, or the
  folder above them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from servescope.core.errors import ServescopeError
from servescope.core.results import CellResult
from servescope.core.textsafe import clean_text
from servescope.sessions.importcommon import (
    MAX_TOKENS,
    ImportedCell,
    ReadResult,
    Stamps,
    Values,
    aggregate_summary,
    read_json,
    rebuilt_summary,
    records,
    workload,
)
from servescope.sessions.provenance import (
    CLIENT_TOKENIZER,
    SERVER_USAGE,
    SERVESCOPE_DEFINITIONS,
    TOOL_DEFINITIONS,
)

FORMAT = "aiperf"
HINT = "the file is damaged or not what AIPerf 0.13 writes (profile_export.jsonl, profile_export_aiperf.json)"
AGGREGATE_NAME = "profile_export_aiperf.json"
MAX_LINES = 2_000_000

LACKS_RECORDS = {
    "reasoning_tokens": "not split out in AIPerf's records",
    "server": "no /metrics deltas (preemptions, KV cache, server-side TTFT)",
}
LACKS_AGGREGATE = {
    **LACKS_RECORDS,
    "per_request": "only AIPerf's aggregates (profile_export_aiperf.json without profile_export.jsonl): no "
                   "interval and no SLO judgement",
    "prefill_tok_s": "needs per-request data",
    "slo_met_fraction": "needs per-request data: capacity at the SLOs is unknown",
}


def detect_record(line: object) -> bool:
    """A line of profile_export.jsonl."""
    return isinstance(line, Mapping) and isinstance(line.get("metadata"), Mapping) \
        and "request_start_ns" in line["metadata"] and isinstance(line.get("metrics"), Mapping)


def detect_aggregate(data: object) -> bool:
    return isinstance(data, Mapping) and "input_config" in data and "benchmark_duration" in data


def read(paths: Sequence[Path], workload_name: str | None) -> ReadResult:
    """Read AIPerf's files (records and aggregates; those of one folder are one cell)."""
    folders: dict[Path, dict[str, Path]] = {}
    for p in paths:
        kind = "records" if p.suffix == ".jsonl" else "aggregate"
        folders.setdefault(p.parent, {})[kind] = p
    for folder, kinds in folders.items():  # the settings of a records file are in the aggregate beside it
        if "aggregate" not in kinds and (folder / AGGREGATE_NAME).is_file():
            kinds["aggregate"] = folder / AGGREGATE_NAME
    cells: list[ImportedCell] = []
    versions: set[str] = set()
    warmups: list[str] = []
    bases: list[str] = []
    tool_bases: list[str] = []
    tokenizers: set[str] = set()
    streaming: set[bool] = set()
    eos: set[bool] = set()
    aggregate_only = False
    for _folder, kinds in folders.items():
        agg: Mapping[str, object] = {}
        agg_v = Values(str(kinds.get("aggregate", "")), HINT)
        if "aggregate" in kinds:
            raw = read_json(kinds["aggregate"])
            if not detect_aggregate(raw) or not isinstance(raw, Mapping):
                raise ServescopeError(f"{kinds['aggregate']}: not AIPerf's {AGGREGATE_NAME}; {HINT}")
            agg = {str(k): x for k, x in raw.items()}
        settings = _settings(agg_v, agg)
        if settings.version:
            versions.add(settings.version)
        warmups.append(settings.warmup)
        if settings.tokenizer:
            tokenizers.add(settings.tokenizer)
        if settings.streaming is not None:
            streaming.add(settings.streaming)
        if settings.ignore_eos is not None:
            eos.add(settings.ignore_eos)
        tool_bases.append(SERVER_USAGE if settings.server_counts else CLIENT_TOKENIZER)
        if "records" in kinds:
            cell, basis = _records_cell(kinds["records"], settings, workload_name)
        else:
            aggregate_only = True
            cell, basis = _aggregate_cell(agg_v, agg, settings, workload_name, kinds["aggregate"])
        bases.append(basis)
        cells.append(cell)
    if len(versions) > 1:
        raise ServescopeError(f"the files are from different AIPerf versions ({', '.join(sorted(versions))}); "
                              "import them as separate sessions")
    rebuilt = all(c.detailed for c in cells)
    return ReadResult(
        tool=FORMAT, cells=cells, tool_version=next(iter(versions), None),
        format="AIPerf profile export (" + ("profile_export.jsonl records" if rebuilt else
                                            "profile_export_aiperf.json aggregates") + ")",
        token_basis=_one(bases), tool_token_basis=_one(tool_bases), tokenizer=", ".join(sorted(tokenizers)) or None,
        warmup=_one(warmups), ramp=_one([f"{c.ramp_s:g} s" if c.ramp_s else "none" for c in cells]),
        streaming=next(iter(streaming)) if len(streaming) == 1 else None,
        ignore_eos=next(iter(eos)) if len(eos) == 1 else None,
        definitions=dict(SERVESCOPE_DEFINITIONS) if rebuilt else dict(TOOL_DEFINITIONS[FORMAT]),
        lacks=dict(LACKS_AGGREGATE if aggregate_only else LACKS_RECORDS))


def _one(texts: Sequence[str]) -> str:
    got = list(dict.fromkeys(texts))
    return got[0] if len(got) == 1 else ", ".join(got) if got else "unknown"


class _Settings:
    """What the aggregate JSON's input_config says about the run (None/"unknown" where it does not)."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.model = ""
        self.api = "completions"
        self.concurrency: int | None = None
        self.rate: float | None = None
        self.arrival: str | None = None
        self.cap: int | None = None
        self.ramp: float | None = None
        self.warmup = "unknown"
        self.tokenizer: str | None = None
        self.streaming: bool | None = None
        self.ignore_eos: bool | None = None
        self.server_counts = False
        self.isl: float | None = None
        self.osl: float | None = None


def _ramp(v: Values, key: str, raw: object) -> float | None:
    if isinstance(raw, Mapping):
        return v.num(f"{key}.duration", raw.get("duration"), hi=1e7) or None
    return v.num(key, raw, hi=1e7) or None


def _settings(v: Values, agg: Mapping[str, object]) -> _Settings:
    s = _Settings()
    if not agg:
        return s
    s.version = v.text("aiperf_version", agg.get("aiperf_version")) or None
    cfg = v.table("input_config", agg.get("input_config"))
    models = v.table("input_config.models", cfg.get("models"))
    items = v.items("input_config.models.items", models.get("items"), limit=100)
    if items:
        s.model = v.text("input_config.models.items[0].name", v.table("input_config.models.items[0]",
                                                                        items[0]).get("name"))
    ep = v.table("input_config.endpoint", cfg.get("endpoint"))
    s.api = "chat" if "chat" in v.text("input_config.endpoint.type", ep.get("type")) else "completions"
    s.streaming = v.flag("input_config.endpoint.streaming", ep.get("streaming"))
    s.server_counts = v.flag("input_config.endpoint.use_server_token_count", ep.get("use_server_token_count")) is True
    extra = v.table("input_config.endpoint.extra", ep.get("extra"))
    eos = extra.get("ignore_eos")
    s.ignore_eos = eos if isinstance(eos, bool) else (str(eos).lower() == "true" if eos is not None else False)
    s.tokenizer = v.text("input_config.tokenizer.name", v.table("input_config.tokenizer",
                                                                cfg.get("tokenizer")).get("name")) or None
    datasets = v.items("input_config.datasets", cfg.get("datasets"), limit=100)
    if datasets:
        prompts = v.table("input_config.datasets[0].prompts", v.table("input_config.datasets[0]",
                                                                      datasets[0]).get("prompts"))
        s.isl = v.num("input_config.datasets[0].prompts.isl.mean",
                      v.table("isl", prompts.get("isl")).get("mean"), hi=MAX_TOKENS)
        s.osl = v.num("input_config.datasets[0].prompts.osl.mean",
                      v.table("osl", prompts.get("osl")).get("mean"), hi=MAX_TOKENS)
    s.warmup = "none"
    for i, raw in enumerate(v.items("input_config.phases", cfg.get("phases"), limit=100)):
        key = f"input_config.phases[{i}]"
        ph = v.table(key, raw)
        kind = v.text(f"{key}.kind", ph.get("kind"))
        if kind == "warmup":
            n = v.count(f"{key}.requests", ph.get("requests"))
            d = v.num(f"{key}.duration", ph.get("duration"), hi=1e7)
            s.warmup = f"{n} requests" if n else f"{d:g} s" if d else "none"
            continue
        if kind != "profiling":
            continue
        typ = v.text(f"{key}.type", ph.get("type"))
        conc = v.count(f"{key}.concurrency", ph.get("concurrency"), lo=1)
        if typ == "concurrency":
            s.concurrency = conc
            s.ramp = _ramp(v, f"{key}.concurrency_ramp", ph.get("concurrency_ramp"))
        elif typ in ("poisson", "gamma", "constant"):
            s.rate = v.num(f"{key}.rate", ph.get("rate"), hi=1e9)
            if s.rate is None or s.rate <= 0:
                raise v.bad(f"{key}.rate", ph.get("rate"), "a request rate above 0")
            smooth = v.num(f"{key}.smoothness", ph.get("smoothness"), hi=1e6)
            s.arrival = typ if typ != "gamma" else f"gamma(burstiness {smooth:g})" if smooth else "gamma"
            s.cap = conc
            s.ramp = _ramp(v, f"{key}.rate_ramp", ph.get("rate_ramp"))
        else:
            raise v.bad(f"{key}.type", typ, "concurrency, poisson, gamma or constant (servescope imports those loads)")
    return s


def _lines(path: Path) -> list[Mapping[str, object]]:
    v = Values(str(path), HINT)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise v.fail("it is not UTF-8 text") from None
    except OSError as e:
        raise ServescopeError(f"{path}: cannot read it ({clean_text(e.strerror or str(e))}); check the path") from None
    out: list[Mapping[str, object]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(out) >= MAX_LINES:
            raise v.fail(f"more than {MAX_LINES:,} records")
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise v.fail(f"line {n} is not JSON") from None
        if not detect_record(rec):
            raise v.fail(f"line {n} is not an AIPerf record (metadata.request_start_ns and metrics)")
        out.append(rec)
    if not out:
        raise v.fail("it holds no record")
    return out


def _metric(v: Values, where: str, metrics: Mapping[str, object], key: str, hi: float = 1e12) -> float | None:
    m = metrics.get(key)
    if m is None:
        return None
    return v.num(f"{where}.metrics.{key}.value", v.table(f"{where}.metrics.{key}", m).get("value"), hi=hi)


def _records_cell(path: Path, s: _Settings, workload_name: str | None) -> tuple[ImportedCell, str]:
    v = Values(str(path), HINT)
    stamps: list[Stamps] = []
    warm = 0
    usage_all = True
    lines = _lines(path)
    # times from the first record's start, in seconds: an epoch in ns as a float would keep 0.2 us only
    base: int | float | None = None
    for n, rec in enumerate(lines, start=1):
        where = f"line {n}"
        meta = v.table(f"{where}.metadata", rec.get("metadata"))
        metrics = v.table(f"{where}.metrics", rec.get("metrics"))
        if v.text(f"{where}.metadata.benchmark_phase", meta.get("benchmark_phase")) == "warmup":
            warm += 1
            continue
        raw = meta.get("request_start_ns")
        v.need(f"{where}.metadata.request_start_ns", raw, hi=1e20)
        base = base if base is not None else raw if isinstance(raw, (int, float)) else 0
        start = _since(raw, base) / 1e9
        credit = _since(meta.get("credit_issued_ns"), base) if v.num(
            f"{where}.metadata.credit_issued_ns", meta.get("credit_issued_ns"), hi=1e20) is not None else None
        end_ns = _since(meta.get("request_end_ns"), base) if v.num(
            f"{where}.metadata.request_end_ns", meta.get("request_end_ns"), hi=1e20) is not None else None
        lat = _metric(v, where, metrics, "request_latency")
        ttft = _metric(v, where, metrics, "time_to_first_token")
        ttfo = _metric(v, where, metrics, "time_to_first_output_token")
        gaps_raw = metrics.get("inter_chunk_latency")
        gaps = v.items(f"{where}.metrics.inter_chunk_latency.value",
                       v.table(f"{where}.metrics.inter_chunk_latency", gaps_raw).get("value"), limit=MAX_TOKENS) \
            if gaps_raw is not None else []
        err = rec.get("error")
        err_text = ""
        if err is not None:
            et = v.table(f"{where}.error", err) if isinstance(err, Mapping) else {"message": err}
            err_text = " ".join(x for x in (v.text(f"{where}.error.type", et.get("type")),
                                            v.text(f"{where}.error.message", et.get("message"), limit=500)) if x) \
                or "failed"
        if meta.get("was_cancelled") is True and not err_text:
            err_text = "cancelled by AIPerf"
        first = start + ttft / 1000 if ttft is not None else None
        chunks: list[float] | None = None
        if first is not None:
            chunks = [first]
            t = first
            for j, g in enumerate(gaps):
                t += v.need(f"{where}.metrics.inter_chunk_latency.value[{j}]", g, hi=1e9) / 1000
                chunks.append(t)
        end = start + lat / 1000 if lat is not None else (end_ns / 1e9 if end_ns is not None else None)
        out_usage = _metric(v, where, metrics, "usage_completion_tokens", hi=MAX_TOKENS)
        out_client = _metric(v, where, metrics, "output_token_count", hi=MAX_TOKENS)
        in_usage = _metric(v, where, metrics, "usage_prompt_tokens", hi=MAX_TOKENS)
        in_client = _metric(v, where, metrics, "input_sequence_length", hi=MAX_TOKENS)
        cached = _metric(v, where, metrics, "usage_prompt_cache_read_tokens", hi=MAX_TOKENS)
        if out_usage is None and not err_text:
            usage_all = False
        out_tok = out_usage if out_usage is not None else out_client
        in_tok = in_usage if in_usage is not None else in_client
        stamps.append(Stamps(
            start=start, end=end, first_token=first, first_content=start + ttfo / 1000 if ttfo is not None else None,
            scheduled=credit / 1e9 if credit is not None else None, chunks=chunks,
            output_tokens=int(out_tok or 0), prompt_tokens=int(in_tok) if in_tok is not None else None,
            input_requested=int(in_client) if in_client is not None else None,
            output_requested=int(s.osl) if s.osl is not None else None, usage=out_usage is not None,
            cached_tokens=int(cached) if cached is not None and in_usage is not None else None, error=err_text))
    if not stamps:
        raise v.fail("it holds only warmup records")
    recs = records(stamps, v, "records")
    df, summary = rebuilt_summary(recs)
    conc, rate, arrival, cap = s.concurrency, s.rate, s.arrival, s.cap
    notes = ""
    if conc is None and rate is None:  # no settings beside the records: the load is what the records show
        conc = max_in_flight(stamps)
        notes = "load read from the records (no profile_export_aiperf.json beside them)"
    ok = [x for x in stamps if not x.error]
    ins = [float(x.prompt_tokens) for x in ok if x.prompt_tokens is not None]
    outs = [float(x.output_tokens) for x in ok]
    name = workload_name or _name(s, ins, outs)
    wl = workload(name, s.api, ins, outs, f"imported from {path.parent.name}/{path.name}")
    extra = {"aiperf_note": notes} if notes else {}
    cell = ImportedCell(wl, conc, rate, cap, arrival, summary, df, str(path), True, {}, clean_text(s.model)[:200],
                        extra, s.ramp, warm, _label(conc, rate))
    return cell, SERVER_USAGE if usage_all else CLIENT_TOKENIZER


def _since(raw: object, base: int | float) -> float:
    """A checked ns stamp minus the first record's, exact where both are whole numbers (as AIPerf writes them)."""
    if isinstance(raw, int) and isinstance(base, int):
        return float(raw - base)
    return float(raw) - float(base) if isinstance(raw, (int, float)) else 0.0


def max_in_flight(stamps: Sequence[Stamps]) -> int:
    """The most requests in flight at once (the closed loop's concurrency, when nothing else says it)."""
    events = sorted([(x.start, 1) for x in stamps] + [(x.end if x.end is not None else x.start, -1) for x in stamps],
                    key=lambda e: (e[0], e[1]))
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return max(most, 1)


def _label(conc: int | None, rate: float | None) -> str:
    return f"concurrency {conc}" if rate is None else f"rate {rate:g}/s"


def _name(s: _Settings, ins: Sequence[float], outs: Sequence[float]) -> str:
    i = round(s.isl) if s.isl is not None else round(sum(ins) / len(ins)) if ins else 0
    o = round(s.osl) if s.osl is not None else round(sum(outs) / len(outs)) if outs else 0
    return f"aiperf-in{i}-out{o}"


_DISTS = {"ttft_ms": "time_to_first_token", "ttfo_ms": "time_to_first_output_token", "tpot_ms": "inter_token_latency",
          "itl_ms": "inter_chunk_latency", "e2e_ms": "request_latency", "per_user_tok_s": "output_token_throughput_per_user"}


def _stat(v: Values, agg: Mapping[str, object], key: str) -> dict[str, float | None]:
    t = v.table(key, agg.get(key))
    out: dict[str, float | None] = {}
    for ours, theirs in (("mean", "avg"), ("std", "std"), ("min", "min"), ("max", "max"), ("p50", "p50"),
                         ("p90", "p90"), ("p95", "p95"), ("p99", "p99")):
        out[ours] = v.num(f"{key}.{theirs}", t.get(theirs), lo=0.0, hi=1e15)
    return out


def _aggregate_cell(v: Values, agg: Mapping[str, object], s: _Settings, workload_name: str | None,
                    path: Path) -> tuple[ImportedCell, str]:
    if s.concurrency is None and s.rate is None:
        raise v.fail("its input_config has no profiling phase: the load is unknown")
    count = _stat(v, agg, "request_count")["mean"]
    done = _stat(v, agg, "completed_request_count")["mean"]
    errors = _stat(v, agg, "error_request_count")["mean"]
    ok = int(done if done is not None else (count or 0) - (errors or 0))
    failed = int(errors or 0)
    basis = SERVER_USAGE if s.server_counts else CLIENT_TOKENIZER
    osl = _stat(v, agg, "output_sequence_length")["mean"]
    isl = _stat(v, agg, "input_sequence_length")["mean"]
    summary: CellResult = aggregate_summary(
        ok=ok, failed=failed, wall_s=_stat(v, agg, "benchmark_duration")["mean"], input_mean=isl, output_mean=osl,
        request_s=_stat(v, agg, "request_throughput")["mean"], output_tok_s=_stat(v, agg, "output_token_throughput")["mean"],
        total_tok_s=_stat(v, agg, "total_token_throughput")["mean"],
        dists={ours: _stat(v, agg, theirs) for ours, theirs in _DISTS.items()})
    name = workload_name or _name(s, [isl or 0.0], [osl or 0.0])
    wl = workload(name, s.api, [isl or 0.0], [osl or 0.0], f"imported from {path.parent.name}/{path.name}")
    reported = {k: x for k, x in (("output_token_throughput", summary.output_tok_s),
                                  ("request_throughput", summary.request_s)) if x is not None}
    cell = ImportedCell(wl, s.concurrency, s.rate, s.cap, s.arrival, summary, None, str(path), False, reported,
                        clean_text(s.model)[:200], {}, s.ramp, 0, _label(s.concurrency, s.rate))
    return cell, basis
