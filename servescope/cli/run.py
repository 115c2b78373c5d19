"""`servescope run`: the headless sweep. Prints a live progress line and a table per finished cell;
`--json` prints one JSON object at the end instead (tables then go to stderr)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

from servescope.cli.common import api_key_from, parse_tags
from servescope.core.errors import ServescopeError

JSON_STATS = ("mean", "p50", "p90", "p99")


def parse_duration(text: str, where: str = "duration") -> float:
    from servescope.sessions.sweepfile import parse_duration as pd

    return pd(text, where)


def parse_int_list(text: str, flag: str) -> list[int]:
    from servescope.sessions.sweepfile import parse_int_list as pil

    return pil(text, flag)


def parse_float_list(text: str, flag: str) -> list[float]:
    from servescope.sessions.sweepfile import parse_float_list as pfl

    return pfl(text, flag)




def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("SERVESCOPE_URL", "sim://"),
                   help="server base URL, e.g. http://127.0.0.1:8000, or sim://PROFILE for the built-in simulator "
                        "(default: sim://, the simulator's default profile)")
    p.add_argument("--model", help="served model name (default: the only one /v1/models lists)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
                   help="environment variable holding the API key (default OPENAI_API_KEY)")
    p.add_argument("--api-key", help="API key (prefer --api-key-env: flags show up in `ps`)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    p.add_argument("--sweep", metavar="FILE.toml",
                   help="run a whole sweep saved from the app (or written by hand: target or [server] launch, "
                        "workloads, load, SLOs, tags); --save, --sessions-dir, --json, --telemetry-interval, "
                        "--transport and the API-key flags still apply")
    p.add_argument("--workload", "-w", default="sharegpt",
                   help="preset name(s) or TOML file(s), comma-separated (see `servescope workloads`)")
    p.add_argument("--concurrency", "-c", help="closed-loop users per cell, e.g. 1,4,8,16 (default: the "
                                                "workload's own, else 1,4,16)")
    p.add_argument("--rate", help="open-loop request rates per second, e.g. 2,5 (instead of --concurrency)")
    p.add_argument("--arrival", choices=["constant", "poisson"], default="poisson",
                   help="open-loop arrivals (default poisson)")
    p.add_argument("--max-concurrency", type=int, help="cap on in-flight requests in open-loop cells")
    p.add_argument("--requests", "-n", type=int, help="measured requests per cell (default: the workload's own, "
                                                      "else 100; none when only --duration is given)")
    p.add_argument("--duration", help="stop issuing requests in a cell after this long, e.g. 60s")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first in each cell and not counted")
    p.add_argument("--slo", help="SLOs for goodput, e.g. ttft_ms=3000,tpot_ms=50")
    p.add_argument("--tag", action="append", default=[], help="KEY=VALUE label for the session, repeatable")
    p.add_argument("--save", help="session directory (default: a new one under the sessions directory)")
    p.add_argument("--sessions-dir", help="where sessions go (default $SERVESCOPE_HOME/sessions or the user data dir)")
    p.add_argument("--name", default="", help="session name")
    p.add_argument("--timeout", default="600s", help="per-request timeout (default 600s)")
    p.add_argument("--tokenizer", help="local Hugging Face tokenizer path, for servers without /tokenize")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="let the model stop early (output lengths then vary; default sends ignore_eos)")
    p.add_argument("--transport", choices=["aiohttp", "httpx"], default="aiohttp",
                   help="HTTP client for the load (default aiohttp: the least CPU per streamed token)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of tables")
    add_server_args(p)


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--launch", metavar='"vllm serve MODEL ..."',
                   help="start this server command (no shell) for the run, wait for /health, stop it at the end")
    g.add_argument("--launch-timeout", default="900s", help="how long a launched server may take to be healthy")
    g.add_argument("--server-variant", action="append", default=[], metavar='"--ARG VALUE ..."',
                   help="with --launch: run the whole sweep once per variant, relaunching the server with these "
                        "extra arguments (repeatable)")
    g.add_argument("--recover-timeout", default="300s",
                   help="when the server stops answering mid-cell, wait this long for it to come back (relaunching "
                        "it when servescope launched it), then re-run the lost cell (default 300s)")
    g.add_argument("--telemetry-interval", default="1s",
                   help="how often /metrics and the GPUs are sampled during a cell (default 1s); `off` samples only "
                        "at cell boundaries (each scrape costs a CPU-bound server a little: see Performance)")
    g.add_argument("--electricity-price", type=float, metavar="USD_PER_KWH",
                   help="electricity price, for cost per 1M output tokens (needs NVML)")




def _stats(d: dict[str, Any] | None) -> dict[str, Any]:
    d = d or {}
    return {k: d.get(k) for k in JSON_STATS}


def cell_json(cell: Any, summary: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    s = summary
    return {
        "index": cell.index,
        "workload": cell.workload.name,
        "concurrency": cell.load.concurrency,
        "rate": cell.load.rate,
        "status": status,
        "reason": reason,
        "requests_ok": s.get("requests_ok", 0),
        "requests_failed": s.get("requests_failed", 0),
        "wall_s": s.get("wall_s"),
        "input_tokens_requested": s.get("input_tokens_requested"),
        "input_tokens_mean": s.get("input_tokens_mean"),
        "output_tokens_requested": s.get("output_tokens_requested"),
        "output_tokens_mean": s.get("output_tokens_mean"),
        "reasoning_tokens_mean": s.get("reasoning_tokens_mean"),
        "request_s": s.get("request_s"),
        "output_tok_s": s.get("output_tok_s"),
        "total_tok_s": s.get("total_tok_s"),
        "goodput_req_s": s.get("goodput_req_s"),
        **{m: _stats(s.get(m)) for m in ("ttft_ms", "ttfo_ms", "tpot_ms", "itl_ms", "e2e_ms", "per_user_tok_s",
                                          "client_queue_ms")},
        "server": s.get("server"),
        "errors": s.get("errors", []),
    }


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def format_cell(ev: Any, total: int) -> str:
    from servescope.core.textsafe import clean_text

    c, s = ev.cell, ev.summary
    lines = [
        f"cell {c.index + 1}/{total}  {c.label}  [{ev.status}]  {s.get('requests_ok', 0)} ok, "
        f"{s.get('requests_failed', 0)} failed, wall {_f(s.get('wall_s'), 2)} s"
        + (f"  ({clean_text(ev.reason)})" if ev.reason else ""),
        f"  aggregate: output {_f(s.get('output_tok_s'))} tok/s, total {_f(s.get('total_tok_s'))} tok/s, "
        f"{_f(s.get('request_s'), 2)} req/s, goodput {_f(s.get('goodput_req_s'), 2)} req/s",
        f"  {'metric':<18}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    names = [("TTFT ms", "ttft_ms"), ("TTFO ms", "ttfo_ms"), ("TPOT ms", "tpot_ms"), ("ITL ms", "itl_ms"),
             ("E2E ms", "e2e_ms"), ("per-user tok/s", "per_user_tok_s"), ("prefill tok/s", "prefill_tok_s"),
             ("client queue ms", "client_queue_ms")]
    for label, key in names:
        d = s.get(key) or {}
        lines.append(f"  {label:<18}" + "".join(f"{_f(d.get(k), 2):>10}" for k in ("mean", "p50", "p90", "p99", "max")))
    mm = s.get("input_tokens_mismatch") or {}
    lines.append(
        f"  tokens: input requested {_f(s.get('input_tokens_requested'))}, measured {_f(s.get('input_tokens_mean'))}"
        f" (max mismatch {mm.get('max_abs', '-')}); output requested {_f(s.get('output_tokens_requested'))}, "
        f"measured {_f(s.get('output_tokens_mean'))}"
        + (f" (reasoning {_f(s.get('reasoning_tokens_mean'))})" if s.get("reasoning_tokens_mean") else "")
    )
    srv = s.get("server")
    if srv:
        lines.append(
            f"  server /metrics during the cell: {_f(srv.get('requests_success'), 0)} requests, "
            f"TTFT mean {_f(srv.get('ttft_ms_mean'), 2)} ms, ITL mean {_f(srv.get('itl_ms_mean'), 2)} ms, "
            f"preemptions {_f(srv.get('preemptions'), 0)}"
        )
    for e in s.get("errors", [])[:3]:
        lines.append(f"  errors: {e['len']} x {e['status']}: {clean_text(str(e['error']))[:160]}")
    return "\n".join(lines)


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
        self.out.write("\r\x1b[2K" + text[:200])
        self.out.flush()

    def clear(self) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K")
            self.out.flush()


def telemetry_interval(text: str) -> float | None:
    """--telemetry-interval: seconds, or None for `off` (sample only at cell boundaries)."""
    return None if text.strip().lower() in ("off", "0", "none") else parse_duration(text, "--telemetry-interval")


def build_plan(args: argparse.Namespace, url: str, label: str | None) -> Any:
    from servescope.core.metrics import parse_slos
    from servescope.sessions.runner import SweepPlan
    from servescope.workloads.spec import resolve

    workloads = resolve(args.workload)
    if args.server_variant and not args.launch:
        raise ServescopeError("--server-variant needs --launch: servescope can only relaunch a server it started")
    if args.launch and args.url not in ("sim://", os.environ.get("SERVESCOPE_URL", "sim://")):
        raise ServescopeError("give --launch or --url, not both: a launched server's URL comes from its command")
    if args.rate and args.concurrency:
        raise ServescopeError("give --concurrency (closed loop) or --rate (open loop), not both")
    if args.requests is not None and args.requests < 1:
        raise ServescopeError("--requests must be at least 1")
    if args.warmup < 0:
        raise ServescopeError("--warmup must be 0 or more")
    return SweepPlan(
        url=url,
        workloads=workloads,
        concurrency=parse_int_list(args.concurrency, "--concurrency") if args.concurrency else None,
        rates=parse_float_list(args.rate, "--rate") if args.rate else None,
        arrival=args.arrival,
        max_concurrency=args.max_concurrency,
        requests=args.requests,
        duration_s=parse_duration(args.duration, "--duration") if args.duration else None,
        warmup=args.warmup,
        slos=parse_slos(args.slo),
        tags=parse_tags(args.tag),
        model=args.model,
        api_key=api_key_from(args),
        timeout_s=parse_duration(args.timeout, "--timeout"),
        tokenizer=args.tokenizer,
        save_dir=Path(args.save) if args.save else None,
        sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None,
        name=args.name,
        ignore_eos=not args.no_ignore_eos,
        target_label=label,
        launch=args.launch,
        launch_timeout_s=parse_duration(args.launch_timeout, "--launch-timeout"),
        variants=list(args.server_variant),
        recover_timeout_s=parse_duration(args.recover_timeout, "--recover-timeout"),
        telemetry_interval_s=telemetry_interval(args.telemetry_interval),
        electricity_price=args.electricity_price,
        transport=args.transport,
    )


def open_target(url: str, stack: ExitStack, err: TextIO) -> tuple[str, str | None]:
    """sim://PROFILE starts the built-in simulator for the duration of the command."""
    if not url.startswith("sim://"):
        return url, None
    profile = url[len("sim://"):].strip("/") or "default"
    from servescope.sim.launcher import SimStartError, start_sim

    try:
        handle = start_sim(profile) if profile != "default" else start_sim_default()
    except SimStartError as e:
        raise ServescopeError(str(e)) from None
    stack.callback(handle.stop)
    print(f"started the simulator ({url}) at {handle.url}", file=err)
    return handle.url, url


