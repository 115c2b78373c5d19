"""`servescope run`: the headless sweep. Prints a live progress line and a table per finished cell;
`--json` prints one JSON object at the end instead (tables then go to stderr)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TextIO, TypedDict, cast

from servescope.cli.common import api_key_from, check_writable_session, resolve_session
from servescope.cli.serving import serving_json, serving_lines
from servescope.core.errors import ServescopeError
from servescope.core.health import client_text
from servescope.core.jsontypes import Json, JsonObject
from servescope.core.load import cell_connections, ensure_open_files, open_file_room
from servescope.core.results import METRICS, CellCost, CellQuality, Dist, figure, rate_limit_line
from servescope.core.secrets import is_redacted
from servescope.core.textsafe import clean_text
from servescope.engine import fields
from servescope.engine.aio import run_loop
from servescope.engine.detached import discard_unstarted, start_runner, wait_started
from servescope.engine.measurefields import legacy_regime
from servescope.engine.plan import plan_cells
from servescope.engine.runner import (
    CellFinished,
    CellSkipped,
    CellStarted,
    KvBudgetKnown,
    Notice,
    RequestsDone,
    SweepControl,
    SweepFinished,
    SweepStarted,
    run_sweep,
)
from servescope.engine.serving import sim_serving_args
from servescope.engine.simtarget import sim_label, sim_profile, start_simulator
from servescope.engine.spec import RunContext, SweepSpec
from servescope.sessions import stats
from servescope.sessions.live import BUS_FILES, refuse_second_writer
from servescope.sessions.measurement import precision_text, probes_text
from servescope.sessions.store import load_session
from servescope.sessions.views import fmt_num

if TYPE_CHECKING:
    from servescope.core.results import CellResult

JSON_STATS = ("mean", "p50", "p90", "p99")


class CellRow(TypedDict, total=False):
    """One cell of `--json`: a skipped cell has the index, load, status and reason only; a measured (or
    predicted) one has `repeat`, the figures and the rest. Nested results are their struct's `to_dict()`."""

    index: Required[int]
    workload: Required[str]
    concurrency: Required[int | None]
    rate: Required[float | None]
    repeat: int
    status: Required[str]
    reason: Required[str]
    requests_ok: int
    requests_failed: int
    requests_bad_usage: int | None
    requests_rate_limited: int | None  # HTTP 429s, apart from ok and failed
    rate_limit_retries: int | None  # --retry-after: 429s sent again, and the seconds waited before them
    retry_wait_s: float | None
    retry_after_s_max: float | None
    input_lengths: str | None  # "calibrated" (no /tokenize), "estimated", or None: exact
    wall_s: float | None
    input_tokens_requested: float | None
    input_tokens_mean: float | None
    output_tokens_requested: float | None
    output_tokens_mean: float | None
    reasoning_tokens_mean: float | None
    request_s: float | None
    output_tok_s: float | None
    total_tok_s: float | None
    goodput_req_s: float | None
    cost: JsonObject  # --price / --gpu-hour: {"usd_per_1m_output_tokens", "usd_per_1m_total_tokens", "basis"}
    prefix_cache_hit_rate: float | None
    ttft_ms: dict[str, float | None]  # {JSON_STATS: value}
    ttfo_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    per_user_tok_s: dict[str, float | None]
    client_queue_ms: dict[str, float | None]
    server: JsonObject | None
    client: JsonObject | None
    errors: list[JsonObject]
    send_lateness_ms: dict[str, float | None]
    turns: list[JsonObject]
    conversations: JsonObject
    quality: JsonObject
    # how the cell was measured (engine/measure.py): its window, the whole cell's figures beside a steady window's,
    # the figures' 95% intervals, --precision's outcome, the saturation mark, --probe-rate's probes
    window: JsonObject
    whole: JsonObject
    intervals: dict[str, list[float | None]]  # figure -> [low, high]
    precision: JsonObject  # exactly {"target", "reached", "requests", "figure"}
    saturated: bool
    saturation: JsonObject
    probes: JsonObject
    # the serving figures (cli/serving.py ServingJson): spec_decode and adapters null without them, prefix_cache_reset
    # always, prefix_cache_target when the workload aims at a hit rate, startup for a launched server, energy with NVML
    spec_decode: dict[str, float | None] | None
    adapters: dict[str, JsonObject] | None
    prefix_cache_reset: bool
    lora_server: JsonObject
    prefix_cache_target: float
    startup: JsonObject
    energy: dict[str, float | None]


