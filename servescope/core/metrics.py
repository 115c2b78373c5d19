"""Every metric servescope reports, defined once, computed with polars from raw request records.

Definitions (also in docs/metrics.md and in every report):
- ttft_ms: request sent -> first streamed chunk carrying a token (content or reasoning).
- ttfo_ms: request sent -> first chunk carrying content (differs from TTFT only in thinking mode).
- itl_ms: every gap between consecutive token-carrying chunks after the first, pooled over requests.
- itl_token_ms: the same gap divided by the tokens in the later chunk.
- tpot_ms: per request (e2e - ttft) / (output_tokens - 1); requests with one output token have none.
- e2e_ms: request sent -> end of stream.
- client_queue_ms: actual send - scheduled send (client-side queueing, coordinated omission).
- per_user_tok_s: output_tokens / e2e of that request.
- prefill_tok_s: prompt tokens / ttft of that request.
- output_tok_s (aggregate): successful output tokens of the cell / cell wall time; total_tok_s adds
  the input tokens; request_s: successful requests / wall time. Wall time runs from the first measured
  request's scheduled send to the last measured request's end.
- goodput_req_s: successful requests meeting every SLO / wall time.
- prefix_cache_hit_rate: cached prompt tokens / prompt tokens of successful requests, from the usage's
  `prompt_tokens_details.cached_tokens` where the server sends it, else the server's /metrics prefix-cache
  hits / queries over the cell (`prefix_cache_source` says which); per turn only from the usage.
- client health (core/health.py judge_client): bunched_share = the share of successful requests' token events
  after their first that carry the same perf_counter_ns stamp as the request's previous one (read in one
  piece: the client read late); send_late_p99_ms = client_queue_ms p99 of an uncapped open loop (requests
  sent again after a 429 left out: the server asked for that wait).
- rate limits: a request answered HTTP 429 is `rate_limited`, counted apart from ok and failed
  (requests_rate_limited) and measured in no latency figure. With --retry-after it is sent again after the
  server's Retry-After: TTFT, TPOT and E2E are then the served attempt's (from its own send), and the wait shows
  in client_queue_ms (actual send of the served attempt - scheduled send) and in retry_wait_s (all waits, s).
- multi-turn cells: per turn index, TTFT p50/p90 and mean input/output tokens; per complete conversation,
  duration_s (first turn sent -> last reply's end, think times included) and its turns' prompt/output tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import polars as pl

from servescope.core.records import RequestRecord
from servescope.core.results import (
    METRICS,
    STATS,
    CellResult,
    ConversationStats,
    Dist,
    ErrorCount,
    Mismatch,
    OutputCheck,
    TurnStat,
)

__all__ = ["DIST_METRICS", "client_figures", "FORMULAS", "HIGHER_IS_BETTER", "METRICS", "SLO_KEYS", "STAT_KEYS", "CellResult",
           "describe", "itl_frame", "meets_slos", "output_check", "per_conversation", "per_request", "per_turn",
           "records_frame", "request_figures", "slo_mask", "summarize"]

PERCENTILES = (50, 90, 95, 99)
STAT_KEYS = STATS
DIST_METRICS = ("ttft_ms", "ttfo_ms", "tpot_ms", "itl_ms", "itl_token_ms", "e2e_ms", "per_user_tok_s",
                "prefill_tok_s", "client_queue_ms")
SLO_KEYS = {"ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "itl_ms", "per_user_tok_s"}
# derived from the one METRICS table (core/results.py): SLOs that are lower bounds, and the formulas
HIGHER_IS_BETTER = {k for k in SLO_KEYS if METRICS[k].better == "higher"}
FORMULAS: dict[str, str] = {k: m.formula for k, m in METRICS.items() if m.formula}


REQUEST_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "index": pl.Int64, "user": pl.Int64, "warmup": pl.Boolean, "status": pl.Utf8, "http_status": pl.Int64,
    "error": pl.Utf8, "input_tokens_requested": pl.Int64, "output_tokens_requested": pl.Int64,
    "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "reasoning_tokens": pl.Int64,
    "usage_reported": pl.Boolean, "scheduled_ns": pl.Int64, "sent_ns": pl.Int64, "first_token_ns": pl.Int64,
    "first_content_ns": pl.Int64, "end_ns": pl.Int64, "chunk_ns": pl.List(pl.Int64),
    "chunk_tokens": pl.List(pl.Int64), "cached_tokens": pl.Int64, "conversation": pl.Int64, "turn": pl.Int64,
    "turns": pl.Int64, "server_prompt_ms": pl.Float64, "retry_after_s": pl.Float64, "retries": pl.Int64,
    "retry_wait_s": pl.Float64, "adapter": pl.Utf8,
}


def records_frame(records: Iterable[RequestRecord]) -> pl.DataFrame:
    """Raw records as columns. chunk_ns holds absolute perf_counter_ns stamps."""
    cols: dict[str, list[int | float | str | list[int] | None]] = {k: [] for k in REQUEST_SCHEMA}
    for r in records:
        cols["index"].append(r.index)
        cols["user"].append(r.user)
        cols["warmup"].append(r.warmup)
        cols["status"].append(r.status)
        cols["http_status"].append(r.http_status)
        cols["error"].append(r.error)
        cols["input_tokens_requested"].append(r.input_tokens_requested)
        cols["output_tokens_requested"].append(r.output_tokens_requested)
        cols["prompt_tokens"].append(r.prompt_tokens)
        cols["output_tokens"].append(r.output_tokens)
        cols["reasoning_tokens"].append(r.reasoning_tokens)
        cols["usage_reported"].append(r.usage_reported)
        cols["scheduled_ns"].append(r.scheduled_ns)
        cols["sent_ns"].append(r.sent_ns)
        cols["first_token_ns"].append(r.first_token_ns)
        cols["first_content_ns"].append(r.first_content_ns)
        cols["end_ns"].append(r.end_ns)
        cols["chunk_ns"].append(r.chunk_ns.tolist())
        cols["chunk_tokens"].append(r.chunk_tokens.tolist())
        cols["cached_tokens"].append(r.cached_tokens)
        cols["conversation"].append(r.conversation)
        cols["turn"].append(r.turn)
        cols["turns"].append(r.turns)
        cols["server_prompt_ms"].append(r.server_prompt_ms)
        cols["retry_after_s"].append(r.retry_after_s)
        cols["retries"].append(r.retries)
        cols["retry_wait_s"].append(r.retry_wait_s)
        cols["adapter"].append(r.adapter)
    return pl.DataFrame(cols, schema=REQUEST_SCHEMA)


def per_request(df: pl.DataFrame) -> pl.DataFrame:
    """Add the per-request metrics (nulls where a metric does not exist for that request)."""
    ok = pl.col("status") == "ok"
    has_tok = pl.col("first_token_ns") > 0
    ms = 1e-6
    ttft = pl.when(has_tok).then((pl.col("first_token_ns") - pl.col("sent_ns")) * ms)
    e2e = pl.when(pl.col("end_ns") > 0).then((pl.col("end_ns") - pl.col("sent_ns")) * ms)
    return df.with_columns(
        ttft_ms=ttft,
        ttfo_ms=pl.when(pl.col("first_content_ns") > 0).then((pl.col("first_content_ns") - pl.col("sent_ns")) * ms),
        e2e_ms=e2e,
        client_queue_ms=pl.when(pl.col("sent_ns") > 0).then((pl.col("sent_ns") - pl.col("scheduled_ns")) * ms),
    ).with_columns(
        tpot_ms=pl.when(ok & (pl.col("output_tokens") > 1) & has_tok).then(
            (pl.col("e2e_ms") - pl.col("ttft_ms")) / (pl.col("output_tokens") - 1)
        ),
        per_user_tok_s=pl.when(ok & (pl.col("e2e_ms") > 0)).then(pl.col("output_tokens") / (pl.col("e2e_ms") / 1000)),
        prefill_tok_s=pl.when(ok & (pl.col("ttft_ms") > 0) & (pl.col("prompt_tokens") > 0)).then(
            pl.col("prompt_tokens") / (pl.col("ttft_ms") / 1000)
        ),
    )


class RequestFigures(NamedTuple):
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    per_user_tok_s: float | None


def request_figures(r: RequestRecord) -> RequestFigures:
    """`per_request`'s TTFT, TPOT, E2E and per-user tok/s for one record, without a frame: the live batches
    of a running cell use it (a frame costs ~1.4 ms of planning per batch, this a few microseconds).
    tests/core/test_metrics.py holds the two to the same values on generated records."""
    ok = r.status == "ok"
    has_tok = r.first_token_ns > 0
    ttft = (r.first_token_ns - r.sent_ns) * 1e-6 if has_tok else None
    e2e = (r.end_ns - r.sent_ns) * 1e-6 if r.end_ns > 0 else None
    tpot = (e2e - ttft) / (r.output_tokens - 1) \
        if ok and r.output_tokens > 1 and ttft is not None and e2e is not None else None
    per_user = r.output_tokens / (e2e / 1000) if ok and e2e is not None and e2e > 0 else None
    return RequestFigures(ttft, tpot, e2e, per_user)


def itl_frame(df: pl.DataFrame) -> pl.DataFrame:
    """One row per inter-chunk gap of successful requests: itl_ms and itl_token_ms."""
    ok = df.filter(pl.col("status") == "ok").select("index", "chunk_ns", "chunk_tokens")
    if ok.height == 0:
        return pl.DataFrame({"itl_ms": [], "itl_token_ms": []}, schema={"itl_ms": pl.Float64, "itl_token_ms": pl.Float64})
    ex = ok.explode(["chunk_ns", "chunk_tokens"]).drop_nulls("chunk_ns")
    ex = ex.with_columns(gap=(pl.col("chunk_ns") - pl.col("chunk_ns").shift(1).over("index")) * 1e-6)
    ex = ex.drop_nulls("gap")
    return ex.select(itl_ms=pl.col("gap"), itl_token_ms=pl.col("gap") / pl.col("chunk_tokens").clip(lower_bound=1))


def bunched_share(df: pl.DataFrame) -> float | None:
    """Of the successful requests' token events after each one's first, the share stamped at exactly the same
    nanosecond as the request's previous event (they arrived in one read); None when there are none."""
    ok = df.filter(pl.col("status") == "ok").select("chunk_ns").with_row_index("row")
    if ok.height == 0:
        return None
    ex = ok.explode("chunk_ns").drop_nulls("chunk_ns")
    gap = (pl.col("chunk_ns") - pl.col("chunk_ns").shift(1)).over("row")
    gaps = ex.select(gap=gap).drop_nulls("gap")
    if gaps.height == 0:
        return None
    return float((gaps["gap"] == 0).sum()) / gaps.height