def start_sim_default() -> Any:
    from servescope.sim.launcher import start_sim
    from servescope.sim.profile import DEFAULT_PROFILE

    return start_sim(DEFAULT_PROFILE)


def run_command(args: argparse.Namespace) -> int:
    out = sys.stdout
    table_out = sys.stderr if args.json else sys.stdout
    with ExitStack() as stack:
        if args.sweep:
            from servescope.sessions.sweepfile import load_sweep, plan_from_sweep

            d = load_sweep(args.sweep)
            plan = plan_from_sweep(d, "", None, api_key=None,
                                   sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None)
            _sweep_overrides(plan, args)
            plan.api_key = args.api_key or os.environ.get(str(d.get("api_key_env") or args.api_key_env)) or None
            if not plan.launch:
                plan.url, plan.target_label = open_target(str(d["url"]), stack, sys.stderr)
            return _run_loop(plan, out, table_out, args.json)
        plan = build_plan(args, "", None)  # every flag is checked before a simulator starts
        if not args.launch:
            plan.url, plan.target_label = open_target(args.url, stack, sys.stderr)
        return _run_loop(plan, out, table_out, args.json)


def _sweep_overrides(plan: Any, args: argparse.Namespace) -> None:
    """Flags that a sweep file does not hold apply on top of it (--save, the telemetry and HTTP settings);
    --launch, --server-variant, --url and the load flags are the file's to say and are refused with it."""
    given = [f for f, dest, default in (("--launch", "launch", None), ("--server-variant", "server_variant", []),
                                        ("--concurrency", "concurrency", None), ("--rate", "rate", None),
                                        ("--workload", "workload", "sharegpt"), ("--requests", "requests", None),
                                        ("--duration", "duration", None), ("--arrival", "arrival", "poisson"),
                                        ("--slo", "slo", None), ("--tag", "tag", []))
             if getattr(args, dest, default) not in (default, None, [])]
    if given:
        raise ServescopeError(f"{', '.join(given)} cannot be combined with --sweep: edit the sweep file instead "
                              "([load], [server], workloads)")
    plan.save_dir = Path(args.save) if args.save else None
    plan.tokenizer = args.tokenizer
    plan.ignore_eos = not args.no_ignore_eos
    plan.telemetry_interval_s = telemetry_interval(args.telemetry_interval)
    plan.electricity_price = args.electricity_price
    plan.transport = args.transport


