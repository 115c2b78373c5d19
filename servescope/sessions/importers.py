"""Import results made elsewhere as servescope sessions, so they can be compared and reported.

`import_files()` recognises each file's format (or takes the one `--from` names), reads it with that format's reader,
and writes one session: one cell per run of a load, the `[source]` table (sessions/provenance.py) saying what measured
it and how. The formats (docs/imports.md):

- `vllm bench serve --save-result` JSON (this module): one file per run = one cell. With `--save-detailed` the file
  also holds per-request data (ttfts, itls, latencies, start_times, input/output lengths, errors): servescope then
  rebuilds request records and computes every metric with its own formulas (`servescope.core.metrics`), so the
  numbers are directly comparable with a servescope session. Without it, only vLLM's aggregates are kept
  (mean/median/std/p99 and any --metric-percentiles), and the metrics listed in `lacks` are missing.
- GuideLLM's benchmarks JSON (sessions/import_guidellm.py), AIPerf's profile export (sessions/import_aiperf.py),
  inference-perf's lifecycle reports (sessions/import_inferenceperf.py) and llm-d benchmark reports
  (sessions/llmd.py). A folder given is searched for those files.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from servescope.core.errors import ServescopeError
from servescope.core.metrics import DIST_METRICS, records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
from servescope.core.textsafe import clean_text
from servescope.sessions import import_aiperf, import_guidellm, import_inferenceperf, llmd
from servescope.sessions.importcommon import ImportedCell, ReadResult, read_json, read_yaml
from servescope.sessions.provenance import (
    IMPORT_FORMATS,
    SERVER_USAGE,
    SERVESCOPE_DEFINITIONS,
    TOOL_NAMES,
    SourceMeta,
)
from servescope.sessions.store import SessionWriter, new_session_dir
from servescope.workloads.spec import DistTable, WorkloadTable

FORMAT_VLLM = "vllm-bench-serve"

# what a detailed vllm bench import cannot know
LACKS_DETAILED = {
    "ttfo_ms": "vllm bench does not tell reasoning from content: TTFO is taken equal to TTFT",
    "reasoning_tokens": "not recorded by vllm bench",
    "client_queue_ms": "vllm bench's queue_times is the wait for a concurrency slot, not a late send",
    "input_tokens_requested": "vllm bench records the sent lengths only: requested = measured",
    "server": "no /metrics deltas (preemptions, KV cache, server-side TTFT)",
    "itl_token_ms": "tokens per chunk are not recorded: spread evenly over the chunks",
}
# and what an aggregate-only import lacks on top of that
LACKS_AGGREGATE = {
    "per_user_tok_s": "needs per-request data (--save-detailed)",
    "prefill_tok_s": "needs per-request data (--save-detailed)",
    "percentiles": "only the mean, median, std, p99 and any --metric-percentiles vllm bench saved; no min/max",
    "slo_met_fraction": "needs per-request data (--save-detailed): capacity at the SLOs is unknown",
}

_VLLM_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}


def detect_format(data: object) -> str | None:
    if isinstance(data, dict) and "completed" in data and "duration" in data and (
        "output_throughput" in data or "mean_ttft_ms" in data
    ):
        return FORMAT_VLLM
    return None


def read_result(path: str | Path) -> tuple[str, dict[str, object]]:
    """The result file's format and its JSON object (as read: the shape of another tool's output, checked by
    validate_vllm before anything reads it)."""
    p = Path(path)
    if not p.is_file():
        raise ServescopeError(f"{p}: no such file; give the JSON that `vllm bench serve --save-result` wrote")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    except OSError as e:
        raise ServescopeError(f"{p}: cannot read it ({clean_text(e.strerror or str(e))}); check the path") from None
    except RecursionError:
        data = None
    fmt = detect_format(data)
    if fmt is None or not isinstance(data, dict):
        raise ServescopeError(f"{p}: unknown import format; servescope imports the JSON that "
                              "`vllm bench serve --save-result [--save-detailed]` writes")
    validate_vllm(data, str(p))
    return fmt, data


# ---- validation: every value the import uses, before anything is written --------------------------------
MAX_COUNT = 10**12  # tokens, requests: far beyond any real run, small enough for an Int64 column
MAX_SECONDS = 1e9  # times and durations (start_times are a monotonic clock's seconds)
MAX_TOKENS = 10**9  # one request's tokens (int32 columns)
_COUNTS = ("completed", "failed", "num_prompts", "total_input_tokens", "total_output_tokens",
           "max_concurrent_requests")
_RATES = ("duration", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
          "max_output_tokens_per_s", "burstiness")
_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
_HINT = "the file is damaged or not what `vllm bench serve --save-result` wrote; re-run the benchmark"


def _what(v: object) -> str:
    text = json.dumps(v, allow_nan=True, default=str) if not isinstance(v, str) else repr(v)
    return clean_text(text)[:40]


def _bad(where: str, key: str, v: object, expected: str) -> ServescopeError:
    return ServescopeError(f"{where}: {key} is {_what(v)}, expected {expected}; {_HINT}")


def _finite(where: str, key: str, v: object, lo: float = 0.0, hi: float = MAX_SECONDS, allow_none: bool = True,
            allow_inf: bool = False) -> None:
    if v is None and allow_none:
        return
    if allow_inf and (v == "inf" or (isinstance(v, float) and math.isinf(v) and v > 0)):
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(where, key, v, f"a finite number from {lo:g} to {hi:g}" + (" (or null)" if allow_none else ""))


def _count(where: str, key: str, v: object, lo: int = 0, allow_none: bool = True, hi: int = MAX_COUNT) -> None:
    if v is None and allow_none:
        return
    if (isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
            or not lo <= v <= hi):
        raise _bad(where, key, v, f"a whole number from {lo} to {hi:,}" + (" (or null)" if allow_none else ""))


def validate_vllm(d: Mapping[str, object], where: str) -> None:
    """Every value of a `vllm bench serve` result the import reads: counts are whole and in range, times
    and rates finite and not negative, per-request lists the same length with values of the right type.
    One ServescopeError naming the file and the key; nothing is written before this passed."""
    for k in _COUNTS:
        _count(where, k, d.get(k), allow_none=k not in ("completed",))
    _count(where, "max_concurrency", d.get("max_concurrency"), lo=1)
    _finite(where, "request_rate", d.get("request_rate"), hi=MAX_COUNT, allow_inf=True)
    _finite(where, "duration", d.get("duration"), allow_none=False)
    for k in _RATES:
        _finite(where, k, d.get(k), hi=MAX_COUNT)
    ends = tuple(f"_{m}_ms" for m in _VLLM_METRICS)
    for key, v in d.items():  # mean_ttft_ms, median_, std_, p99_ (and any --metric-percentiles)
        if isinstance(key, str) and key.endswith(ends) and key.startswith(("mean_", "median_", "std_", "p")):
            _finite(where, key, v, hi=MAX_SECONDS * 1000)
    lists: dict[str, list[object]] = {}
    for k in _PER_REQUEST:
        v = d.get(k)
        if v is not None and not isinstance(v, list):
            raise _bad(where, k, v, "a list (one entry per request)")
        if v is not None:
            lists[k] = v
    if not lists.get("ttfts"):
        return  # aggregates only (no --save-detailed)
    n = len(lists["ttfts"])
    for k in ("input_lens", "output_lens", "itls"):
        if k not in lists:
            raise ServescopeError(f"{where}: has ttfts but no {k}; {_HINT} with --save-detailed")
    for k, v in lists.items():
        if k != "start_times" and len(v) != n or k == "start_times" and v and len(v) != n:
            raise ServescopeError(f"{where}: {k} has {len(v)} entries but ttfts {n}: one per request is needed; "
                                  f"{_HINT}")
    for i in range(n):
        _count(where, f"input_lens[{i}]", lists["input_lens"][i], hi=MAX_TOKENS)
        _count(where, f"output_lens[{i}]", lists["output_lens"][i], hi=MAX_TOKENS)
        _finite(where, f"ttfts[{i}]", lists["ttfts"][i])
        gaps = lists["itls"][i]
        if gaps is not None and not isinstance(gaps, list):
            raise _bad(where, f"itls[{i}]", gaps, "a list of inter-token gaps in seconds")
        total = 0.0
        for j, g in enumerate(gaps or []):
            _finite(where, f"itls[{i}][{j}]", g, allow_none=False)
            total += g if isinstance(g, (int, float)) else 0.0  # _finite raised for anything else
        if total > MAX_SECONDS:
            raise _bad(where, f"itls[{i}]", f"{total:g} s in all", f"at most {MAX_SECONDS:g} s")
        if "latencies" in lists:
            _finite(where, f"latencies[{i}]", lists["latencies"][i])
        if lists.get("start_times"):
            _finite(where, f"start_times[{i}]", lists["start_times"][i], allow_none=False, hi=MAX_SECONDS)
        if "errors" in lists and not isinstance(lists["errors"][i], (str, type(None))):
            raise _bad(where, f"errors[{i}]", lists["errors"][i], "a text (empty when the request succeeded)")


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int(v: object) -> int:
    """A validated count (a whole number, or null: 0)."""
    return int(v) if isinstance(v, (int, float)) else 0


def _list(v: object) -> list[object]:
    return v if isinstance(v, list) else []


def _dist(lens: Sequence[int]) -> DistTable:
    lo, hi = min(lens), max(lens)
    return {"dist": "fixed", "value": lo} if lo == hi else {"dist": "uniform", "min": lo, "max": hi}


def _is_detailed(d: Mapping[str, object]) -> bool:
    n = len(_list(d.get("ttfts")))
    return n > 0 and all(len(_list(d.get(k))) == n for k in ("input_lens", "output_lens", "itls"))


def _records(d: Mapping[str, object]) -> list[RequestRecord]:
    ttfts, itls = _list(d["ttfts"]), _list(d["itls"])
    ins, outs = _list(d["input_lens"]), _list(d["output_lens"])
    n = len(ttfts)
    lat = _list(d.get("latencies")) or [None] * n
    starts = [_num(x) or 0.0 for x in _list(d.get("start_times"))]  # validated: finite numbers
    errors = _list(d.get("errors")) or [""] * n
    t0 = min(starts) if len(starts) == n else 0.0
    recs = []
    cursor = 0.0
    for i in range(n):
        err = clean_text(str(errors[i] or "")) if i < len(errors) else ""
        start = (starts[i] - t0) if len(starts) == n else cursor
        sent = int(round(start * 1e9)) + 1  # stamps must be > 0 to count as present
        r = RequestRecord(index=i, user=-1, warmup=False, input_tokens_requested=_int(ins[i]),
                          output_tokens_requested=_int(outs[i]), scheduled_ns=sent, sent_ns=sent)
        ttft = _num(ttfts[i])
        gaps = [f for g in _list(itls[i]) if (f := _num(g)) is not None]
        if err or ttft is None or (ttft == 0 and not gaps):
            r.status = "error"
            r.error = err or "failed (no tokens)"
            r.end_ns = sent + int(round((_num(lat[i]) or 0.0) * 1e9))
            recs.append(r)
            continue
        r.first_token_ns = r.first_content_ns = sent + int(round(ttft * 1e9))
        out = _int(outs[i])
        per = [1] * (len(gaps) + 1)
        if gaps and out > len(gaps) + 1:
            q, rem = divmod(out - 1, len(gaps))
            per = [1] + [q + (1 if j < rem else 0) for j in range(len(gaps))]
        t = r.first_token_ns
        stamps = [t]
        for g in gaps:
            t += int(round(g * 1e9))
            stamps.append(t)
        r.chunk_ns = array("q", stamps)
        r.chunk_tokens = array("i", per)
        e2e = _num(lat[i])
        r.end_ns = sent + int(round(e2e * 1e9)) if e2e is not None else stamps[-1]
        r.prompt_tokens = _int(ins[i])
        r.output_tokens = out
        r.usage_reported = True
        cursor = (r.end_ns - 1) / 1e9
        recs.append(r)
    return recs


def _aggregate_summary(d: Mapping[str, object]) -> CellResult:
    completed = int(_num(d.get("completed")) or 0)
    failed = int(_num(d.get("failed")) or 0) or max(0, int(_num(d.get("num_prompts")) or 0) - completed)
    tin, tout = _num(d.get("total_input_tokens")), _num(d.get("total_output_tokens"))
    s: dict[str, object] = {
        "requests_ok": completed,
        "requests_failed": failed,
        "wall_s": _num(d.get("duration")),
        "input_tokens_requested": tin / completed if tin is not None and completed else None,
        "input_tokens_mean": tin / completed if tin is not None and completed else None,
        "input_tokens_mismatch": None,
        "output_tokens_requested": None,
        "output_tokens_mean": tout / completed if tout is not None and completed else None,
        "reasoning_tokens_mean": None,
        "output_tokens_total": int(tout) if tout is not None else None,
        "input_tokens_total": int(tin) if tin is not None else None,
        "request_s": _num(d.get("request_throughput")),
        "output_tok_s": _num(d.get("output_throughput")),
        "total_tok_s": _num(d.get("total_token_throughput")),
        "goodput_req_s": _num(d.get("request_goodput")),
        "slo_met_fraction": None,
        "errors": [],
    }
    dists: dict[str, dict[str, float | None]] = {
        m: {k: None for k in ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")} for m in DIST_METRICS}
    s.update(dists)
    for vk, sk in _VLLM_METRICS.items():
        st = dists[sk]
        st["mean"] = _num(d.get(f"mean_{vk}_ms"))
        st["std"] = _num(d.get(f"std_{vk}_ms"))
        st["p50"] = _num(d.get(f"median_{vk}_ms"))
        for key, val in d.items():
            if key.startswith("p") and key.endswith(f"_{vk}_ms"):
                pct = key[1:-len(f"_{vk}_ms")]
                try:
                    pf = float(pct)
                except ValueError:
                    continue
                st[f"p{pf:g}"] = _num(val)
    return CellResult.from_dict(s)  # what the file did not say stays None (p90 kept only where it is in STATS)


def _vllm_reported(d: Mapping[str, object]) -> dict[str, float]:
    out = {}
    for key in ("output_throughput", "request_throughput", "total_token_throughput", "duration"):
        v = _num(d.get(key))
        if v is not None:
            out[key] = v
    for vk in _VLLM_METRICS:
        for stat in ("mean", "median", "p99"):
            v = _num(d.get(f"{stat}_{vk}_ms"))
            if v is not None:
                out[f"{stat}_{vk}_ms"] = v
    return out


def vllm_cell(d: Mapping[str, object], source: str, workload_name: str | None = None) -> ImportedCell:
    detailed = _is_detailed(d)
    if detailed:
        recs = _records(d)
        df = records_frame(recs)
        wall = _num(d.get("duration")) or 0.0
        summary = summarize(df, wall)
        ins = [_int(x) for x in _list(d["input_lens"]) if x]
        outs = [_int(x) for x in _list(d["output_lens"]) if x]
    else:
        df = None
        summary = _aggregate_summary(d)
        ins = [round(summary.input_tokens_mean)] if summary.input_tokens_mean else [0]
        outs = [round(summary.output_tokens_mean)] if summary.output_tokens_mean else [0]
    ins, outs = ins or [0], outs or [0]
    rate = _num(d.get("request_rate"))
    if rate is not None and math.isinf(rate):
        rate = None
    mc = d.get("max_concurrency")
    max_conc = int(mc) if isinstance(mc, (int, float)) and not isinstance(mc, bool) else None
    conc = None
    if rate is None:
        conc = max_conc or int(_num(d.get("num_prompts")) or summary.requests)
    burst = _num(d.get("burstiness"))
    arrival = None if rate is None else ("poisson" if burst in (None, 1.0) else f"gamma(burstiness {burst:g})")
    backend = str(d.get("endpoint_type") or d.get("backend") or "")
    api = "chat" if "chat" in backend else "completions"
    name = workload_name or f"vllm-bench-in{round(sum(ins) / len(ins))}-out{round(sum(outs) / len(outs))}"
    workload: WorkloadTable = {"name": name, "api": api, "input_tokens": _dist(ins), "output_tokens": _dist(outs),
                "prefix_tokens": 0, "dataset": "", "seed": 0, "source": f"imported from {Path(source).name}"}
    extra = {}
    if d.get("label"):
        extra["label"] = clean_text(str(d["label"]))
    known = set(_aggregate_keys(d))
    for k, v in d.items():
        if k not in known and isinstance(v, (str, int, float)) and not isinstance(v, bool) and len(str(v)) < 200:
            extra[clean_text(str(k))] = clean_text(str(v))
    return ImportedCell(workload, conc, rate, max_conc if rate is not None else None, arrival, summary, df, source,
                        detailed, _vllm_reported(d), clean_text(str(d.get("model_id") or "")), extra,
                        label=f"max concurrency {max_conc}" if rate is None else f"rate {rate:g}/s")


_STANDARD_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx", "model_name",
}


def _aggregate_keys(d: Mapping[str, object]) -> list[str]:
    out = list(_STANDARD_KEYS)
    for k in d:
        if any(k.endswith(f"_{m}_ms") for m in _VLLM_METRICS):
            out.append(k)
    return out


def lacks(detailed: bool) -> dict[str, str]:
    return {**LACKS_DETAILED, **({} if detailed else LACKS_AGGREGATE)}


def _vllm(paths: Sequence[Path], workload_name: str | None) -> ReadResult:
    cells: list[ImportedCell] = []
    dates: list[str] = []
    for p in paths:
        _fmt, data = read_result(p)
        cells.append(vllm_cell(data, str(p), workload_name))
        if data.get("date"):
            dates.append(clean_text(str(data["date"])))
    detailed = all(c.detailed for c in cells)
    return ReadResult(tool="vllm-bench", cells=cells, format="vllm bench serve --save-result JSON"
                      + (" (--save-detailed)" if detailed else ""), token_basis=SERVER_USAGE,
                      tool_token_basis=SERVER_USAGE, warmup="none", ramp="none", streaming=True,
                      definitions=dict(SERVESCOPE_DEFINITIONS), lacks=lacks(detailed), dates=dates)


# ---- recognising the files ------------------------------------------------------------------------------
MAX_DEPTH = 4  # how deep a folder given is searched
_CONFIG = "inference-perf-config"  # inference-perf's config.yaml: read beside its reports, never a cell itself


def sniff(path: Path) -> str | None:
    """The import format of one file (a key of TOOL_NAMES, or _CONFIG), None when it is none of them."""
    if path.suffix == ".jsonl":
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        return "aiperf" if import_aiperf.detect_record(json.loads(line)) else None
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return None
        return None
    if path.suffix in (".yaml", ".yml"):
        data = read_yaml(path)
        if llmd.detect(data):
            return "llmd-report"
        if isinstance(data, Mapping) and "load" in data and ("server" in data or "api" in data):
            return _CONFIG
        return None
    data = read_json(path)
    if detect_format(data) is not None:
        return "vllm-bench"
    if import_guidellm.detect(data):
        return "guidellm"
    if import_aiperf.detect_aggregate(data):
        return "aiperf"
    if import_inferenceperf.detect_lifecycle(data) or import_inferenceperf.detect_per_request(data):
        return "inference-perf"
    if llmd.detect(data):
        return "llmd-report"
    return None


def _walk(folder: Path, depth: int = 0) -> list[Path]:
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise ServescopeError(f"{folder}: cannot list it ({clean_text(e.strerror or str(e))}); check the path") from None
    out: list[Path] = []
    for entry in entries:
        if entry.name.startswith(".") or entry.is_symlink():
            continue
        if entry.is_dir() and depth < MAX_DEPTH and entry.name not in ("logs", "aggregate", "sweep_aggregate"):
            out += _walk(entry, depth + 1)
        elif entry.is_file() and entry.suffix in (".json", ".jsonl", ".yaml", ".yml"):
            out.append(entry)
    return out


def recognise(files: Sequence[str | Path], fmt: str | None = None) -> tuple[str, list[Path]]:
    """The format of the files given and the data files to read (a folder: the files in it that are of a known
    format). One format per import: files of two tools are two sessions."""
    if fmt is not None and fmt not in IMPORT_FORMATS:
        raise ServescopeError(f"--from {clean_text(fmt)}: not a format servescope imports; use one of "
                              f"{', '.join(IMPORT_FORMATS)}")
    found: dict[Path, str] = {}
    for f in files:
        p = Path(f).expanduser()
        if p.is_dir():
            inside = {q: k for q in _walk(p) if (k := sniff(q)) is not None}
            if not any(k != _CONFIG for k in inside.values()):
                raise ServescopeError(f"{p}: no result file of a known format in it; servescope imports "
                                      + _KNOWN)
            found.update(inside)
            continue
        if not p.is_file():
            raise ServescopeError(f"{p}: no such file; give the result files (or their folder): " + _KNOWN)
        kind = sniff(p)
        if kind is None:
            why = _unknown_why(p)
            raise ServescopeError(f"{p}: {why or 'unknown import format'}; " + (
                _HINTS[fmt] if fmt is not None else
                ("the file is damaged or not a result file; " if why else "") + "servescope imports " + _KNOWN))
        if p.resolve() in found:
            raise ServescopeError(f"{p} is given twice; give each file once")
        found[p.resolve()] = kind
    kinds = {k for k in found.values() if k != _CONFIG}
    if fmt is None and kinds == {"inference-perf", "llmd-report"}:
        # inference-perf (0.7) writes partial llm-d reports of its stages beside its own reports: its own are read
        # there (the per-request file), as --from inference-perf would
        theirs = {p.parent for p, k in found.items() if k == "inference-perf"}
        found = {p: k for p, k in found.items() if not (k == "llmd-report" and p.parent in theirs)}
        kinds = {k for k in found.values() if k != _CONFIG}
    if fmt is not None:
        wrong = {p: k for p, k in found.items() if k not in (fmt, _CONFIG)}
        if wrong and all(p.parent in {f.parent for f in found if found[f] == fmt} for p in wrong) and \
                any(k == fmt for k in found.values()):
            found = {p: k for p, k in found.items() if p not in wrong}  # other tools' files in its folder
        elif wrong:
            p, k = next(iter(wrong.items()))
            raise ServescopeError(f"{p}: not a {TOOL_NAMES[fmt]} file (it looks like {TOOL_NAMES.get(k, k)}'s); "
                                  f"leave --from out, or give {TOOL_NAMES[fmt]}'s files")
        kinds = {fmt}
    if len(kinds) > 1:
        raise ServescopeError("the files come from different tools (" + ", ".join(sorted(TOOL_NAMES[k] for k in kinds))
                              + "): import each tool's files as a session of its own")
    if not kinds:
        raise ServescopeError("no result file among the files given; servescope imports " + _KNOWN)
    kind = kinds.pop()
    return kind, [p for p, k in found.items() if k == kind]


_HINTS = {"vllm-bench": _HINT, "guidellm": import_guidellm.HINT, "aiperf": import_aiperf.HINT,
          "inference-perf": import_inferenceperf.HINT, "llmd-report": llmd.HINT}


def _unknown_why(path: Path) -> str:
    """Why a file is of no known format, in a few words: it is not JSON (or YAML, or JSON Lines) and where it
    breaks; "" when it reads (as no tool's result file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return "not text (not UTF-8)"
    except OSError as e:
        return f"cannot read it ({clean_text(e.strerror or str(e))})"
    if path.suffix in (".yaml", ".yml"):
        return "not YAML" if read_yaml(path) is None else ""
    if path.suffix == ".jsonl":
        text = next((ln for ln in text.splitlines() if ln.strip()), "")
        what = "JSON Lines (its first record)"
    else:
        what = "JSON"
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return f"not {what}: {clean_text(e.msg)} at line {e.lineno}, column {e.colno}"
    except (ValueError, RecursionError):
        return f"not {what}"
    return ""


_KNOWN = ("`vllm bench serve --save-result` JSON, GuideLLM's benchmarks JSON, AIPerf's profile_export.jsonl or "
          "profile_export_aiperf.json, inference-perf's lifecycle reports and llm-d benchmark reports "
          "(docs/imports.md)")


def read_files(kind: str, paths: Sequence[Path], workload: str | None) -> ReadResult:
    if kind == "vllm-bench":
        return _vllm(paths, workload)
    if kind == "guidellm":
        out: ReadResult | None = None
        for p in paths:
            data = read_json(p)
            if not isinstance(data, Mapping):
                raise ServescopeError(f"{p}: not GuideLLM's benchmarks JSON; {import_guidellm.HINT}")
            r = import_guidellm.read(p, {str(k): x for k, x in data.items()}, workload)
            if out is not None and r.tool_version != out.tool_version:
                raise ServescopeError(f"the files are from different GuideLLM versions ({out.tool_version}, "
                                      f"{r.tool_version}); import them as separate sessions")
            if out is None:
                out = r
            else:
                out.cells += r.cells
        assert out is not None
        return out
    if kind == "aiperf":
        return import_aiperf.read(paths, workload)
    if kind == "inference-perf":
        return import_inferenceperf.read(paths, workload)
    return llmd.read(paths, workload)


# ---- writing the session --------------------------------------------------------------------------------
def import_files(files: Sequence[str | Path], sessions_dir: Path | None = None, save: Path | None = None,
                 name: str = "", workload: str | None = None, tags: Mapping[str, str] | None = None,
                 fmt: str | None = None) -> Path:
    """Import result files of one tool (`fmt`, else recognised from the files) as one session; return its path.
    Every file is read and checked before anything is written."""
    if not files:
        raise ServescopeError("import needs at least one result file")
    if workload is not None and not workload.strip():  # "" named the cells TOOL-inN-outM, silently
        raise ServescopeError("--workload: empty; give a workload name such as sharegpt (or leave the flag out "
                              "for TOOL-inN-outM)")
    kind, paths = recognise(files, fmt)
    res = read_files(kind, paths, workload)
    cells = res.cells
    if not cells:
        raise ServescopeError("the files hold no run to import")
    models = {c.model for c in cells if c.model}
    if len(models) > 1:
        raise ServescopeError(f"the files are from different models ({', '.join(sorted(models))}); "
                              "import them as separate sessions")
    workloads: dict[str, WorkloadTable] = {}
    for c in cells:
        w = workloads.setdefault(c.workload["name"], c.workload.copy())
        # widen to cover every file's lengths
        w["input_tokens"] = _widen(w["input_tokens"], c.workload["input_tokens"])
        w["output_tokens"] = _widen(w["output_tokens"], c.workload["output_tokens"])
    order = sorted(range(len(cells)), key=lambda i: (list(workloads).index(cells[i].workload["name"]),
                                                     cells[i].rate is not None,
                                                     cells[i].concurrency or cells[i].rate or 0, i))
    cells = [cells[i] for i in order]
    repeats = _repeats(cells, kind)
    model = next(iter(models), "unknown")
    detailed = all(c.detailed for c in cells)
    tool = TOOL_NAMES[kind]
    name = name or f"{kind}-{model.rstrip('/').split('/')[-1]}"
    path = save or new_session_dir(sessions_dir, name)
    all_tags = {**{k: v for c in cells for k, v in c.extra.items()}, **dict(tags or {}), "source": tool}
    plan_rows: list[dict[str, object]] = []
    for i, (c, (rep, of)) in enumerate(zip(cells, repeats, strict=True)):
        plan_rows.append({
            "index": i, "workload": c.workload["name"], "api": c.workload["api"], "concurrency": c.concurrency,
            "rate": c.rate, "arrival": c.arrival, "max_concurrency": c.max_concurrency, "ramp_s": c.ramp_s,
            "requests_planned": c.summary.requests, "duration_s_planned": None, "warmup": c.warmup,
            "load_label": c.load_label, **({"repeat": rep} if of > 1 else {}),
        })
    loops = {"open" if c.rate is not None else "closed" for c in cells}
    source = SourceMeta(
        tool=kind, tool_version=res.tool_version, harness=res.harness, format=res.format,
        files=[str(p.resolve()) for p in paths], dates=res.dates, rebuilt=detailed, token_basis=res.token_basis,
        tool_token_basis=res.tool_token_basis, tokenizer=res.tokenizer,
        loop=" and ".join(sorted(loops)), load=_load_text(cells), warmup=res.warmup, ramp=res.ramp,
        streaming=res.streaming, ignore_eos=res.ignore_eos, requests=[c.summary.requests for c in cells],
        definitions=res.definitions, lacks=res.lacks,
        reported=[{"cell": float(i), **c.reported} for i, c in enumerate(cells)], notes=res.notes)
    meta: dict[str, object] = {
        "name": name,
        "target": {"url": f"unknown (imported from {tool})", "version": None, "metrics": False,
                   "tokenizer": res.tokenizer or tool},
        "model": model,
        "workloads": list(workloads.values()),
        "slos": {},
        "tags": all_tags,
        "cells": [{**r, "status": "planned"} for r in plan_rows],
        "source": source.to_dict(),
    }
    writer = SessionWriter.create(Path(path), meta)
    summary_source = FORMAT_VLLM if kind == "vllm-bench" else kind
    for row, c in zip(plan_rows, cells, strict=True):
        writer.write_cell({**row, "status": "done", "reason": ""}, c.requests,
                          msgspec.structs.replace(c.summary, source=summary_source))
    writer.finish("completed", f"imported from {len(paths)} {tool} file(s)")
    return Path(path)


def _repeats(cells: Sequence[ImportedCell], kind: str) -> list[tuple[int, int]]:
    """Each cell's repeat number and how many cells share its workload and load: cells of one load from different
    files (runs) are repeats of it; one file given twice is refused."""
    by: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(cells):
        by.setdefault((c.workload["name"], c.load_label), []).append(i)
    out = [(1, 1)] * len(cells)
    for key, idx in by.items():
        files = [cells[i].source for i in idx]
        if len(set(files)) < len(files) and kind != "guidellm":
            dup = next(f for f in files if files.count(f) > 1)
            raise ServescopeError(f"{dup} is given twice (both {key[0]} {key[1]}); give each file once")
        for n, i in enumerate(idx, start=1):
            out[i] = (n, len(idx))
    return out


def _load_text(cells: Sequence[ImportedCell]) -> str:
    conc = sorted({c.concurrency for c in cells if c.concurrency is not None})
    rates = sorted({c.rate for c in cells if c.rate is not None})
    parts = []
    if conc:
        parts.append("concurrency " + ", ".join(map(str, conc)))
    if rates:
        parts.append("rate " + ", ".join(f"{r:g}" for r in rates) + "/s")
    return "; ".join(parts)


def _widen(a: DistTable, b: DistTable) -> DistTable:
    """The lengths of two imported workloads of one name: one fixed length, or the range covering both."""
    lo = min(a.get("value", a.get("min", 0)), b.get("value", b.get("min", 0)))
    hi = max(a.get("value", a.get("max", 0)), b.get("value", b.get("max", 0)))
    return {"dist": "fixed", "value": lo} if lo == hi else {"dist": "uniform", "min": lo, "max": hi}