def client_figures(df: pl.DataFrame, open_loop: bool) -> dict[str, float | None]:
    """The two figures of the client's health that come from a cell's measured request rows: `bunched_share`
    and, for an uncapped open loop (`open_loop`), `send_late_p99_ms` (client_queue_ms p99 of the requests sent once:
    one sent again after a 429 waited as the server asked); a closed or capped loop's sends wait for a user or a
    slot by design, so it has none."""
    rows = df.filter(~pl.col("warmup"))
    late = None
    if open_loop:
        # a request sent again after a 429 (--retry-after) left late by the server's asking, not the client's lag
        sent_once = rows.filter(pl.col("retries") == 0) if "retries" in rows.columns else rows
        q = per_request(sent_once)["client_queue_ms"].drop_nulls()
        late = float(q.quantile(0.99, interpolation="linear")) if q.len() else None  # type: ignore[arg-type]
    return {"send_late_p99_ms": late, "bunched_share": bunched_share(rows)}


def describe(s: pl.Series) -> Dist:
    """A series' distribution (nulls left out): mean, std, min, max, linear-interpolated p50/p90/p95/p99, n."""
    s = s.drop_nulls()
    if s.len() == 0:
        return Dist(n=0)
    q = {f"p{p}": float(s.quantile(p / 100, interpolation="linear")) for p in PERCENTILES}  # type: ignore[arg-type]
    return Dist(mean=float(s.mean()), std=float(s.std()) if s.len() > 1 else 0.0,  # type: ignore[arg-type]
                min=float(s.min()), max=float(s.max()), n=s.len(), **q)  # type: ignore[arg-type]