def _run_loop(plan: Any, out: TextIO, table_out: TextIO, as_json: bool) -> int:
    from servescope.sessions.runner import (
        CellFinished,
        CellSkipped,
        CellStarted,
        Notice,
        RequestsDone,
        SweepControl,
        SweepFinished,
        SweepStarted,
        run_sweep,
    )

    control = SweepControl()
    progress = _Progress(sys.stderr)
    result: dict[str, Any] = {"session": None, "status": None, "cells": []}
    total = 0

    async def main() -> None:
        nonlocal total
        loop = asyncio.get_running_loop()
        presses = [0]

        def on_sigint() -> None:
            presses[0] += 1
            if presses[0] == 1:
                print("\nstopping: ending the current cell and saving (Ctrl-C again to abort)", file=sys.stderr)
                control.stop("stopped by Ctrl-C")
            else:
                raise KeyboardInterrupt

        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        except (NotImplementedError, RuntimeError):
            pass
        cur = None
        async for ev in run_sweep(plan, control):
            if isinstance(ev, SweepStarted):
                total = len(ev.cells)
                result["session"] = str(ev.session_dir)
                print(f"servescope: {ev.target.url} model {ev.model} (vLLM {ev.target.version or '?'}), "
                      f"{total} cells, tokenizer: {ev.tokenizer}; session {ev.session_dir}", file=table_out)
            elif isinstance(ev, CellStarted):
                cur = ev.cell
                progress.update(f"cell {ev.cell.index + 1}/{total} {ev.cell.label}: starting")
            elif isinstance(ev, RequestsDone):
                planned = ev.cell.requests or "?"
                progress.update(f"cell {ev.cell.index + 1}/{total} {ev.cell.label}: {ev.done}/{planned} done, "
                                f"{ev.failed} failed, {ev.elapsed_s:.1f} s")
            elif isinstance(ev, CellFinished):
                progress.clear()
                print(format_cell(ev, total), file=table_out, flush=True)
                result["cells"].append(cell_json(ev.cell, ev.summary, ev.status, ev.reason))
            elif isinstance(ev, CellSkipped):
                progress.clear()
                print(f"cell {ev.cell.index + 1}/{total}  {ev.cell.label}  [skipped] {ev.reason}", file=table_out)
                result["cells"].append({"index": ev.cell.index, "workload": ev.cell.workload.name,
                                        "concurrency": ev.cell.load.concurrency, "rate": ev.cell.load.rate,
                                        "status": "skipped", "reason": ev.reason})
            elif isinstance(ev, Notice):
                progress.clear()
                print(f"{ev.level}: {ev.text}", file=sys.stderr)
            elif isinstance(ev, SweepFinished):
                result["status"] = ev.status
                if ev.message:
                    result["message"] = ev.message
        del cur

    try:
        _run_async(main())
    except KeyboardInterrupt:
        progress.clear()
        print(f"aborted; finished cells are saved in {result['session']}", file=sys.stderr)
        return 130
    progress.clear()
    if as_json:
        out.write(json.dumps(result, default=str) + "\n")
    else:
        print(f"session saved: {result['session']} ({result['status']})", file=table_out)
    if result["status"] == "failed":
        if not result.get("message"):  # a message was already shown as an error notice
            print("error: the sweep failed", file=sys.stderr)
        return 1
    return 130 if result["status"] == "interrupted" else 0


