"""What every importer shares: reading another tool's values with checks (one ServescopeError naming the file and
the key, before anything is written), rebuilding per-request records from a tool's timestamps (so servescope's own
formulas, core/metrics.py, compute every figure), and a cell's summary from a tool's aggregates where it kept no
per-request data.

A tool's times are seconds on its own clock (wall-clock epochs, perf_counter readings); a rebuilt record's stamps
are integer nanoseconds from the cell's first scheduled send (+1: a stamp of 0 means "never"), so the figures,
which are differences, are the tool's own to the nanosecond.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.core.metrics import DIST_METRICS, records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import STATS, CellResult
from servescope.core.textsafe import clean_text
from servescope.workloads.spec import DistTable, WorkloadTable

MAX_COUNT = 10**12  # tokens, requests: far beyond any real run, small enough for an Int64 column
MAX_SECONDS = 1e10  # a time on a tool's clock (an epoch in seconds is 1.8e9) or a duration
MAX_TOKENS = 10**9  # one request's tokens (int32 columns)
MAX_REQUESTS = 2_000_000  # per-request entries of one cell a file may hold
NS = 1_000_000_000


@dataclass
class ImportedCell:
    """One cell read from another tool's file: its load, its figures (rebuilt records, or the tool's aggregates)."""

    workload: WorkloadTable
    concurrency: int | None
    rate: float | None
    max_concurrency: int | None
    arrival: str | None
    summary: CellResult
    requests: pl.DataFrame | None  # None: the file holds aggregates only
    source: str  # the file it came from
    detailed: bool  # per-request records rebuilt
    reported: dict[str, float] = field(default_factory=dict)  # the tool's own headline figures for the cell
    model: str = ""
    extra: dict[str, str] = field(default_factory=dict)  # the file's other settings, as tags
    ramp_s: float | None = None
    warmup: int = 0
    label: str = ""  # the tool's name for the cell ("concurrent@4", "stage 2")

    @property
    def load_label(self) -> str:
        ramp = f", ramp {self.ramp_s:g}s" if self.ramp_s else ""
        if self.rate is not None:
            cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
            return f"rate {self.rate:g}/s {self.arrival}{cap}{ramp}"
        return f"c={self.concurrency}{ramp}"


@dataclass
class ReadResult:
    """What one tool's files gave: the cells and what the session's [source] table records about them."""

    tool: str
    cells: list[ImportedCell]
    tool_version: str | None = None
    harness: str | None = None
    format: str = ""
    token_basis: str = "unknown"
    tool_token_basis: str | None = None
    tokenizer: str | None = None
    warmup: str = "unknown"
    ramp: str = "unknown"
    streaming: bool | None = None
    ignore_eos: bool | None = None
    definitions: dict[str, str] = field(default_factory=dict)
    lacks: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dates: list[str] = field(default_factory=list)


# ---- reading values with checks -------------------------------------------------------------------------
def what(v: object) -> str:
    """A value as an error line quotes it (cut short)."""
    try:
        text = v if isinstance(v, str) else json.dumps(v, allow_nan=True, default=str)
    except (ValueError, RecursionError):
        text = type(v).__name__
    return clean_text(repr(text) if isinstance(v, str) else text)[:40]


class Values:
    """Checked reads of one file's values: each wrong one is a ServescopeError `FILE: KEY is V, expected ...; HINT`."""

    def __init__(self, where: str, hint: str) -> None:
        self.where = where
        self.hint = hint

    def bad(self, key: str, v: object, expected: str) -> ServescopeError:
        return ServescopeError(f"{self.where}: {clean_text(key)[:80]} is {what(v)}, expected {expected}; {self.hint}")

    def fail(self, text: str) -> ServescopeError:
        return ServescopeError(f"{self.where}: {text}; {self.hint}")

    def num(self, key: str, v: object, lo: float = 0.0, hi: float = MAX_SECONDS) -> float | None:
        """A finite number from lo to hi, or None for null/absent."""
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            raise self.bad(key, v, f"a finite number from {lo:g} to {hi:g} (or null)")
        return float(v)

    def need(self, key: str, v: object, lo: float = 0.0, hi: float = MAX_SECONDS) -> float:
        x = self.num(key, v, lo, hi)
        if x is None:
            raise self.bad(key, v, f"a number from {lo:g} to {hi:g}")
        return x

    def count(self, key: str, v: object, lo: int = 0, hi: int = MAX_COUNT) -> int | None:
        """A whole number from lo to hi (a float that is whole counts), or None for null/absent."""
        if v is None:
            return None
        if (isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)
                                                               and v.is_integer())) or not lo <= v <= hi):
            raise self.bad(key, v, f"a whole number from {lo} to {hi:,} (or null)")
        return int(v)

    def table(self, key: str, v: object) -> Mapping[str, object]:
        """A JSON object, or {} for null/absent."""
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise self.bad(key, v, "an object")
        return {str(k): x for k, x in v.items()}

    def items(self, key: str, v: object, limit: int = MAX_REQUESTS) -> list[object]:
        """A JSON array, or [] for null/absent."""
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.bad(key, v, "a list")
        if len(v) > limit:
            raise self.bad(key, f"{len(v):,} entries", f"at most {limit:,}")
        return v

    def text(self, key: str, v: object, limit: int = 200) -> str:
        """A short text ("" for null/absent); numbers are written as text."""
        if v is None:
            return ""
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return clean_text(str(v))[:limit]
        raise self.bad(key, v, "a text")

    def flag(self, key: str, v: object) -> bool | None:
        if v is None:
            return None
        if not isinstance(v, bool):
            raise self.bad(key, v, "true or false")
        return v


