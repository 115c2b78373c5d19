"""Read request traces for trace replay (`kind = "trace"`): timestamped requests with their lengths.

Formats (`format=` of `read_trace`; "auto" picks one from the extension, then the first line):

    mooncake  JSON lines: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (optional: one id per
              512-token block of the prompt; requests with equal ids share that prefix). Other keys are
              ignored: public files carry extra ones (`session_id`, ...).
    burstgpt  CSV: `Timestamp` (s), `Request tokens`, `Response tokens`; `Model`, `Total tokens` and `Log Type`
              may be there too. Any other column is an error (a misnamed one is not silently ignored).
    azure     CSV (Azure LLM inference traces): `TIMESTAMP` (a datetime like `2023-11-16 18:15:46.6805900`),
              `ContextTokens`, `GeneratedTokens`; any other column is an error.
    session   a servescope session directory (or its session.toml): the measured (not warmup) requests of
              every cell (requests/cell-NNNN.parquet), each at its `scheduled_ns` (when the load pattern
              sent it), with the lengths it asked for (`input_tokens_requested`, `output_tokens_requested`);
              cells follow each other as they ran (if a resumed cell's clock is not after the previous
              cell's, it starts where the previous one's last request did).

Times become seconds since the trace's first request. `Trace.scaled(time_scale)` multiplies them:
`time_scale` 0.5 replays twice as fast, 2.0 half as fast. An output length of 0 (BurstGPT logs failed
requests so) is kept as read; a replay asks for at least one token.

Every problem in a file is one `ServescopeError` line, `FILE:LINE: what is wrong; what to do`, raised
before anything is sent.
"""

from __future__ import annotations

import asyncio
import csv
import functools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servescope.core.errors import ServescopeError, error_text
from servescope.core.target import Tokenizer
from servescope.workloads.prompts import Prompt, _corpus_ids
from servescope.workloads.spec import MAX_TOKENS, TRACE_FORMATS, Workload

FORMATS = TRACE_FORMATS
# CSV formats: (time column, input column, output column), and the other columns their public files have
_CSV_COLUMNS = {"burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
                "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens")}
_CSV_EXTRA = {"burstgpt": ("Log Type", "Model", "Total tokens"), "azure": ()}
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
_SESSION_COLUMNS = ("warmup", "scheduled_ns", "input_tokens_requested", "output_tokens_requested")
_TRIED = ("mooncake (JSON lines with timestamp, input_length, output_length), burstgpt (CSV with Timestamp, "
          "Request tokens, Response tokens), azure (CSV with TIMESTAMP, ContextTokens, GeneratedTokens), "
          "session (a directory with session.toml)")


@dataclass(frozen=True)
class TraceRequest:
    t_s: float  # seconds since the trace's first request, >= 0
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # one id per `block_tokens` block of the prompt, shared between requests