def slo_mask(df: pl.DataFrame, slos: Mapping[str, float]) -> pl.Expr:
    expr = pl.col("status") == "ok"
    for k, v in slos.items():
        if k == "itl_ms":
            continue  # per-request ITL SLOs are checked through tpot; pooled ITL has no request
        if k in HIGHER_IS_BETTER:
            expr = expr & (pl.col(k).fill_null(0.0) >= v)
        else:
            expr = expr & (pl.col(k).fill_null(float("inf")) <= v)
    return expr


STAMP_FAULT = "impossible time stamps"  # the start of a damaged record's error text (summarize)


def stamp_fault() -> pl.Expr:
    """Why a row's perf_counter_ns stamps cannot be real (null when they can): a negative stamp, an ok request
    without an end, the end, the first token or the first content before the send, the first token after the
    end, the first content before the first token, or token stamps out of order. A stamp of 0 is one that was never
    taken (a request that never got so far)."""
    q, s, f, c, e = (pl.col(k) for k in ("scheduled_ns", "sent_ns", "first_token_ns", "first_content_ns", "end_ns"))
    chunks = pl.col("chunk_ns")
    gaps = chunks.list.eval(pl.element().diff().min()).list.first()  # the smallest gap (min skips the null)
    return (pl.when((pl.min_horizontal(q, s, f, c, e) < 0) | (chunks.list.min() < 0)).then(pl.lit("a negative stamp"))
            .when((pl.col("status") == "ok") & (e == 0)).then(pl.lit("an ok request without an end"))
            .when((s > 0) & (e > 0) & (e < s)).then(pl.lit("end before send"))
            .when((s > 0) & (f > 0) & (f < s)).then(pl.lit("first token before send"))
            .when((s > 0) & (c > 0) & (c < s)).then(pl.lit("first content before send"))
            .when((f > 0) & (e > 0) & (f > e)).then(pl.lit("first token after the end"))
            .when((c > 0) & (f > 0) & (c < f)).then(pl.lit("first content before the first token"))
            .when(gaps < 0).then(pl.lit("token stamps out of order"))
            .otherwise(pl.lit(None, dtype=pl.Utf8)))