def read_json(path: Path) -> object:
    """A file's JSON (None when it is not JSON); a file that cannot be read is one line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ServescopeError(f"{path}: cannot read it ({clean_text(e.strerror or str(e))}); check the path") from None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


# ---- rebuilding records from a tool's stamps ------------------------------------------------------------
@dataclass
class Stamps:
    """One request as a tool recorded it: times in seconds on one clock (absolute: epochs or perf_counter), counts
    as it counted them. `chunks`: each token-carrying chunk's arrival, the first included, when the file kept them;
    else `last_token` and `n_chunks` spread the chunks evenly from the first token to the last."""

    start: float
    end: float | None = None
    first_token: float | None = None
    first_content: float | None = None
    scheduled: float | None = None
    chunks: Sequence[float] | None = None
    last_token: float | None = None
    n_chunks: int | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    input_requested: int | None = None
    output_requested: int | None = None
    usage: bool = False  # the counts are the server's usage
    cached_tokens: int | None = None
    error: str = ""


SLACK = 0.001  # a tool's stamps out of order by less than this (s): its clock's rounding, put in order


def records(stamps: Sequence[Stamps], v: Values, what_key: str = "requests") -> list[RequestRecord]:
    """The requests as servescope's records. A stamp before the one it must follow (the first token before the start,
    the end before the first token) by more than SLACK is the damaged-file ServescopeError; within it, it is put in
    order."""
    if not stamps:
        return []
    t0 = min(s.scheduled if s.scheduled is not None and s.scheduled <= s.start else s.start for s in stamps)

    def ns(x: float) -> int:
        return int(round((x - t0) * NS)) + 1

    def after(i: int, name: str, x: float | None, base: float) -> float | None:
        if x is None:
            return None
        if x < base - SLACK:
            raise v.fail(f"{what_key}[{i}]: its {name} ({x:.6f}) is before the time it must follow ({base:.6f})")
        return max(x, base)

    out: list[RequestRecord] = []
    for i, s in enumerate(stamps):
        sched = s.scheduled if s.scheduled is not None and s.scheduled <= s.start else s.start
        r = RequestRecord(index=i, user=-1, warmup=False, input_tokens_requested=s.input_requested or 0,
                          output_tokens_requested=s.output_requested or 0, scheduled_ns=ns(sched), sent_ns=ns(s.start))
        first = after(i, "first token", s.first_token if s.first_token is not None else
                      (s.chunks[0] if s.chunks else None), s.start)
        end = after(i, "end", s.end, first if first is not None else s.start)
        if s.error or first is None:
            r.status = "error"
            r.error = clean_text(s.error)[:500] or "failed (no tokens)"
            r.end_ns = ns(end if end is not None else s.start)
            out.append(r)
            continue
        times = _chunk_times(i, s, first, v, what_key)
        last = times[-1]
        end = max(end, last) if end is not None else last
        r.first_token_ns = ns(first)
        content = after(i, "first content token", s.first_content, s.start)
        r.first_content_ns = ns(content) if content is not None else r.first_token_ns
        stamps_ns = [ns(t) for t in times]
        r.chunk_ns = array("q", stamps_ns)
        r.chunk_tokens = array("i", spread(s.output_tokens, len(stamps_ns)))
        r.end_ns = ns(end)
        r.prompt_tokens = s.prompt_tokens if s.prompt_tokens is not None else -1
        r.output_tokens = s.output_tokens
        r.usage_reported = s.usage
        r.cached_tokens = s.cached_tokens
        out.append(r)
    return out


def _chunk_times(i: int, s: Stamps, first: float, v: Values, what_key: str) -> list[float]:
    if s.chunks:
        times = [first]
        for j, t in enumerate(s.chunks[1:], start=1):
            if t < times[-1] - SLACK:
                raise v.fail(f"{what_key}[{i}]: chunk {j} arrived ({t:.6f}) before chunk {j - 1} ({times[-1]:.6f})")
            times.append(max(t, times[-1]))
        return times
    n = s.n_chunks or 1
    last = s.last_token
    if last is not None and last < first - SLACK:
        raise v.fail(f"{what_key}[{i}]: its last token ({last:.6f}) is before its first ({first:.6f})")
    if last is None or last <= first:
        return [first]
    if n < 2:
        return [first, last]
    step = (last - first) / (n - 1)
    return [first + step * k for k in range(n - 1)] + [last]


def spread(tokens: int, chunks: int) -> list[int]:
    """`tokens` over `chunks` chunks, one each at least, the rest spread evenly after the first (a first chunk
    carries one token, as a streaming server sends it)."""
    per = [1] * chunks
    if chunks > 1 and tokens > chunks:
        q, rem = divmod(tokens - 1, chunks - 1)
        per = [1] + [q + (1 if j < rem else 0) for j in range(chunks - 1)]
    elif chunks == 1 and tokens > 1:
        per = [tokens]
    return per


def rebuilt_summary(recs: Sequence[RequestRecord]) -> tuple[pl.DataFrame, CellResult]:
    """The records as a requests frame and the cell's figures, each by servescope's formula; the wall time from
    the first scheduled send to the last end (as a servescope cell's)."""
    df = records_frame(recs)
    wall = 0.0
    if recs:
        wall = (max(r.end_ns for r in recs) - min(r.scheduled_ns for r in recs)) / NS
    return df, summarize(df, max(wall, 1e-9))


# ---- a cell from a tool's aggregates ---------------------------------------------------------------------
def aggregate_summary(*, ok: int, failed: int, wall_s: float | None, input_mean: float | None = None,
                      output_mean: float | None = None, input_total: float | None = None,
                      output_total: float | None = None, request_s: float | None = None,
                      output_tok_s: float | None = None, total_tok_s: float | None = None,
                      dists: Mapping[str, Mapping[str, float | None]] | None = None) -> CellResult:
    """A cell's summary from a tool's aggregates: what it did not say stays None (shown as missing, never 0)."""
    if input_mean is None and input_total is not None and ok:
        input_mean = input_total / ok
    if output_mean is None and output_total is not None and ok:
        output_mean = output_total / ok
    if output_total is None and output_mean is not None:
        output_total = output_mean * ok
    if input_total is None and input_mean is not None:
        input_total = input_mean * ok
    if total_tok_s is None and output_tok_s is not None and input_total is not None and output_total and wall_s:
        total_tok_s = (input_total + output_total) / wall_s
    s: dict[str, object] = {
        "requests_ok": ok, "requests_failed": failed, "wall_s": wall_s,
        "input_tokens_requested": None, "input_tokens_mean": input_mean, "input_tokens_mismatch": None,
        "output_tokens_requested": None, "output_tokens_mean": output_mean, "reasoning_tokens_mean": None,
        "output_tokens_total": int(round(output_total)) if output_total is not None else None,
        "input_tokens_total": int(round(input_total)) if input_total is not None else None,
        "request_s": request_s, "output_tok_s": output_tok_s, "total_tok_s": total_tok_s, "goodput_req_s": None,
        "slo_met_fraction": None, "errors": [],
    }
    for m in DIST_METRICS:
        got = dict((dists or {}).get(m) or {})
        s[m] = {k: got.get(k) for k in STATS}
    return CellResult.from_dict(s)


def dist_table(lens: Sequence[float]) -> DistTable:
    """A workload's length distribution from the lengths measured (whole tokens)."""
    got = [round(x) for x in lens if x is not None and x >= 0] or [0]
    lo, hi = min(got), max(got)
    return {"dist": "fixed", "value": lo} if lo == hi else {"dist": "uniform", "min": lo, "max": hi}


def workload(name: str, api: str, inputs: Sequence[float], outputs: Sequence[float], source: str) -> WorkloadTable:
    return {"name": name, "api": api, "input_tokens": dist_table(inputs), "output_tokens": dist_table(outputs),
            "prefix_tokens": 0, "dataset": "", "seed": 0, "source": source}


def mean_of(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


MAX_FILE_BYTES = 512 * 1024 * 1024  # an import file larger than this is refused (read whole into memory)


def read_yaml(path: Path) -> object:
    """A YAML file's data (safe types only; anchors and aliases refused: an alias bomb never expands); None when it
    is not YAML. Needs PyYAML, which servescope depends on."""
    import yaml

    class _NoAliases(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type information here
        def compose_node(self, parent: object, index: object) -> object:
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("YAML aliases are not accepted in an import file")
            return super().compose_node(parent, index)

    def _as_text(loader: _NoAliases, node: object) -> str:  # a date stays the text it was written as
        return str(loader.construct_scalar(node))

    _NoAliases.add_constructor("tag:yaml.org,2002:timestamp", _as_text)

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    except OSError as e:
        raise ServescopeError(f"{path}: cannot read it ({clean_text(e.strerror or str(e))}); check the path") from None
    try:
        return yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader, aliases refused
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