@dataclass(frozen=True)
class Trace:
    """A trace, read and checked. `lines[i]` is where request i is in `path` (for a session: its place in
    the replay order), for messages."""

    path: str
    format: str
    requests: tuple[TraceRequest, ...]
    block_tokens: int = 512
    lines: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].t_s - self.requests[0].t_s if self.requests else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace's duration (0 when all of them are at one instant)."""
        d = self.duration_s
        return len(self.requests) / d if d > 0 else 0.0

    def where(self, i: int) -> str:
        """`FILE:LINE` of request i (a session's: `DIR: request N`)."""
        line = self.lines[i] if i < len(self.lines) else i + 1
        return f"{self.path}: request {line}" if self.format == "session" else f"{self.path}:{line}"

    def scaled(self, time_scale: float) -> Trace:
        """The same requests at `time_scale` times the trace's times: 0.5 is twice as fast, 2.0 half as fast."""
        if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
            raise ServescopeError(f"time_scale {time_scale!r} must be a number above 0 (0.5 replays the trace "
                                  "twice as fast, 2 half as fast)")
        reqs = tuple(replace(r, t_s=r.t_s * time_scale) for r in self.requests)
        return replace(self, requests=reqs)

    def max_input(self) -> int:
        return max((r.input_tokens for r in self.requests), default=0)

    def max_total(self) -> int:
        return max((r.input_tokens + r.output_tokens for r in self.requests), default=0)

    def check_fits(self, max_model_len: int) -> str | None:
        """None when every request fits in `max_model_len` tokens (input + output), else one line naming
        the first that does not."""
        for i, r in enumerate(self.requests):
            total = r.input_tokens + r.output_tokens
            if total > max_model_len:
                return (f"{self.where(i)}: this request needs {r.input_tokens:,} input + {r.output_tokens:,} "
                        f"output = {total:,} tokens, more than the model's max length {max_model_len:,}; "
                        "serve a longer context or drop the trace's longer requests")
        return None

    def shared_block_fraction(self) -> float | None:
        """Of all prompt blocks, the share whose hash id an earlier request already had (what an unbounded
        prefix cache could reuse); None when the trace has no hash ids."""
        seen: set[int] = set()
        total = hits = 0
        for r in self.requests:
            total += len(r.hash_ids)
            hits += sum(h in seen for h in r.hash_ids)
            seen.update(r.hash_ids)
        return hits / total if total else None

    def peak_rate(self, window_s: float = 1.0) -> int:
        """The most requests that start within any `window_s` seconds."""
        best = lo = 0
        ts = [r.t_s for r in self.requests]
        for hi, t in enumerate(ts):
            while t - ts[lo] >= window_s:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def preview(self) -> str:
        """One line: how many requests over how long, rates, lengths and prefix sharing."""
        n = len(self.requests)
        if n == 0:
            return "no requests"
        ins = sorted(r.input_tokens for r in self.requests)
        outs = sorted(r.output_tokens for r in self.requests)
        when = (f"over {_duration(self.duration_s)} ({_num(self.mean_rate)} req/s mean, peak "
                f"{self.peak_rate():,} req/s in a 1 s window)") if self.duration_s > 0 else "all at t = 0"
        text = (f"{n:,} request{'s' if n != 1 else ''} {when}; input p50 {_pct(ins, 50):,} / p99 "
                f"{_pct(ins, 99):,} tokens; output p50 {_pct(outs, 50):,} / p99 {_pct(outs, 99):,}")
        shared = self.shared_block_fraction()
        return text if shared is None else text + f"; {shared:.0%} of prompt blocks shared"