def _flag_damaged(df: pl.DataFrame) -> pl.DataFrame:
    """Rows whose stamps cannot be real (`stamp_fault`) become failed requests saying why: they are counted and
    listed among the cell's errors, never measured (a negative end once made goodput 0 without a word). A
    request cancelled by a stop is left as it is: it never counts."""
    why = stamp_fault()
    bad = why.is_not_null() & (pl.col("status") != "cancelled")
    return df.with_columns(
        status=pl.when(bad).then(pl.lit("error")).otherwise(pl.col("status")),
        error=pl.when(bad).then(pl.format(STAMP_FAULT + " ({}): the request's record is damaged and counts as failed "
                                          "(run the cell again)", why)).otherwise(pl.col("error")),
        damaged=bad.fill_null(False),
    )


def _with_turn_columns(df: pl.DataFrame) -> pl.DataFrame:
    """Rows written before servescope measured conversations, cached tokens and rate limits: single-turn, cached
    unknown, never retried."""
    missing = {"cached_tokens": None, "conversation": -1, "turn": 0, "turns": 0, "retries": 0}
    df = df.with_columns(pl.lit(v, dtype=pl.Int64).alias(k) for k, v in missing.items() if k not in df.columns)
    floats = {"retry_after_s": None, "retry_wait_s": 0.0}
    return df.with_columns(pl.lit(v, dtype=pl.Float64).alias(k) for k, v in floats.items() if k not in df.columns)


class CacheFigures(NamedTuple):
    """Prompt tokens the server's prefix cache served, of the successful rows whose usage said so."""

    hit_rate: float | None
    cached: int
    uncached: int


def _cache_figures(rows: pl.DataFrame) -> CacheFigures | None:
    """None when no successful row's usage said how many prompt tokens were cached."""
    known = rows.filter(pl.col("cached_tokens").is_not_null() & (pl.col("prompt_tokens") >= 0))
    if known.height == 0:
        return None
    cached = int(known["cached_tokens"].sum() or 0)
    prompt = int(known["prompt_tokens"].sum() or 0)
    return CacheFigures(cached / prompt if prompt else None, cached, prompt - cached)