class Figure(TypedDict):
    """A point's figure over its repeats."""

    median: float
    ci: list[float] | None
    min: float
    max: float
    repeats: list[float]


class Point(TypedDict):
    workload: str
    concurrency: int | None
    rate: float | None
    repeats: int
    figures: dict[str, Figure | None]


class RunResult(TypedDict, total=False):
    """What `run --json` prints."""

    session: Required[str | None]
    status: Required[str | None]
    cells: Required[list[CellRow]]
    message: str
    points: list[Point]


def cell_json(cell: Any, s: CellResult, status: str, reason: str) -> CellRow:
    """One cell of `--json` (its shape is in docs/measuring.md: scripts rely on it)."""
    row: CellRow = {
        "index": cell.index,
        "workload": cell.workload.name,
        "concurrency": cell.load.concurrency,
        "rate": cell.load.rate,
        "repeat": getattr(cell, "repeat", 1),
        "status": status,
        "reason": reason,
    }
    add_figures(row, s)
    row["server"] = s.server.to_dict() if s.server is not None else None
    row["client"] = s.client.to_dict() if s.client is not None else None
    row["errors"] = [e.to_dict() for e in s.errors]
    if _is_trace(cell):
        row["send_lateness_ms"] = lateness(s)
    if s.turns:
        row["turns"] = [t.to_dict() for t in s.turns]
    if s.conversations is not None:
        row["conversations"] = s.conversations.to_dict()
    if s.quality is not None:
        row["quality"] = s.quality.to_dict()
    if s.cost is not None:
        row["cost"] = s.cost.to_dict()
    add_measurement(row, s)
    row.update(serving_json(s))  # type: ignore[typeddict-item]  # ServingJson's keys are CellRow's
    return row


def add_measurement(row: CellRow, s: CellResult) -> None:
    """How the cell was measured, in `--json`'s shape (docs/measuring.md): scripts rely on `precision`'s four keys
    and on `saturated`."""
    if s.window is not None:
        row["window"] = s.window.to_dict()
    if s.whole is not None:
        whole: CellRow = {"index": row["index"], "workload": row["workload"], "concurrency": row["concurrency"],
                          "rate": row["rate"], "status": row["status"], "reason": row["reason"]}
        add_figures(whole, s.whole)
        row["whole"] = {k: cast(Json, v) for k, v in whole.items()  # a CellRow's values are JSON's
                        if k not in ("index", "workload", "concurrency", "rate", "status", "reason")}
    if s.intervals:
        row["intervals"] = {iv.figure: [iv.low, iv.high] for iv in s.intervals}
    if s.precision is not None:
        p = s.precision
        row["precision"] = {"target": p.target, "reached": p.reached, "requests": p.requests, "figure": p.figure}
    if s.saturation is not None:
        row["saturated"] = s.saturation.saturated
        row["saturation"] = s.saturation.to_dict()
    if s.probes is not None:
        row["probes"] = s.probes.to_dict()


def add_figures(row: CellRow, s: CellResult) -> None:
    """The cell's figures, in `--json`'s order: its scalars, then each distribution's JSON_STATS."""
    def stats(d: Dist | None) -> dict[str, float | None]:
        return {k: (d or Dist()).stat(k) for k in JSON_STATS}

    row["requests_ok"], row["requests_failed"] = s.requests_ok, s.requests_failed
    row["requests_bad_usage"], row["wall_s"] = s.requests_bad_usage, s.wall_s
    row["requests_rate_limited"], row["rate_limit_retries"] = s.requests_rate_limited, s.rate_limit_retries
    row["retry_wait_s"], row["retry_after_s_max"] = s.retry_wait_s, s.retry_after_s_max
    row["input_lengths"] = s.input_lengths
    row["input_tokens_requested"], row["input_tokens_mean"] = s.input_tokens_requested, s.input_tokens_mean
    row["output_tokens_requested"], row["output_tokens_mean"] = s.output_tokens_requested, s.output_tokens_mean
    row["reasoning_tokens_mean"], row["request_s"] = s.reasoning_tokens_mean, s.request_s
    row["output_tok_s"], row["total_tok_s"] = s.output_tok_s, s.total_tok_s
    row["goodput_req_s"], row["prefix_cache_hit_rate"] = s.goodput_req_s, s.prefix_cache_hit_rate
    row["ttft_ms"], row["ttfo_ms"] = stats(s.dist("ttft_ms")), stats(s.dist("ttfo_ms"))
    row["tpot_ms"], row["itl_ms"] = stats(s.dist("tpot_ms")), stats(s.dist("itl_ms"))
    row["e2e_ms"], row["per_user_tok_s"] = stats(s.dist("e2e_ms")), stats(s.dist("per_user_tok_s"))
    row["client_queue_ms"] = stats(s.dist("client_queue_ms"))