def _pct(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile."""
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def _num(x: float) -> str:
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.3g} s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m} m {sec} s"
    h, m = divmod(m, 60)
    return f"{h} h {m} m"


@dataclass(frozen=True)
class _Where:
    """Makes the one-line errors of one file: `[WHERE: ]FILE[:LINE]: message`."""

    path: str
    prefix: str | None

    def __call__(self, line: int | None, msg: str) -> ServescopeError:
        at = f"{self.path}:{line}" if line is not None else self.path
        return ServescopeError(f"{self.prefix + ': ' if self.prefix else ''}{at}: {msg}")


# one row as read: (line, time in seconds on the file's own clock, the time as written, input, output, hash ids)
_Row = tuple[int, float, Any, int, int, tuple[int, ...]]


def workload_trace(w: Workload) -> Trace:
    """The trace of a `kind = "trace"` workload, read and checked once per file version."""
    try:
        return cached_trace(w.trace, w.trace_format)
    except ServescopeError as e:
        raise ServescopeError(f"workload {w.name!r}: {e.message}") from None


def cached_trace(path: str | Path, format: str = "auto") -> Trace:
    """`read_trace`, read once per file version (its size and mtime; a session directory by its cells.parquet)."""
    p = Path(path)
    key = p / "cells.parquet" if p.is_dir() else p
    try:
        st = key.stat()
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = (-1, -1)
    return _cached(str(p), format, *stamp)


@functools.lru_cache(maxsize=8)
def _cached(path: str, format: str, size: int, mtime_ns: int) -> Trace:
    del size, mtime_ns  # the cache key: a changed file is read again
    return read_trace(path, format)


def read_trace(path: str | Path, format: str = "auto", *, where: str | None = None) -> Trace:
    """Read and check a trace. `where` (e.g. "sweep.toml: workload 'replay'") starts every error line."""
    p = Path(path)
    fmt = format.lower()
    if fmt not in (*FORMATS, "auto"):
        raise ServescopeError(f"{where + ': ' if where else ''}unknown trace format {format!r}; use one of "
                              f"{', '.join(FORMATS)} or auto")
    if p.is_dir() or p.name == "session.toml" or fmt == "session":
        if fmt not in ("auto", "session"):
            raise _Where(str(p), where)(None, f"a session, not a {fmt} file; use format = \"session\"")
        return _read_session(p.parent if p.name == "session.toml" else p, where)
    err = _Where(str(p), where)
    try:
        with open(p, encoding="utf-8-sig", newline="") as f:
            first = ""
            for first in f:
                if first.strip():
                    break
            f.seek(0)
            if fmt == "auto":
                fmt = _detect(p, first, err)
            rows = list(_mooncake_rows(f, err) if fmt == "mooncake" else _csv_rows(f, fmt, err))
    except OSError as e:
        raise err(None, f"cannot read it ({e.strerror}); check the path") from None
    except UnicodeDecodeError:
        raise err(None, "not a text file; give a JSON-lines or CSV trace, or a session directory") from None
    except csv.Error as e:
        raise err(None, f"not well-formed CSV ({_show(str(e))}); fix the file or give its format") from None
    return _build(str(p), fmt, rows, err)


def _detect(p: Path, first: str, err: _Where) -> str:
    head = first.strip()
    if not head:
        raise err(1, "the file is empty (no requests); give a trace with at least one request")
    if head.startswith("{") or p.suffix.lower() in (".jsonl", ".json"):
        return "mooncake"
    cols = {c.strip() for c in next(csv.reader([head]))}
    for fmt, need in _CSV_COLUMNS.items():
        if set(need) <= cols:
            return fmt
    raise err(1, f"not a trace format servescope knows; tried {_TRIED}; set the format explicitly if the "
                 "file is one of them")


def _int(v: Any, what: str, line: int, err: _Where, lo: int) -> int:
    n = v
    if isinstance(v, str):
        try:
            n = float(v.strip())
        except ValueError:
            pass
    if isinstance(n, float) and math.isfinite(n) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or isinstance(n, bool):
        raise err(line, f"{what} is {_show(v)}, not a whole number of tokens; fix or drop that row")
    if not lo <= n <= MAX_TOKENS:
        raise err(line, f"{what} is {n}; it must be from {lo} to {MAX_TOKENS:,}; fix or drop that row")
    return n


def _show(v: Any) -> str:
    """A value from the file, quoted, on one line and short."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _time(v: Any, what: str, line: int, err: _Where) -> float:
    t = v
    if isinstance(v, str):
        try:
            t = float(v.strip())
        except ValueError:
            t = None
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        raise err(line, f"{what} is {_show(v)}, not a number; fix or drop that row")
    if t < 0:
        raise err(line, f"{what} is {t:g}, a negative time; timestamps must be 0 or later")
    return float(t)


def _mooncake_rows(f: Any, err: _Where) -> Iterator[_Row]:
    for line, raw in enumerate(f, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, an int of too many digits, deep nesting
            why = e.msg if isinstance(e, json.JSONDecodeError) else error_text(e)
            raise err(line, f"not JSON ({why}); each line of a Mooncake trace is one JSON object") from None
        if not isinstance(obj, dict):
            raise err(line, "not a JSON object; each line of a Mooncake trace is one {...}")
        missing = [k for k in _MOONCAKE_KEYS if k not in obj]
        if missing:
            raise err(line, f"missing {', '.join(missing)}; a Mooncake line needs {', '.join(_MOONCAKE_KEYS)} "
                            f"(and optionally hash_ids), found {', '.join(map(_show, obj)) or 'no keys'}")
        hashes = obj.get("hash_ids", [])
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise err(line, "hash_ids must be a list of integers (one per prompt block); fix or drop that row")
        yield (line, _time(obj["timestamp"], "timestamp", line, err) / 1000.0, obj["timestamp"],
               _int(obj["input_length"], "input_length", line, err, 1),
               _int(obj["output_length"], "output_length", line, err, 0), tuple(hashes))


def _csv_rows(f: Any, fmt: str, err: _Where) -> Iterator[_Row]:
    reader = csv.reader(f)
    header = [c.strip() for c in next(reader, [])]
    need = _CSV_COLUMNS[fmt]
    known = {*need, *_CSV_EXTRA[fmt]}
    missing = [c for c in need if c not in header]
    unknown = [c for c in header if c not in known]
    if missing or unknown:
        what = f"missing column {', '.join(map(_show, missing))}" if missing else \
            f"unknown column {', '.join(map(_show, unknown))}"
        extra = f" (may also have {', '.join(_CSV_EXTRA[fmt])})" if _CSV_EXTRA[fmt] else ""
        raise err(1, f"{what}; a {fmt} trace has the columns {', '.join(need)}{extra}, this one has "
                     f"{', '.join(map(_show, header)) or 'none'}")
    it, ii, io = (header.index(c) for c in need)
    t0: datetime | None = None
    for row in reader:
        line = reader.line_num
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise err(line, f"{len(row)} fields where the header has {len(header)}; fix that row")
        if fmt == "azure":
            dt = _datetime(row[it], line, err)
            t0 = t0 or dt
            t = (dt - t0).total_seconds()
        else:
            t = _time(row[it], need[0], line, err)
        yield (line, t, row[it].strip(), _int(row[ii], need[1], line, err, 1),
               _int(row[io], need[2], line, err, 0), ())


def _datetime(s: str, line: int, err: _Where) -> datetime:
    text = s.strip()
    try:
        dt = datetime.fromisoformat(text)
        dt = dt.astimezone(UTC).replace(tzinfo=None) if dt.tzinfo else dt
    except (ValueError, OverflowError):
        raise err(line, f"TIMESTAMP is {_show(s)}, not a date and time like 2023-11-16 18:15:46.6805900; fix or "
                        "drop that row") from None
    return dt


def _build(path: str, fmt: str, rows: list[_Row], err: _Where) -> Trace:
    if not rows:
        raise err(1, "the trace has no requests; give a file with at least one")
    t0 = rows[0][1]
    prev = rows[0]
    reqs: list[TraceRequest] = []
    for row in rows:
        line, t, raw, nin, nout, hashes = row
        if t < prev[1]:
            col = _CSV_COLUMNS[fmt][0] if fmt in _CSV_COLUMNS else "timestamp"
            raise err(line, f"time goes backwards: {col} {_show(raw)} comes after {_show(prev[2])} on line "
                            f"{prev[0]}; sort the trace by its timestamps")
        prev = row
        reqs.append(TraceRequest(t - t0, nin, nout, hashes))
    return Trace(path, fmt, tuple(reqs), lines=tuple(r[0] for r in rows))


def _read_session(d: Path, where: str | None) -> Trace:
    import polars as pl  # only sessions need it

    err = _Where(str(d), where)
    if not (d / "session.toml").is_file():
        raise err(None, "not a servescope session (no session.toml); give a session directory")
    req_dir = d / "requests"
    files = sorted(f for f in req_dir.glob("cell-*.parquet") if "-lost" not in f.name) if req_dir.is_dir() else []
    rows: list[_Row] = []
    offset = last = 0
    for f in files:
        ferr = _Where(str(f), where)
        try:
            df = pl.read_parquet(f)
        except (Exception, pl.exceptions.PanicException) as e:
            reason = error_text(e)[:160]
            raise ferr(None, f"cannot be read ({reason}); the file is damaged: restore it from a copy") from None
        missing = [c for c in _SESSION_COLUMNS if c not in df.columns]
        if missing:
            raise ferr(None, f"missing column {', '.join(missing)}; a session's request file has "
                             f"{', '.join(_SESSION_COLUMNS)}, this one has {', '.join(df.columns) or 'none'}")
        df = df.with_row_index("row", 1).filter(~pl.col("warmup")).sort("scheduled_ns", maintain_order=True)
        if df.height == 0:
            continue
        first = int(df["scheduled_ns"][0])
        if not rows or first >= last:
            offset = 0  # same clock as the cell before: keep the real gap
        else:
            offset = last - first  # another clock (a resumed run): start where the cell before ended
        for row, ns, nin, nout in df.select("row", "scheduled_ns", "input_tokens_requested",
                                            "output_tokens_requested").iter_rows():
            rows.append((len(rows) + 1, (ns + offset) / 1e9, ns, _int(nin, "input_tokens_requested", row, ferr, 1),
                         _int(nout, "output_tokens_requested", row, ferr, 0), ()))
        last = int(df["scheduled_ns"][-1]) + offset
    if not rows:
        raise err(None, "the session has no measured requests to replay; choose a session that finished a cell")
    return _build(str(d), "session", rows, err)


async def trace_prompts(trace: Trace, tok: Tokenizer, seed: int = 0, *, chat: bool = False,
                        concurrency: int = 8) -> list[Prompt]:
    """One prompt per request, `input_tokens` long as `tok` counts it (chat template included when `chat`).

    Each hash id of a request stands for `trace.block_tokens` tokens of text, the same text wherever the
    id appears, so requests sharing leading hash ids share byte-identical prompt prefixes. What the full
    blocks leave (the last, partial block, and room the template's own tokens take) is text of that request
    alone, as is the whole prompt of a request without hash ids. Where the blocks' text, joined, counts
    more tokens than the request has (a tokenizer merges pieces across block boundaries), the request
    shares one or two blocks less, so its length stays exact. Deterministic for (trace, seed)."""
    reqs = trace.requests
    if not reqs:
        return []
    count = tok.count_chat if chat else tok.count_prompt
    overhead = await count("")
    block = trace.block_tokens
    fulls = [min(len(r.hash_ids), max(0, r.input_tokens - overhead) // block) for r in reqs]
    ids: dict[int, int] = {}  # hash id -> its place among distinct ids, in order of first appearance
    for r, nf in zip(reqs, fulls, strict=True):
        for h in r.hash_ids[:nf]:
            ids.setdefault(h, len(ids))
    longest_tail = max(r.input_tokens - overhead - nf * block for r, nf in zip(reqs, fulls, strict=True))
    window = max(block if ids else 0, longest_tail) + 64
    rng = random.Random(f"servescope-trace:{seed}")
    starts = len(ids) + len(reqs)  # distinct start offsets: no two blocks or tails begin alike
    corpus = await _corpus_ids(tok, rng, starts + window)
    offsets = rng.sample(range(len(corpus) - window), starts)
    sem = asyncio.Semaphore(concurrency)

    def take(off: int, k: int) -> list[int]:
        w = corpus[off : off + k]
        while len(w) < k:  # wrap around the corpus
            w = w + corpus[: k - len(w)]
        return w

    async def block_text(h: int) -> str:
        async with sem:
            return (await tok.decode(take(offsets[ids[h]], block))).strip(" ")

    texts = dict(zip(ids, await asyncio.gather(*(block_text(h) for h in ids)), strict=True))

    async def fit(i: int, nf: int) -> tuple[str, int]:
        """The prompt of request i made of its first `nf` blocks and its own tail, closest to its length."""
        target = reqs[i].input_tokens
        prefix = "".join(texts[h] + " " for h in reqs[i].hash_ids[:nf])
        k, off = max(1, target - overhead - nf * block), offsets[len(ids) + i]
        best_text, best_count, tried = "", -1, set()
        for _ in range(12):
            text = prefix + ((await tok.decode(take(off, k))).strip(" ") if k > 0 else "")
            c = await count(text)
            if best_count < 0 or abs(c - target) < abs(best_count - target):
                best_text, best_count = text, c
            if c == target or not tok.exact or (k == 0 and c > target):
                break
            tried.add((off, k))
            k = max(0, k + (target - c))
            if (off, k) in tried:  # cutting there rounds the count up or down: try the next window
                off = (off + 1) % len(corpus)
        return best_text, best_count

    async def one(i: int) -> Prompt:
        async with sem:
            text, c = await fit(i, fulls[i])
            # the blocks' text alone counted more than the request's length: share one block less
            for nf in range(fulls[i] - 1, max(-1, fulls[i] - 3), -1):
                if c == reqs[i].input_tokens or not tok.exact:
                    break
                text, c = await fit(i, nf)
        return Prompt(text, c, reqs[i].output_tokens)

    return list(await asyncio.gather(*(one(i) for i in range(len(reqs)))))