def _mean(s: pl.Series) -> float | None:
    s = s.drop_nulls()
    return float(s.mean()) if s.len() else None  # type: ignore[arg-type]


def per_turn(pr: pl.DataFrame) -> list[TurnStat]:
    """One entry per turn index of a multi-turn cell's requests (with per_request's columns): TTFT, input and
    output tokens, and what the prefix cache served (when the server's usage says)."""
    ok = pl.col("status") == "ok"
    known = ok & (pl.col("prompt_tokens") >= 0)
    cached = known & pl.col("cached_tokens").is_not_null()
    by = pr.filter(pl.col("turn") > 0).group_by("turn").agg(
        requests_ok=ok.sum(), requests_failed=(~ok).sum(),
        ttft_ms_p50=pl.col("ttft_ms").filter(ok).quantile(0.5, interpolation="linear"),
        ttft_ms_p90=pl.col("ttft_ms").filter(ok).quantile(0.9, interpolation="linear"),
        input_tokens_mean=pl.col("prompt_tokens").filter(known).mean(),
        output_tokens_mean=pl.col("output_tokens").filter(ok).cast(pl.Float64).mean(),
        cached_rows=cached.sum(), prompt_tokens_cached=pl.col("cached_tokens").filter(cached).sum(),
        prompt_of_cached=pl.col("prompt_tokens").filter(cached).sum(),
    ).sort("turn")
    out = []
    for row in by.to_dicts():
        if row.pop("cached_rows"):
            prompt = row.pop("prompt_of_cached")
            row["prefix_cache_hit_rate"] = row["prompt_tokens_cached"] / prompt if prompt else None
            row["prompt_tokens_uncached"] = prompt - row["prompt_tokens_cached"]
        else:
            row.pop("prompt_of_cached")
            row.update(prefix_cache_hit_rate=None, prompt_tokens_cached=None, prompt_tokens_uncached=None)
        out.append(TurnStat.from_dict(row))
    return out


def per_conversation(pr: pl.DataFrame) -> ConversationStats:
    """A multi-turn cell's conversations: how many started and completed (every turn it was to have ran and
    succeeded), and over the complete ones, the time from the first turn sent to the last reply's end (think
    times included) and the prompt and output tokens of all their turns."""
    rows = pr.filter(pl.col("conversation") >= 0)
    by = rows.group_by("conversation").agg(
        n=pl.len(), ok=(pl.col("status") == "ok").sum(), turns=pl.col("turns").max(),
        start_ns=pl.col("sent_ns").filter(pl.col("sent_ns") > 0).min(), end_ns=pl.col("end_ns").max(),
        input_tokens=pl.col("prompt_tokens").clip(lower_bound=0).sum(), output_tokens=pl.col("output_tokens").sum(),
    )
    done = by.filter((pl.col("ok") == pl.col("n")) & (pl.col("n") == pl.col("turns")))
    return ConversationStats(
        started=by.height, complete=done.height,
        turns_mean=_mean(done["n"].cast(pl.Float64)),
        duration_s=describe((done["end_ns"] - done["start_ns"]) / 1e9),
        input_tokens=describe(done["input_tokens"].cast(pl.Float64)),
        output_tokens=describe(done["output_tokens"].cast(pl.Float64)),
    )


USAGE_TOLERANCE = 0.10  # a request's usage this far from the tokens it streamed (and 2 tokens or more) differs


