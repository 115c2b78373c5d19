"""inference-perf's reports (kubernetes-sigs/inference-perf: `reports-*/` folders): each load stage is a cell.

- `stage_N_lifecycle_metrics.json`: a stage's aggregates and its load (`load_summary`: the requested rate, or the
  concurrency of a `concurrent` load);
- `per_request_lifecycle_metrics.json`: every request (its start and end, each content chunk's arrival time, its
  token counts, the server's usage where it sent one): with it servescope rebuilds the records and computes every
  figure with its own formulas. The file does not say which stage a request belongs to: the stages ran one after
  another, so the requests, ordered by their start, are the stages' counts in stage order (when the counts do not add
  up, the stages' aggregates are imported instead);
- `summary_lifecycle_metrics.json`: the whole run, a cell of its own only when no stage file is given;
- `config.yaml` beside them: the load's type (constant, poisson, concurrent), streaming, ignore_eos, the tokenizer
  and whether the output counts are the server's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from servescope.core.errors import ServescopeError
from servescope.core.results import CellResult
from servescope.sessions.importcommon import (
    MAX_TOKENS,
    ImportedCell,
    ReadResult,
    Stamps,
    Values,
    aggregate_summary,
    read_json,
    read_yaml,
    rebuilt_summary,
    records,
    workload,
)
from servescope.sessions.provenance import (
    CLIENT_TOKENIZER,
    SERVER_USAGE,
    SERVESCOPE_DEFINITIONS,
    TOOL_DEFINITIONS,
    TTFT_CONTENT,
)

FORMAT = "inference-perf"
HINT = "the file is damaged or not what inference-perf writes (its reports-*/ folder's JSON files)"
_STAGE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json$")

LACKS_REBUILT = {
    "ttfo_ms": "inference-perf stamps content chunks only: TTFO is taken equal to TTFT",
    "reasoning_tokens": "not recorded by inference-perf",
    "client_queue_ms": "the per-request file keeps no scheduled time",
    "server": "no /metrics deltas (preemptions, KV cache, server-side TTFT)",
}
LACKS_AGGREGATE = {
    **LACKS_REBUILT,
    "per_request": "only the stages' aggregates (no per_request_lifecycle_metrics.json, or its requests do not add "
                   "up to the stages'): no interval and no SLO judgement",
    "per_user_tok_s": "needs per-request data",
    "prefill_tok_s": "needs per-request data",
    "slo_met_fraction": "needs per-request data: capacity at the SLOs is unknown",
}


def detect_lifecycle(data: object) -> bool:
    """A stage's or the run's lifecycle metrics."""
    return isinstance(data, Mapping) and isinstance(data.get("successes"), Mapping) and "failures" in data


def detect_per_request(data: object) -> bool:
    return isinstance(data, list) and bool(data) and isinstance(data[0], Mapping) \
        and {"start_time", "end_time", "info"} <= set(data[0])


def read(paths: Sequence[Path], workload_name: str | None) -> ReadResult:
    stages: dict[int, tuple[Path, Mapping[str, object]]] = {}
    summary: tuple[Path, Mapping[str, object]] | None = None
    per_request: tuple[Path, list[object]] | None = None
    for p in paths:
        data = read_json(p)
        if detect_per_request(data) and isinstance(data, list):
            if per_request is not None:
                raise ServescopeError(f"{per_request[0]} and {p} are both per-request files: import each run "
                                      "as its own session")
            per_request = (p, data)
        elif detect_lifecycle(data) and isinstance(data, Mapping):
            m = _STAGE.search(p.name)
            if m:
                stages[int(m.group(1))] = (p, {str(k): x for k, x in data.items()})
            else:
                summary = (p, {str(k): x for k, x in data.items()})
        else:
            raise ServescopeError(f"{p}: not an inference-perf lifecycle report; {HINT}")
    folder = (per_request or summary or next(iter(stages.values())))[0].parent
    cfg = _config(folder)
    units: list[tuple[str, Path, Mapping[str, object]]] = []
    if stages:
        units = [(f"stage {k}", p, d) for k, (p, d) in sorted(stages.items())]
    elif summary is not None:
        units = [("summary", summary[0], summary[1])]
    if not units and per_request is None:
        raise ServescopeError("no inference-perf report among the files")
    counts = [_count(Values(str(p), HINT), d) for _, p, d in units]
    groups: list[list[Stamps]] | None = None
    if per_request is not None:
        v = Values(str(per_request[0]), HINT)
        every = sorted((_stamps(v, f"[{i}]", r, cfg) for i, r in enumerate(per_request[1])), key=lambda s: s.start)
        if not units:
            groups = [every]
        elif sum(counts) == len(every):
            groups, at = [], 0
            for n in counts:
                groups.append(every[at:at + n])
                at += n
    cells: list[ImportedCell] = []
    basis = SERVER_USAGE if cfg.server_counts else CLIENT_TOKENIZER
    all_usage = True
    for k in range(max(len(units), 1)):
        label, path, data = units[k] if units else ("run", per_request[0] if per_request else Path("?"), {})
        v = Values(str(path), HINT)
        conc, rate, arrival = _load(v, data, cfg, label)
        if not units and len(cfg.stages) == 1:  # the per-request file alone: config.yaml's one stage is its load
            rate, conc = cfg.stages[0]
            conc = conc if cfg.load_type == "concurrent" else None
            rate = None if conc is not None else rate
            arrival = None if rate is None else "poisson" if cfg.load_type == "poisson" else "constant"
        if groups is not None:
            stamps = groups[k]
            recs = records(stamps, v, "requests")
            df, summ = rebuilt_summary(recs)
            ok = [s for s in stamps if not s.error]
            all_usage = all_usage and all(s.usage for s in ok)
            ins = [float(s.prompt_tokens) for s in ok if s.prompt_tokens is not None]
            outs = [float(s.output_tokens) for s in ok]
            if conc is None and rate is None:
                raise ServescopeError(f"{path}: the load of its requests is unknown; import it with the stage files "
                                      "(stage_N_lifecycle_metrics.json) or the config.yaml beside it")
            detailed = True
        else:
            df = None
            summ = _aggregates(v, data)
            ins, outs = [summ.input_tokens_mean or 0.0], [summ.output_tokens_mean or 0.0]
            detailed = False
        name = workload_name or f"inference-perf-in{round(sum(ins) / len(ins)) if ins else 0}-out" \
            f"{round(sum(outs) / len(outs)) if outs else 0}"
        wl = workload(name, cfg.api, ins, outs, f"imported from {path.parent.name}/{path.name}")
        reported = _reported(v, data)
        cells.append(ImportedCell(wl, conc, rate, None, arrival, summ, df, str(path), detailed, reported,
                                  cfg.model, {}, None, 0, label))
    rebuilt = all(c.detailed for c in cells)
    defs = dict(SERVESCOPE_DEFINITIONS, ttft=TTFT_CONTENT) if rebuilt else dict(TOOL_DEFINITIONS[FORMAT])
    return ReadResult(
        tool=FORMAT, cells=cells, tool_version=None,
        format="inference-perf lifecycle reports (" + ("per_request_lifecycle_metrics.json" if rebuilt else
                                                       "stage aggregates") + ")",
        token_basis=(SERVER_USAGE if all_usage else CLIENT_TOKENIZER) if rebuilt else basis, tool_token_basis=basis,
        tokenizer=cfg.tokenizer, warmup="none", ramp="none", streaming=cfg.streaming, ignore_eos=cfg.ignore_eos,
        definitions=defs, lacks=dict(LACKS_REBUILT if rebuilt else LACKS_AGGREGATE))


class _Config:
    """What config.yaml says (defaults where there is none: inference-perf's own)."""

    def __init__(self) -> None:
        self.load_type = "constant"
        self.stages: list[tuple[float | None, int | None]] = []  # each stage's (rate, concurrency) in config.yaml
        self.streaming: bool | None = None
        self.ignore_eos: bool | None = None
        self.tokenizer: str | None = None
        self.server_counts = False
        self.api = "completions"
        self.model = ""
        self.known = False


def _config(folder: Path) -> _Config:
    c = _Config()
    path = folder / "config.yaml"
    if not path.is_file():
        return c
    data = read_yaml(path)
    if not isinstance(data, Mapping):
        raise ServescopeError(f"{path}: not the config.yaml inference-perf writes; {HINT}")
    v = Values(str(path), HINT)
    c.known = True
    load = v.table("load", data.get("load"))
    c.load_type = v.text("load.type", load.get("type")) or "constant"
    for i, raw in enumerate(v.items("load.stages", load.get("stages"), limit=10_000)):
        st = v.table(f"load.stages[{i}]", raw)
        rate = v.num(f"load.stages[{i}].rate", st.get("rate"), hi=1e9)
        conc = v.count(f"load.stages[{i}].concurrency_level", st.get("concurrency_level"), lo=1)
        c.stages.append((rate, conc))
    api = v.table("api", data.get("api"))
    c.api = "chat" if v.text("api.type", api.get("type")) == "chat" else "completions"
    c.streaming = v.flag("api.streaming", api.get("streaming"))
    server = v.table("server", data.get("server"))
    c.ignore_eos = v.flag("server.ignore_eos", server.get("ignore_eos"))
    c.model = v.text("server.model_name", server.get("model_name"))
    tok = v.table("tokenizer", data.get("tokenizer"))
    c.tokenizer = v.text("tokenizer.pretrained_model_name_or_path", tok.get("pretrained_model_name_or_path")) or None
    rep = v.table("report.request_lifecycle", v.table("report", data.get("report")).get("request_lifecycle"))
    c.server_counts = v.flag("report.request_lifecycle.use_server_output_tokens",
                             rep.get("use_server_output_tokens")) is True
    return c


def _load(v: Values, data: Mapping[str, object], cfg: _Config, label: str
          ) -> tuple[int | None, float | None, str | None]:
    ls = v.table("load_summary", data.get("load_summary"))
    conc = v.count("load_summary.concurrency", ls.get("concurrency"), lo=1)
    rate = v.num("load_summary.requested_rate", ls.get("requested_rate"), hi=1e9)
    if conc is not None or cfg.load_type == "concurrent":
        if conc is None:
            raise v.fail(f"{label}: a concurrent load without its concurrency in load_summary")
        return conc, None, None
    if rate is not None and rate > 0:
        return None, rate, "poisson" if cfg.load_type == "poisson" else "constant"
    return None, None, None


def _count(v: Values, data: Mapping[str, object]) -> int:
    ok = v.count("successes.count", v.table("successes", data.get("successes")).get("count")) or 0
    failed = v.count("failures.count", v.table("failures", data.get("failures")).get("count")) or 0
    return ok + failed


def _stamps(v: Values, where: str, raw: object, cfg: _Config) -> Stamps:
    r = v.table(where, raw)
    info = v.table(f"{where}.info", r.get("info"))
    rm = v.table(f"{where}.info.response_metrics", info.get("response_metrics"))
    req = v.table(f"{where}.info.request_metrics", info.get("request_metrics"))
    text = v.table(f"{where}.info.request_metrics.text", req.get("text"))
    usage = v.table(f"{where}.info.response_metrics.server_usage", rm.get("server_usage"))
    start = v.need(f"{where}.start_time", r.get("start_time"))
    end = v.num(f"{where}.end_time", r.get("end_time"))
    times = [v.need(f"{where}.info.response_metrics.chunk_times[{j}]", t)
             for j, t in enumerate(v.items(f"{where}.info.response_metrics.chunk_times", rm.get("chunk_times"),
                                           limit=MAX_TOKENS))]
    err = r.get("error")
    err_text = ""
    if err is not None:
        e = v.table(f"{where}.error", err)
        err_text = ": ".join(x for x in (v.text(f"{where}.error.error_type", e.get("error_type")),
                                         v.text(f"{where}.error.error_msg", e.get("error_msg"), limit=500)) if x) \
            or "failed"
    out_usage = v.count(f"{where}.info.response_metrics.server_usage.completion_tokens",
                        usage.get("completion_tokens"), hi=MAX_TOKENS)
    in_usage = v.count(f"{where}.info.response_metrics.server_usage.prompt_tokens", usage.get("prompt_tokens"),
                       hi=MAX_TOKENS)
    out_client = v.count(f"{where}.info.response_metrics.output_tokens", rm.get("output_tokens"), hi=MAX_TOKENS)
    in_client = v.count(f"{where}.info.request_metrics.text.input_tokens", text.get("input_tokens"), hi=MAX_TOKENS)
    if in_client is None:  # before multimodal reports: info.input_tokens
        in_client = v.count(f"{where}.info.input_tokens", info.get("input_tokens"), hi=MAX_TOKENS)
    details = v.table(f"{where}.info.response_metrics.server_usage.prompt_tokens_details",
                      usage.get("prompt_tokens_details"))
    cached = v.count(f"{where}.info.response_metrics.server_usage.prompt_tokens_details.cached_tokens",
                     details.get("cached_tokens"), hi=MAX_TOKENS)
    if not times and not err_text:
        err_text = "no content chunk (not streamed, or empty)" if cfg.streaming is not False else ""
    return Stamps(start=start, end=end, first_token=times[0] if times else None, chunks=times or None,
                  output_tokens=out_usage if out_usage is not None else (out_client or 0),
                  prompt_tokens=in_usage if in_usage is not None else in_client,
                  input_requested=in_client, output_requested=None, usage=out_usage is not None,
                  cached_tokens=cached, error=err_text)


def _stats(v: Values, where: str, raw: object, scale: float) -> dict[str, float | None]:
    t = v.table(where, raw)
    out: dict[str, float | None] = {}
    for ours, theirs in (("mean", "mean"), ("min", "min"), ("max", "max"), ("p50", "median"), ("p90", "p90"),
                         ("p95", "p95"), ("p99", "p99")):
        x = v.num(f"{where}.{theirs}", t.get(theirs), lo=0.0, hi=1e15)
        out[ours] = x * scale if x is not None else None
    return out


_DISTS = {"ttft_ms": "time_to_first_token", "tpot_ms": "time_per_output_token", "itl_ms": "inter_token_latency",
          "e2e_ms": "request_latency"}


def _aggregates(v: Values, data: Mapping[str, object]) -> CellResult:
    succ = v.table("successes", data.get("successes"))
    lat = v.table("successes.latency", succ.get("latency"))
    thr = v.table("successes.throughput", succ.get("throughput"))
    ok = v.count("successes.count", succ.get("count")) or 0
    failed = v.count("failures.count", v.table("failures", data.get("failures")).get("count")) or 0
    wall = v.num("benchmark_time_seconds", data.get("benchmark_time_seconds"))
    prompt = succ.get("prompt_tokens") if succ.get("prompt_tokens") is not None else succ.get("prompt_len")
    out_len = succ.get("output_tokens") if succ.get("output_tokens") is not None else succ.get("output_len")
    req_s = v.num("successes.throughput.requests_per_sec", thr.get("requests_per_sec"), hi=1e12)
    if wall is None and req_s:
        wall = ok / req_s
    return aggregate_summary(
        ok=ok, failed=failed, wall_s=wall, input_mean=_stats(v, "successes.prompt_tokens", prompt, 1.0)["mean"],
        output_mean=_stats(v, "successes.output_tokens", out_len, 1.0)["mean"], request_s=req_s,
        output_tok_s=v.num("successes.throughput.output_tokens_per_sec", thr.get("output_tokens_per_sec"), hi=1e12),
        total_tok_s=v.num("successes.throughput.total_tokens_per_sec", thr.get("total_tokens_per_sec"), hi=1e12),
        dists={ours: _stats(v, f"successes.latency.{theirs}", lat.get(theirs), 1000.0)
               for ours, theirs in _DISTS.items()})


def _reported(v: Values, data: Mapping[str, object]) -> dict[str, float]:
    if not data:
        return {}
    succ = v.table("successes", data.get("successes"))
    thr = v.table("successes.throughput", succ.get("throughput"))
    lat = v.table("successes.latency", succ.get("latency"))
    out: dict[str, float] = {}
    for key, val in (("output_tokens_per_sec", thr.get("output_tokens_per_sec")),
                     ("requests_per_sec", thr.get("requests_per_sec")),
                     ("time_to_first_token_s_median", v.table("ttft", lat.get("time_to_first_token")).get("median")),
                     ("time_per_output_token_s_median", v.table("tpot", lat.get("time_per_output_token")).get("median"))):
        x = v.num(f"successes.{key}", val, lo=0.0, hi=1e15)
        if x is not None:
            out[key] = x
    return out