def _run_async(coro: Any) -> Any:
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            return r.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _parser_for_demo(profile: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="servescope demo")
    add_run_args(p)
    url = f"sim://{profile}" if profile else "sim://"
    return p.parse_args(["--url", url, "--workload", "sharegpt", "--concurrency", "1,8,32", "--requests", "64",
                         "--duration", "10s", "--name", "demo"])


def add_resume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", help="session directory or id (see `servescope sessions`)")
    p.add_argument("--sessions-dir", help="where sessions are (default $SERVESCOPE_HOME/sessions or the user data dir)")
    p.add_argument("--url", help="the server's URL, when it moved since the session was recorded")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
                   help="environment variable holding the API key (default OPENAI_API_KEY)")
    p.add_argument("--api-key", help="API key")
    p.add_argument("--recover-timeout", default="300s", help="see `servescope run --help`")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of tables")


def resume_command(args: argparse.Namespace) -> int:
    """Continue an interrupted sweep from its first unfinished cell, in the same session directory."""
    from servescope.cli.common import resolve_session
    from servescope.sessions.runner import SweepPlan, plan_cells
    from servescope.workloads.spec import from_saved

    s = resolve_session(args.session, Path(args.sessions_dir) if args.sessions_dir else None)
    meta = s.meta
    if s.status == "completed":
        raise ServescopeError(f"{s.path} is already completed; nothing to resume")
    load = meta.get("load", {})
    server = meta.get("server", {})
    stored_url = str(args.url or meta.get("target", {}).get("url", ""))
    with ExitStack() as stack:
        launch = server.get("launch") if not args.url else None
        url, label = ("", None) if launch else open_target(stored_url, stack, sys.stderr)
        plan = SweepPlan(
            url=url,
            workloads=[from_saved(w) for w in meta.get("workloads", [])],
            concurrency=load.get("concurrency"),
            rates=load.get("rates"),
            arrival=load.get("arrival", "constant"),
            max_concurrency=load.get("max_concurrency"),
            requests=load.get("requests"),
            duration_s=load.get("duration_s"),
            warmup=int(load.get("warmup", 0)),
            slos=dict(meta.get("slos", {})),
            tags=dict(meta.get("tags", {})),
            model=meta.get("model"),
            api_key=api_key_from(args),
            timeout_s=float(load.get("timeout_s", 600)),
            ignore_eos=bool(load.get("ignore_eos", True)),
            target_label=label or (stored_url if stored_url.startswith("sim://") else None),
            launch=launch,
            variants=list(server.get("variants", [])),
            recover_timeout_s=parse_duration(args.recover_timeout, "--recover-timeout"),
            electricity_price=meta.get("electricity_usd_per_kwh"),
            resume=s.path,
            name=str(meta.get("name", "")),
        )
        if len(plan_cells(plan)) != len(meta.get("cells", [])):
            raise ServescopeError(f"{s.path}: its cells no longer match its workloads (a preset changed?); "
                                  "start a new run instead")
        todo = [c for c in meta.get("cells", []) if c.get("status") not in ("done", "skipped")]
        print(f"resuming {s.path}: {len(todo)} of {len(meta.get('cells', []))} cells left", file=sys.stderr)
        return _run_loop(plan, sys.stdout, sys.stderr if args.json else sys.stdout, args.json)