LATE_MS = 10.0  # a trace cell whose sends were later than this at p99 did not replay the trace's times


def _is_trace(cell: Any) -> bool:
    """A trace replay cell (an engine Cell, or a viewer's CellInfo whose shape names the trace)."""
    w = getattr(cell, "workload", None)
    return getattr(w, "kind", None) == "trace" or str(getattr(cell, "shape", "")).startswith("trace ")


def lateness(s: Any) -> dict[str, float | None]:
    """How late each send was against the trace's time (p50, p99, max, ms): the cell's client queueing, which
    for an uncapped open loop is exactly the send's delay after its scheduled time."""
    d = s.dist("client_queue_ms") or Dist()
    return {"p50": d.stat("p50"), "p99": d.stat("p99"), "max": d.stat("max")}


POINT_FIGURES = tuple((f.key, f.label) for f in map(figure, ("output_tok_s", "request_s", "ttft_ms.p50", "tpot_ms.p50",
                                                              "e2e_ms.p50")))


def _figure(cell: CellRow, key: str) -> float | None:
    name, _, stat = key.partition(".")
    v: object = cell.get(name)
    v = v.get(stat) if stat and isinstance(v, dict) else v
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def points(cells: list[CellRow], session: str | None = None) -> list[Point]:
    """With --repeat: each point (workload, load level) over its repeats that were measured (status done):
    every figure's median, its 95% interval (from the session's requests: a hierarchical bootstrap, the
    repeats resampled, then the requests within each, as compare computes it), the lowest and highest repeat
    and the per-repeat values."""
    import statistics

    groups: dict[tuple[str, int | None, float | None], list[CellRow]] = {}
    for c in cells:
        if c.get("status") == "done":
            groups.setdefault((c["workload"], c["concurrency"], c["rate"]), []).append(c)
    out: list[Point] = []
    for (wl, conc, rate), cs in groups.items():
        cis = _intervals(session, [int(c["index"]) for c in cs], conc) if session else {}
        figs: dict[str, Figure | None] = {}
        for key, _ in POINT_FIGURES:
            vals = [v for v in (_figure(c, key) for c in cs) if v is not None]
            figs[key] = ({"median": statistics.median(vals), "ci": cis.get(key), "min": min(vals), "max": max(vals),
                          "repeats": vals} if vals else None)
        out.append({"workload": wl, "concurrency": conc, "rate": rate, "repeats": len(cs), "figures": figs})
    return out


def _intervals(session: str, indices: list[int], concurrency: int | None) -> dict[str, list[float]]:
    """95% bootstrap intervals of the point's figures from its repeats' requests (servescope.sessions.stats)."""
    try:
        s = load_session(session)
        frames = [f for i in indices if (f := stats.measured(s.requests(i))) is not None]
        boot = stats.bootstrap(frames, [k for k, _ in POINT_FIGURES], users=concurrency) if frames else None
    except Exception:  # noqa: BLE001 - an interval is a convenience: the medians stand without it
        return {}
    if boot is None:
        return {}
    out = {}
    for key, ratios in boot.ratios.items():
        obs = boot.observed.get(key)
        if obs is None or not ratios:
            continue
        r = sorted(ratios)
        lo, hi = r[int(0.025 * (len(r) - 1))], r[int(0.975 * (len(r) - 1))]
        out[key] = [obs * lo, obs * hi]
    return out