def output_check(ok: pl.DataFrame, ignore_eos: bool = False) -> OutputCheck | None:
    """Whether the output counts of a cell's successful requests (`ok`: per_request rows) hold up; None when they
    do. The server's usage.completion_tokens (what output tok/s, TPOT and per-user tok/s count) is compared with
    the tokens the client counted in the stream (`chunk_tokens`: one per token-carrying piece, or what the running
    usage said each piece added): apart by more than USAGE_TOLERANCE and 2 tokens, the request's usage and stream
    differ. A usage above the request's max_tokens cannot be true; with `ignore_eos` sent (and not refused) a
    request that ended before max_tokens was not served the length asked."""
    if ok.height == 0:
        return None
    rows = ok.select(
        said=pl.col("output_tokens"), asked=pl.col("output_tokens_requested"), reported=pl.col("usage_reported"),
        streamed=pl.col("chunk_tokens").list.sum().fill_null(0))
    reported = rows.filter(pl.col("reported") & (pl.col("streamed") > 0))  # (a record with no stamped piece: no
    # stream to compare, as an imported one)
    gap = (reported["said"] - reported["streamed"]).abs()
    differ = reported.filter(gap > pl.max_horizontal(pl.lit(2), USAGE_TOLERANCE * pl.col("streamed")))
    said, streamed = int(reported["said"].sum() or 0), int(reported["streamed"].sum() or 0)
    over = rows.filter((pl.col("asked") > 0) & (pl.col("said") > pl.col("asked")))
    short = rows.filter((pl.col("asked") > 0) & (pl.col("said") < pl.col("asked"))) if ignore_eos else rows.clear()
    n = rows.height
    notes: list[str] = []
    if differ.height:
        ratio = f"{said / streamed:.2f}x" if streamed else "more than"
        notes.append(f"usage.completion_tokens differs from the tokens streamed on {differ.height} of {n} requests: "
                     f"{said:,} said, {streamed:,} streamed ({ratio} what was streamed); output tok/s, TPOT and "
                     "per-user tok/s count the server's usage: check it")
    if over.height:
        notes.append(f"usage.completion_tokens is above max_tokens on {over.height} of {n} requests (up to "
                     f"{int(over['said'].max()):,} for {int(over['asked'].max()):,} asked): the server's usage "  # type: ignore[arg-type]
                     "overcounts, so output tok/s reads high")
    if short.height:
        notes.append(f"{short.height} of {n} requests ended before max_tokens although ignore_eos was sent (mean "
                     f"{float(short['said'].mean()):,.1f} of {float(short['asked'].mean()):,.1f} tokens): the server "  # type: ignore[arg-type]
                     "does not honour ignore_eos, so outputs are shorter than the workload asks")
    if not notes:
        return None
    return OutputCheck(requests=n, usage_vs_stream=differ.height, said=said, streamed=streamed,
                       over_max_tokens=over.height, short=short.height, notes=notes)