def format_points(pts: list[Point]) -> str:
    """The repeats' summary table: median of each point's repeats, and their range."""
    lines = ["points: the median of each point's repeats [95% interval: bootstrap over the repeats, then the requests "
             "within each] (lowest-highest repeat)"]
    for p in pts:
        load = f"c={p['concurrency']}" if p["concurrency"] is not None else f"rate {p['rate']:g}/s"
        parts = []
        for key, label in POINT_FIGURES:
            f = p["figures"].get(key)
            if f is not None:
                ci = f" [{_f(f['ci'][0], 2)}, {_f(f['ci'][1], 2)}]" if f["ci"] else ""
                parts.append(f"{label} {_f(f['median'], 2)}{ci} ({_f(f['min'], 2)}-{_f(f['max'], 2)})")
        lines.append(f"  {clean_text(str(p['workload']))} {load}, {p['repeats']} repeats: " + ", ".join(parts))
    return "\n".join(lines)


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


TABLE_DISTS = ("ttft_ms", "ttfo_ms", "tpot_ms", "itl_ms", "e2e_ms", "per_user_tok_s", "prefill_tok_s",
               "client_queue_ms")


def _label(key: str) -> str:
    m = METRICS[key]
    return m.label if not m.unit or m.unit in m.label else f"{m.label} {m.unit}"


def format_cell(ev: Any, total: int) -> str:
    c, s = ev.cell, ev.summary
    lines = [
        f"cell {c.index + 1}/{total}  {clean_text(c.label)}  [{ev.status}]  {s.requests_ok} ok, "
        f"{s.requests_failed} failed"
        + (f" ({s.requests_bad_usage} with bad usage)" if s.requests_bad_usage else "")
        + (f", {s.requests_rate_limited} rate-limited (HTTP 429)" if s.requests_rate_limited else "")
        + f", wall {_f((s.whole or s).wall_s, 2)} s"
        + (f"  ({clean_text(ev.reason)})" if ev.reason else ""),
        *([f"  {rate_limit_line(s)}"] if s.mostly_rate_limited else []),
        *measurement_lines(s),
        f"  aggregate: output {_f(s.output_tok_s)} tok/s, total {_f(s.total_tok_s)} tok/s, "
        f"{_f(s.request_s, 2)} req/s, goodput {_f(s.goodput_req_s, 2)} req/s",
        *([cost_line(s.cost)] if s.cost is not None else []),
        f"  {'metric':<18}" + "".join(f" {h:>11}" for h in ("mean", "p50", "p90", "p99", "max")),
    ]
    for key in TABLE_DISTS:
        d = s.dist(key) or Dist()
        # every column starts with a space: a value wider than its column (1,234,567.89) never runs into the next
        lines.append(f"  {_label(key):<18}" + "".join(f" {_f(d.stat(k), 2):>11}" for k in ("mean", "p50", "p90", "p99", "max")))
    mm = s.input_tokens_mismatch
    sized = f", {s.input_lengths} lengths: no /tokenize" if s.input_lengths else ""
    lines.append(
        f"  tokens: input requested {_f(s.input_tokens_requested)}, measured {_f(s.input_tokens_mean)}"
        f" (max mismatch {_f(mm.max_abs) if mm is not None else '-'}{sized}); output requested "
        f"{_f(s.output_tokens_requested)}, measured {_f(s.output_tokens_mean)}"
        + (f" (reasoning {_f(s.reasoning_tokens_mean)})" if s.reasoning_tokens_mean else "")
    )
    if s.rate_limit_retries:
        lines.append(f"  rate limits: {s.rate_limit_retries} HTTP 429s sent again (--retry-after) after waiting "
                     f"{_f(s.retry_wait_s, 1)} s in all; latencies are the served attempts', the waits are in "
                     "client queue")
    if s.client is not None:
        lines.append(f"  client: {client_text(s.client)}")
    srv = s.server
    if srv is not None:
        lines.append(
            f"  server /metrics during the cell: {_f(srv.requests_success, 0)} requests, "
            f"TTFT mean {_f(srv.ttft_ms_mean, 2)} ms, ITL mean {_f(srv.itl_ms_mean, 2)} ms, "
            f"preemptions {_f(srv.preemptions, 0)}"
        )
    if _is_trace(c):
        late = lateness(s)
        p99 = late["p99"]
        flag = (f"  FLAGGED: over {LATE_MS:g} ms at p99, the client did not keep the trace's times"
                if p99 is not None and p99 > LATE_MS else "")
        lines.append(f"  schedule fidelity: sends were late against the trace by p50 {_f(late['p50'], 2)} ms, p99 "
                     f"{_f(p99, 2)} ms, max {_f(late['max'], 2)} ms{flag}")
    if s.prefix_cache_hit_rate is not None:
        how = "the usage's cached_tokens" if s.prefix_cache_source == "usage" else "the server's /metrics"
        lines.append(f"  prefix cache: {s.prefix_cache_hit_rate * 100:.1f}% of prompt tokens were cached (from {how})")
    for t in s.turns[:12]:
        hit = f", cached {t.prefix_cache_hit_rate * 100:.0f}%" if t.prefix_cache_hit_rate is not None else ""
        lines.append(f"  turn {t.turn}: {t.requests_ok} ok, TTFT p50 {_f(t.ttft_ms_p50, 2)} ms, p90 "
                     f"{_f(t.ttft_ms_p90, 2)} ms, input {_f(t.input_tokens_mean)} tokens{hit}")
    cv = s.conversations
    if cv is not None:
        lines.append(f"  conversations: {cv.started} started, {cv.complete} complete (mean {_f(cv.turns_mean)} turns); "
                     f"complete ones took p50 {_f(cv.duration_s.p50, 2)} s, p90 {_f(cv.duration_s.p90, 2)} s")
    if s.quality is not None:
        lines.append(f"  quality under load: {quality_text(s.quality)}")
    if s.probes is not None:
        lines.append(f"  {probes_text(s.probes)}")
    lines.extend(serving_lines(s))
    for e in s.errors[:3]:
        lines.append(f"  errors: {e.len} x {e.status}: {clean_text(str(e.error))[:160]}")
    return "\n".join(lines)


def measurement_lines(s: CellResult) -> list[str]:
    """How the cell was measured, said in every table: its window (and the whole cell's figures beside a steady
    window's), its figures' 95% intervals, --precision's outcome and the saturation mark."""
    out = []
    w = s.window
    if w is not None and w.kind == "steady":
        whole = s.whole or s
        out.append(f"  window: steady, {_f(w.start_s, 1)}-{_f(w.end_s, 1)} s of the cell ({clean_text(w.basis)}"
                   f"): {w.requests} of {w.requests + w.ramp_requests + w.drain_requests} requests "
                   f"({w.ramp_requests} in the ramp, {w.drain_requests} in the drain left out)")
        out.append(f"  whole cell (ramp and drain in): output {_f(whole.output_tok_s)} tok/s, {_f(whole.request_s, 2)}"
                   f" req/s, goodput {_f(whole.goodput_req_s, 2)} req/s, TTFT p50 {_f(whole.ttft_ms.p50, 2)} ms")
    elif w is not None:
        out.append(f"  window: whole cell ({clean_text(w.basis)})")
    if s.intervals:
        parts = [f"{_interval_label(iv.figure)} {_f(iv.estimate, 2)} [{_f(iv.low, 2)}, {_f(iv.high, 2)}]"
                 for iv in s.intervals]
        k = max(iv.batches for iv in s.intervals)
        out.append(f"  95% intervals (batch means over {k} spans of time): " + ", ".join(parts))
    if s.precision is not None:
        out.append(f"  precision: {precision_text(s.precision)}")
    sat = s.saturation
    if sat is not None and sat.saturated:
        out.append(f"  {clean_text(sat.reason)}")
    return out


def _interval_label(figure: str) -> str:
    head, _, stat = figure.partition(".")
    return f"{_label(head)} {stat}".strip() if head in METRICS else figure


def cost_line(c: CellCost) -> str:
    """--price / --gpu-hour: the cell's cost, the figure and column name report and compare show
    ("cost $/1M out tok"), with what it is over and its basis."""
    return (f"  cost $/1M out tok: {fmt_num(c.usd_per_1m_output_tokens)} (${fmt_num(c.usd_per_1m_total_tokens)} per "
            f"1M tokens in all; {clean_text(c.basis)})")