def summarize(
    df: pl.DataFrame,
    wall_s: float,
    slos: Mapping[str, float] | None = None,
    server_prefix_hit_rate: float | None = None,
    ignore_eos: bool = False,
) -> CellResult:
    """A cell's figures from its measured (non-warmup) request rows. The prefix cache's hit rate comes from the
    usage's cached tokens where the server sends them, else from `server_prefix_hit_rate` (its /metrics);
    `ignore_eos`: the requests asked the server for exactly max_tokens (`output_check`). The runner adds the
    server's, the telemetry's, the client's and the quality figures (msgspec.structs.replace)."""
    slos = dict(slos or {})
    df = _flag_damaged(_with_turn_columns(df.filter(~pl.col("warmup"))))
    pr = per_request(df)
    ok = pr.filter(pl.col("status") == "ok")
    itl = itl_frame(pr)
    n_ok = ok.height
    n_limited = int((pr["status"] == "rate_limited").sum())
    retries = int(pr["retries"].sum() or 0)
    after = pr["retry_after_s"].drop_nulls()
    out_tok = int(ok["output_tokens"].sum() or 0)
    in_tok = int(ok.filter(pl.col("prompt_tokens") >= 0)["prompt_tokens"].sum() or 0)
    wall = max(wall_s, 1e-9)
    good = pr.filter(slo_mask(pr, slos)).height if slos else n_ok
    known_prompt = ok.filter(pl.col("prompt_tokens") >= 0)
    req_in = ok["input_tokens_requested"]
    mismatch = None
    whole = known_prompt.filter(pl.col("turn") <= 1)  # a later turn's request is an estimate (its history's replies)
    if whole.height:
        diff = whole["prompt_tokens"] - whole["input_tokens_requested"]
        mismatch = Mismatch(mean=float(diff.mean()), max_abs=int(diff.abs().max()))  # type: ignore[arg-type]
    # one line per kind of error: messages that differ only in their numbers ("Used 7901, Requested 318", a
    # request id) count together, the first one standing for them
    errors = [
        ErrorCount(status=r["status"], error=r["error"], len=int(r["len"])) for r in
        pr.filter(pl.col("status") != "ok")
        .with_columns(kind=pl.col("error").str.replace_all(r"[0-9]+", "#"))
        .group_by("status", "kind", maintain_order=True).agg(pl.len().alias("len"), pl.col("error").first())
        .sort("len", descending=True, maintain_order=True).head(5).iter_rows(named=True)
    ]
    # of the requests that ran to an outcome: one cancelled by a stop never counts against the SLOs
    judged = pr.height - int((pr["status"] == "cancelled").sum())
    cache = _cache_figures(ok)
    hit_rate, hit_source = None, None
    if cache is not None and cache.hit_rate is not None:
        hit_rate, hit_source = cache.hit_rate, "usage"
    elif server_prefix_hit_rate is not None and math.isfinite(server_prefix_hit_rate):
        hit_rate, hit_source = server_prefix_hit_rate, "server_metrics"
    multi_turn = bool((pr["turn"] > 0).any())
    return CellResult(
        requests_ok=n_ok,
        requests_failed=pr.height - n_ok - n_limited,  # HTTP 429s are counted apart (the server's policy)
        requests_bad_usage=int((pr["status"] == "bad_usage").sum()),  # among the failed: usage not a count
        requests_rate_limited=n_limited,
        rate_limit_retries=retries or None,
        retry_wait_s=float(pr["retry_wait_s"].sum() or 0.0) if retries else None,
        retry_after_s_max=float(after.max()) if after.len() else None,  # type: ignore[arg-type]
        wall_s=wall_s,
        input_tokens_requested=float(req_in.mean()) if req_in.len() else None,  # type: ignore[arg-type]
        input_tokens_mean=float(known_prompt["prompt_tokens"].mean()) if known_prompt.height else None,  # type: ignore[arg-type]
        input_tokens_mismatch=mismatch,
        output_tokens_requested=float(ok["output_tokens_requested"].mean()) if n_ok else None,  # type: ignore[arg-type]
        output_tokens_mean=float(ok["output_tokens"].mean()) if n_ok else None,  # type: ignore[arg-type]
        reasoning_tokens_mean=float(ok["reasoning_tokens"].mean()) if n_ok else None,  # type: ignore[arg-type]
        output_tokens_total=out_tok,
        input_tokens_total=in_tok,
        request_s=n_ok / wall,
        output_tok_s=out_tok / wall,
        total_tok_s=(out_tok + in_tok) / wall,
        goodput_req_s=good / wall,
        slo_met_fraction=good / judged if judged else None,
        errors=errors,
        ttft_ms=describe(ok["ttft_ms"]),
        ttfo_ms=describe(ok["ttfo_ms"]),
        tpot_ms=describe(ok["tpot_ms"]),
        e2e_ms=describe(ok["e2e_ms"]),
        per_user_tok_s=describe(ok["per_user_tok_s"]),
        prefill_tok_s=describe(ok["prefill_tok_s"]),
        client_queue_ms=describe(pr.filter(~pl.col("damaged"))["client_queue_ms"]),
        itl_ms=describe(itl["itl_ms"]),
        itl_token_ms=describe(itl["itl_token_ms"]),
        prefix_cache_hit_rate=hit_rate,
        prefix_cache_source=hit_source,
        prompt_tokens_cached=cache.cached if cache is not None else None,
        prompt_tokens_uncached=cache.uncached if cache is not None else None,
        turns=per_turn(pr) if multi_turn else [],
        conversations=per_conversation(pr) if multi_turn else None,
        output_check=output_check(ok, ignore_eos),
    )


SLO_ATTAINMENT = 0.9


def meets_slos(summary: CellResult, attainment: float = SLO_ATTAINMENT) -> bool:
    """A cell meets the SLOs when at least `attainment` (90%) of its requests succeeded within all of them."""
    frac = summary.slo_met_fraction
    return frac is not None and frac >= attainment