def quality_text(q: CellQuality) -> str:
    """A cell's probe figures (--quality-share) in one line."""
    def percent(v: float | None) -> float:
        return v * 100 if v is not None else math.nan

    parts = []
    if q.n:
        tasks = ", ".join(f"{clean_text(k)} {t.correct}/{t.n}" for k, t in q.tasks.items())
        parts.append(f"accuracy {percent(q.accuracy):.0f}% of {q.n} probe questions ({tasks})")
    if q.positions:
        parts.append(f"vs the same prompts at idle: KL mean {q.kl_mean or 0:.3g} nats over {q.positions} positions, "
                     f"top-1 agreement {percent(q.top1_agreement):.0f}%, greedy output differs in "
                     f"{q.diverged or 0} of {q.prompts or 0} generations")
    if q.failed:
        parts.append(f"{q.failed} probe requests failed")
    return "; ".join(parts) or "no probe request finished"


class _Progress:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last = 0.0

    def update(self, text: str) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self.last < 0.2:
            return
        self.last = now
        self.out.write("\r\x1b[2K" + clean_text(text)[:200])  # names in it are data: no escape sequence
        self.out.flush()

    def clear(self) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K")
            self.out.flush()


def open_target(url: str, stack: ExitStack, err: TextIO, sim_args: Sequence[str] = ()) -> tuple[str, str | None]:
    """sim://PROFILE starts the built-in simulator for the duration of the command, with `sim_args` (the LoRA
    adapters the sweep's workloads name: engine/serving.py sim_serving_args): (the URL to talk to, the label the
    session stores, `sim://PROFILE`; None for any other URL)."""
    profile = sim_profile(url)
    if profile is None:
        return url, None
    handle = start_simulator(profile, sim_args)
    stack.callback(handle.stop)
    label = sim_label(profile)
    print(f"started the simulator ({label}) at {handle.url}", file=err)
    return str(handle.url), label


def run_command(args: argparse.Namespace) -> int:
    out = sys.stdout
    table_out = sys.stderr if args.json else sys.stdout
    base = SweepSpec.from_toml(args.sweep) if args.sweep else None
    spec = SweepSpec.from_args(args, base)  # every flag is checked before a simulator starts
    _refuse_redacted_launch(spec, "servescope run --sweep FILE --launch \"...\"")
    check_new_session(args.save)
    check_open_files(spec)  # before a simulator or a server starts
    ctx = RunContext(api_key=api_key_from(args, spec.api_key_env),
                     save_dir=Path(args.save) if args.save else None,
                     sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None)
    if getattr(args, "detach", False):
        if args.json:
            raise ServescopeError("--detach prints the session directory and returns; read its results later with "
                                  "`servescope report SESSION --format json` (drop --json)")
        return detach_command(spec, ctx, out)
    with ExitStack() as stack:
        if not spec.launch:
            url, label = open_target(spec.url, stack, sys.stderr, sim_serving_args(spec.workloads))
            ctx = replace(ctx, url=url, target_label=label)
        return run_loop_for(spec, ctx, out, table_out, args.json)


def detach_command(spec: Any, ctx: Any, out: TextIO) -> int:
    """`run --detach`: start the runner, wait (under 5 s) to see its sweep start or fail, print how to follow it
    and, on the last line, the session directory."""
    path, proc = start_runner(spec, ctx)
    err = wait_started(path, proc)
    if err:
        proc.wait(timeout=10)
        discard_unstarted(path)
        raise ServescopeError(f"the detached sweep failed to start: {err}")
    print(f"sweep running in the background (pid {proc.pid}); its output goes to {path / 'runner.log'}", file=out)
    print(f"  watch it:  servescope watch {path}", file=out)
    print(f"  open it:   servescope attach {path}", file=out)
    print(f"  stop it:   kill {proc.pid}   (finished cells stay saved; `servescope resume` continues)", file=out)
    print(path, file=out, flush=True)
    return 0


def check_new_session(save: str | None) -> None:
    """--save DIR of a new session, checked before a simulator or a server starts (the store found it only once the
    sweep began): a directory a live runner writes is refused as its lock refuses a second writer, and one that
    holds anything but a detached runner's files (a session, other files) as the store refuses it."""
    if not save:
        return
    p = Path(save).expanduser()
    refuse_second_writer(p)
    if p.is_dir() and any(x.name not in BUS_FILES for x in p.iterdir()):
        raise ServescopeError(f"{p} already exists and is not empty; choose another --save directory")


def check_open_files(spec: Any) -> None:
    """Every cell's connections must fit the open-file limit (raised up to the hard limit when needed, before
    any child process starts, so a simulator started for the run inherits it): else one line with the number
    that fits. An uncapped open loop only sizes its pool to what fits."""
    cells = plan_cells(spec)
    strict = [cell_connections(c.load, c.requests, c.warmup) for c in cells
              if c.load.rate is None or c.load.max_concurrency]
    loose = [cell_connections(c.load, c.requests, c.warmup) for c in cells
             if not (c.load.rate is None or c.load.max_concurrency)]
    if loose:
        open_file_room(max(loose))
    if strict:
        ensure_open_files(max(strict))


def _refuse_redacted_launch(spec: Any, how: str) -> None:
    """A launch command stored with its secrets as •••• (a session's) cannot run: one line saying how."""
    if spec.launch and is_redacted(spec.launch):
        raise ServescopeError(f"the launch command {clean_text(spec.launch)!r} was stored with its secrets replaced "
                              f"by •••• (servescope never stores them); give it in full: {how}")
    bad = [v for v in spec.variants if is_redacted(v)]
    if spec.launch and bad:
        raise ServescopeError(f"the server variant {clean_text(bad[0])!r} was stored with its secrets replaced by "
                              "•••• (servescope never stores them); start a new run with --launch and every "
                              "--server-variant in full")


def run_loop_for(spec: Any, ctx: Any, out: TextIO, table_out: TextIO, as_json: bool) -> int:
    control = SweepControl()
    progress = _Progress(sys.stderr)
    result: RunResult = {"session": None, "status": None, "cells": []}
    total = 0

    async def main() -> None:
        nonlocal total
        loop = asyncio.get_running_loop()
        presses = [0]

        def on_sigint() -> None:
            presses[0] += 1
            if presses[0] == 1:
                print("\nstopping: ending the current cell and saving (Ctrl-C again to abort)", file=sys.stderr)
                control.stop("stopped by Ctrl-C or SIGTERM")
            else:
                raise KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):  # `kill PID` stops a (detached) sweep as Ctrl-C does
            try:
                loop.add_signal_handler(sig, on_sigint)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        cur = None
        async for ev in run_sweep(spec, ctx, control):
            if isinstance(ev, SweepStarted):
                total = len(ev.cells)
                result["session"] = str(ev.session_dir)
                print(clean_text(f"servescope: {ev.target.url} model {ev.model} ({ev.target.engine_text}), "
                                 f"{total} cells, tokenizer: {ev.tokenizer}; session {ev.session_dir}"),
                      file=table_out)  # names from the server are data: no escape sequence reaches the terminal
            elif isinstance(ev, CellStarted):
                cur = ev.cell
                progress.update(f"cell {ev.cell.index + 1}/{total} {ev.cell.label}: starting")
            elif isinstance(ev, RequestsDone):
                planned = ev.cell.requests or "?"
                limited = f", {ev.rate_limited} rate-limited (HTTP 429)" if ev.rate_limited else ""
                progress.update(f"cell {ev.cell.index + 1}/{total} {ev.cell.label}: {ev.done}/{planned} done, "
                                f"{ev.failed} failed{limited}, {ev.elapsed_s:.1f} s")
            elif isinstance(ev, CellFinished):
                progress.clear()
                print(format_cell(ev, total), file=table_out, flush=True)
                result["cells"].append(cell_json(ev.cell, ev.summary, ev.status, ev.reason))
            elif isinstance(ev, CellSkipped):
                progress.clear()
                print(clean_text(f"cell {ev.cell.index + 1}/{total}  {ev.cell.label}  [skipped] {ev.reason}"),
                      file=table_out)
                result["cells"].append({"index": ev.cell.index, "workload": ev.cell.workload.name,
                                        "concurrency": ev.cell.load.concurrency, "rate": ev.cell.load.rate,
                                        "status": "skipped", "reason": ev.reason})
            elif isinstance(ev, (Notice, KvBudgetKnown)):
                progress.clear()
                print("\n".join(clean_text(x) for x in f"{ev.level}: {ev.text}".splitlines()), file=sys.stderr)
            elif isinstance(ev, SweepFinished):
                result["status"] = ev.status
                if ev.message:
                    result["message"] = ev.message
        del cur

    try:
        run_loop(main())
    except KeyboardInterrupt:
        progress.clear()
        print(f"aborted; finished cells are saved in {result['session']}", file=sys.stderr)
        return 130
    progress.clear()
    if int(getattr(spec, "repeat", 1)) > 1:
        result["points"] = points(result["cells"], result["session"])
        print(format_points(result["points"]), file=table_out)
    if as_json:
        out.write(json.dumps(result, default=str) + "\n")
    else:
        print(f"session saved: {result['session']} ({result['status']})", file=table_out)
    if result["status"] == "failed":
        if not result.get("message"):  # a message was already shown as an error notice
            print("error: the sweep failed", file=sys.stderr)
        return 1
    return 130 if result["status"] == "interrupted" else 0


def resume_command(args: argparse.Namespace) -> int:
    """Continue an interrupted sweep from its first unfinished cell, in the same session directory, with
    every setting it started with (its [sweep] table): tokenizer, transport and telemetry interval included."""
    # every flag is checked before the session is read; a flag given empty ("") is an error, as in run
    for flag, v in (("--api-key", args.api_key), ("--launch", args.launch), ("--api-key-env", args.api_key_env)):
        if v is not None:
            fields.nonempty_text(v, flag)
    url = fields.url(args.url, "--url") if args.url is not None else None
    recover = fields.duration(args.recover_timeout, "--recover-timeout") if args.recover_timeout is not None else None
    if args.launch is not None and url is not None:
        raise ServescopeError("give --launch or --url, not both: a launched server's URL comes from its command")
    s = resolve_session(args.session, Path(args.sessions_dir) if args.sessions_dir else None)
    if s.status == "completed":
        raise ServescopeError(f"{s.path} is already completed; nothing to resume")
    if s.status == "running":
        raise ServescopeError(f"{s.path} is still running (pid {s.runner.pid or '?'}); watch it with "
                              f"`servescope attach {s.path}` or `servescope watch {s.path}`")
    check_writable_session(s.path, "resume")
    sweep = s.info.sweep
    if sweep is None:
        raise ServescopeError(f"{s.path}: this session records no sweep (an import?); it cannot be resumed")
    if args.launch is not None:
        server = sweep["server"] if isinstance(sweep.get("server"), dict) else {}
        target = sweep["target"] if isinstance(sweep.get("target"), dict) else {}
        sweep = {**sweep, "server": {**server, "launch": args.launch.strip()},
                 "target": {k: v for k, v in target.items() if k != "url"}}
    spec = SweepSpec.from_table(legacy_regime(sweep), f"{s.path / 'session.toml'}: [sweep]", s.path)
    if recover is not None:
        spec = spec.replace(recover_timeout_s=recover)
    if args.api_key_env is not None:
        spec = spec.replace(api_key_env=args.api_key_env.strip())
    if url is not None:
        if spec.variants:
            raise ServescopeError(f"{s.path}: this sweep relaunches its server per variant; resume it without "
                                  "--url (servescope starts the server again)")
        spec = spec.replace(url=url, launch=None)
    _refuse_redacted_launch(spec, f"servescope resume {s.path} --launch \"...\"")
    check_open_files(spec)
    cells = s.info.cells
    if len(plan_cells(spec)) != len(cells):
        raise ServescopeError(f"{s.path}: its cells no longer match its workloads (a preset changed?); "
                              "start a new run instead")
    with ExitStack() as stack:
        ctx = RunContext(api_key=api_key_from(args, spec.api_key_env), resume=s.path)
        if not spec.launch:
            real, label = open_target(spec.url, stack, sys.stderr, sim_serving_args(spec.workloads))
            ctx = replace(ctx, url=real, target_label=label)
        todo = [c for c in cells if c.status not in ("done", "skipped")]
        print(f"resuming {s.path}: {len(todo)} of {len(cells)} cells left", file=sys.stderr)
        return run_loop_for(spec, ctx, sys.stdout, sys.stderr if args.json else sys.stdout, args.json)
