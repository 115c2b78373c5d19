"""`servescope twin fit SESSION` and `servescope whatif SESSION ...`: the capacity twin from the command line
(servescope/engine/twin.py fits and predicts, servescope/engine/whatif.py answers capacity and confirms)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypedDict

from servescope.cli.common import api_key_from, check_writable_session, resolve_session
from servescope.cli.run import CellRow, add_figures, open_target, run_loop_for
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine import fields as f
from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.twin import Twin, fit, fit_time_estimate, load_twin, measured_cells, save_fit, twin_dir
from servescope.engine.twinpredict import BAND_NOTE, Load, predict, requests_for, session_workloads
from servescope.engine.twinshape import NOMINAL_GPU, Knobs, apply_knobs, session_shape
from servescope.engine.whatif import (
    USABLE_SLOS,
    capacity_row,
    capacity_tasks,
    confirm_pairs,
    confirm_seed,
    record_confirmation,
)
from servescope.engine.whatifcap import check_whatif_loads
from servescope.sessions.twin import PROFILE_FILE
from servescope.sim.profile import KV_DTYPE_BYTES
from servescope.workloads.spec import resolve

if TYPE_CHECKING:
    from servescope.engine.whatif import CapacityRow, ConfirmPair


class PredictedRow(CellRow, total=False):
    """A cell of `whatif --json`: run's row of the predicted figures, their bands and, with --confirm, what the
    real run measured and the relative error of each figure."""

    band: dict[str, list[float]]
    extrapolated: bool
    measured: object  # engine.whatif.confirm_pairs' "measured" and "error"
    error: object


class WhatIfResult(TypedDict, total=False):
    session: Required[str]
    settings: Required[str]
    cells: Required[list[PredictedRow]]
    slos: dict[str, float]
    capacity: dict[str, CapacityRow]  # written as each row's to_dict()
    confirm: Confirmation


class Confirmation(TypedDict):
    sessions: list[object]  # each confirming run's session directory, as its --json said
    pairs: list[ConfirmPair]  # engine.whatif.confirm_pairs' rows


def _session(ref: str, sessions_dir: str | None) -> Any:
    return resolve_session(ref, Path(sessions_dir) if sessions_dir else None)


def _check_fit_args(args: argparse.Namespace) -> None:
    """The fit's own flags, checked before the session is read."""
    for flag, v in (("--server-max-num-seqs", args.fit_max_num_seqs),
                    ("--server-max-num-batched-tokens", args.fit_max_num_batched_tokens)):
        if v is not None and v < 1:
            raise ServescopeError(f"{flag} {v}: must be 1 or more")
    if args.model_config is not None:
        cfg = Path(args.model_config).expanduser()
        if not (cfg.is_file() or (cfg / "config.json").is_file()):
            raise ServescopeError(f"--model-config {args.model_config}: no such file, nor a directory holding "
                                  "config.json; give the model's Hugging Face config.json")


def _fit(session: Any, args: argparse.Namespace, err: Any, check: Callable[[Twin], None] | None = None) -> Any:
    """Fit the session's twin and store it. What the fit starts from is read before the line saying it fits: a
    session with nothing to fit or an unreadable config.json is one line, never a "fitting ..." line and then the
    error; so is what `check` refuses of the twin to be (its server's limits and memory come from the session, the
    fit sets only its efficiencies)."""
    _check_fit_args(args)
    shape = session_shape(session, Path(args.model_config).expanduser() if args.model_config else None,
                          args.fit_max_num_seqs, args.fit_max_num_batched_tokens)
    cells = measured_cells(session)
    if check is not None:
        check(Twin(shape.profile, {}, {}, shape.profile.gpu.name != NOMINAL_GPU.name))
    print(f"fitting the twin to {session.path} ({fit_time_estimate(session)}) ...", file=err, flush=True)
    r = fit(shape, cells, progress=lambda s: print(f"  {s}", file=err, flush=True))
    save_fit(session, r)
    for w in r.warnings:
        print(f"warning: {clean_text(w)}", file=err)
    return r


def fit_text(r: Any, path: Path) -> str:
    e = r.profile.efficiency
    lines = [f"twin fitted: {path}",
             f"  shape: {clean_text(r.shape.source)}",
             f"  KV cache: {clean_text(r.shape.kv_source)}; limits: {clean_text(r.shape.limits_source)}",
             f"  fitted ({r.evaluations} virtual runs): bandwidth_eff {e.bandwidth_eff:.3g}, gemm_eff {e.gemm_eff:.3g}, "
             f"gemm_half_rows {e.gemm_half_rows:.3g}, attention_eff {e.attention_eff:.3g}"
             f"{'' if 'attention_eff' in r.free else ' (tied to gemm_eff: one prompt length measured)'},",
             f"    step_overhead {e.step_overhead_ms:.3g} ms, host_overhead {e.host_overhead_ms:.3g} ms, per_seq "
             f"{e.per_seq_overhead_us:.3g} us, frontend {e.frontend_ms:.3g} ms; host and device time "
             f"{'overlap (async scheduling)' if e.async_scheduling else 'add up (no async scheduling)'}"
             f"{'' if r.shape.async_known else ', the closer of both fits'}",
             f"  {'cell':<24}  {'figure':<19} {'measured':>10} {'twin':>9}   error"]
    for c in r.cells:
        for key in ("output_tok_s", "ttft_ms.p50", "tpot_ms.p50", "server.ttft_ms_mean"):
            if key in c:
                m, s = c[key]
                lines.append(f"  {clean_text(c['label'])[:24]:<24}  {key:<19} {m:>10.4g} {s:>9.4g}  {s / m - 1:+6.1%}")
    res = ", ".join(f"{k} {v:.1%}" for k, v in r.residuals.items())
    lines.append(f"  residual (root mean square of ln(twin / measured)): {res}")
    rng = r.data_range
    lines.append("  measured range: " + ", ".join(f"{k} {v[0]:g}-{v[1]:g}" for k, v in rng.items()))
    return "\n".join(lines)


def twin_command(args: argparse.Namespace) -> int:
    if args.twin_command != "fit":
        raise ServescopeError("usage: servescope twin fit SESSION (see `servescope twin fit --help`)")
    _check_fit_args(args)
    session = _session(args.session, args.sessions_dir)
    check_writable_session(session.path, "twin fit")  # its profile goes in SESSION/twin/
    r = _fit(session, args, sys.stderr)
    path = twin_dir(session) / PROFILE_FILE
    if args.json:
        print(json.dumps({"session": str(session.path), "profile": str(path), "fitted": r.free,
                          "efficiency": {k: getattr(r.profile.efficiency, k) for k in (*r.free, "attention_eff")},
                          "residual_rms_ln": r.residuals, "range": r.data_range, "cells": r.cells,
                          "shape_from": r.shape.source, "warnings": r.warnings}))
    else:
        print(fit_text(r, path))
    return 0


def _workloads(args: argparse.Namespace, session: Any) -> list[Any]:
    if args.workload:
        return resolve(args.workload)
    if args.capacity:
        return capacity_tasks()
    ws = session_workloads(session)
    if not ws:
        raise ServescopeError("the session's workloads are all conversations, agents, traces or datasets; name one "
                              "with --workload (a preset or a TOML file)")
    return ws


def _loads(args: argparse.Namespace, session: Any) -> list[Any]:
    if args.concurrency and args.rate:
        raise ServescopeError("give --concurrency or --rate, not both")
    if args.concurrency:
        return [Load(concurrency=c) for c in f.int_list(args.concurrency, "--concurrency") or ()]
    if args.rate:
        return [Load(rate=r) for r in f.float_list(args.rate, "--rate") or ()]
    planned = session.info.cells  # the loads the session planned, in their order
    conc = sorted({c.concurrency for c in planned if c.concurrency is not None})
    if conc:
        return [Load(concurrency=c) for c in conc]
    rates = sorted({c.rate for c in planned if c.rate is not None})
    if rates:
        return [Load(rate=r) for r in rates]
    return [Load(concurrency=c) for c in (1, 4, 16)]


def _num(v: Any, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _banded(v: Any, band: dict[str, list[float]], key: str) -> str:
    lo, hi = band.get(key, [None, None])
    return f"{_num(v):>9} ({_num(lo)}-{_num(hi)})"


def _check_whatif_args(args: argparse.Namespace) -> dict[str, float] | None:
    """Every what-if flag checked before anything is read, fitted or run (a bad --gpu-memory-utilization was
    found only after a fit); returns the --slo SLOs, read by the one SLO parser every command uses."""
    for flag, v, lo in (("--requests", args.requests, 1), ("--max-model-len", args.max_model_len, 16),
                        ("--max-num-seqs", args.max_num_seqs, 1),
                        ("--server-max-num-seqs", args.fit_max_num_seqs, 1),
                        ("--server-max-num-batched-tokens", args.fit_max_num_batched_tokens, 1)):
        if v is not None and v < lo:
            raise ServescopeError(f"{flag} {v}: must be {lo} or more")
    gmu = args.gpu_memory_utilization
    if gmu is not None and not 0 < gmu <= 1:
        raise ServescopeError(f"--gpu-memory-utilization {gmu:g}: must be above 0 and at most 1, as vLLM's flag "
                              "(e.g. 0.9)")
    if args.kv_cache_dtype is not None and args.kv_cache_dtype not in KV_DTYPE_BYTES:
        raise ServescopeError(f"--kv-cache-dtype {args.kv_cache_dtype!r}: unknown; use one of "
                              f"{', '.join(sorted(KV_DTYPE_BYTES))}")
    _check_fit_args(args)
    for flag, v in (("--workload", args.workload), ("--concurrency", args.concurrency), ("--rate", args.rate),
                    ("--api-key", args.api_key)):
        if v is not None and not v.strip():
            raise ServescopeError(f"{flag}: empty; give a value (or leave the flag out for its default)")
    if args.concurrency is not None:
        f.int_list(args.concurrency, "--concurrency")
    if args.rate is not None:
        f.float_list(args.rate, "--rate")
    return f.slos(args.slo, "--slo") if args.slo is not None else None


def whatif_command(args: argparse.Namespace) -> int:
    given_slos = _check_whatif_args(args)
    session = _session(args.session, args.sessions_dir)
    knobs = Knobs(args.gpu_memory_utilization, args.kv_cache_dtype, args.max_model_len, args.max_num_seqs)
    if args.confirm and knobs.any:
        raise ServescopeError(f"--confirm runs against the session's server as it is; it cannot confirm "
                              f"{knobs.label()}: relaunch the server with those settings and run `servescope run`")
    workloads = _workloads(args, session)
    loads = _loads(args, session)
    slos = given_slos or dict(session.info.slos) or dict(USABLE_SLOS)
    def check(t: Twin) -> None:
        apply_knobs(t.profile, knobs, t.memory_known)  # a --gpu-memory-utilization that leaves no KV cache...
        check_whatif_loads(t, loads, knobs)  # at most 2 x the twin's max_num_seqs (engine/whatifcap.py)

    twin = None if args.refit else load_twin(session)
    if twin is None:
        _fit(session, args, sys.stderr, check)
        twin = load_twin(session)
    assert twin is not None
    check(twin)
    out: WhatIfResult = {"session": str(session.path), "settings": knobs.label(), "cells": []}
    preds = []
    for w in workloads:
        if args.capacity and not args.concurrency and not args.rate:
            continue
        preds += predict(twin, w, loads, knobs, args.requests, slos)
    for i, p in enumerate(preds):
        cell: PredictedRow = {"index": i, "workload": p.workload, "concurrency": p.load.concurrency,
                              "rate": p.load.rate, "repeat": 1, "status": "predicted", "reason": "; ".join(p.why)}
        add_figures(cell, p.summary)
        cell["server"], cell["client"], cell["errors"] = None, None, []
        cell["band"], cell["extrapolated"] = p.band, p.extrapolated
        out["cells"].append(cell)
    if args.capacity:
        out["slos"] = slos
        out["capacity"] = {}
        for w in workloads:
            print(f"capacity of {w.name} ...", file=sys.stderr, flush=True)
            out["capacity"][w.name] = capacity_row(twin, w, slos, knobs)
    if args.confirm and preds:
        _confirm(args, session, preds, out, knobs)
    if args.json:
        doc = dict(out)
        if "capacity" in out:
            doc["capacity"] = {k: r.to_dict() for k, r in out["capacity"].items()}
        print(json.dumps(doc, default=str))
        return 0
    print(f"what if ({clean_text(knobs.label())}), predicted by the twin of {session.path}:")
    if preds:
        print("  workload              load      output tok/s (band)        TTFT p50 ms (band)      TPOT p50 ms (band)")
        for p, c in zip(preds, out["cells"], strict=True):
            print(f"  {clean_text(p.workload)[:20]:<20}  {p.load.label:<8} "
                  f"{_banded(c['output_tok_s'], p.band, 'output_tok_s'):<26} "
                  f"{_banded(c['ttft_ms']['p50'], p.band, 'ttft_ms'):<23} {_banded(c['tpot_ms']['p50'], p.band, 'tpot_ms')}"
                  f"{'  extrapolated: ' + clean_text('; '.join(p.why)) if p.extrapolated else ''}")
        print(f"  bands: {BAND_NOTE}")
    if args.capacity:
        slo_text = ", ".join(f"{k} {'>=' if k == 'per_user_tok_s' else '<='} {v:g}" for k, v in slos.items())
        print(f"capacity at the SLOs ({slo_text}; >= 90% of requests), predicted:")
        print("  task                        capacity         knee          at capacity")
        for name, row in out["capacity"].items():
            cap = ("no answer: " + clean_text(row.reason) if row.reason else
                   "none (c=1 misses)" if row.capacity is None else
                   f"c={row.capacity}{'+ (not reached)' if row.not_reached else ''}")
            kn = "-" if row.knee is None else f"c={row.knee}{'+' if row.knee_not_reached else ''}"
            at = row.at_capacity
            detail = (f"{_num(at.get('output_tok_s'), 0)} tok/s, TTFT p50 {_num(at.get('ttft_ms_p50'), 0)} ms, "
                      f"{_num(at.get('per_user_tok_s_mean'))} tok/s per user") if at else ""
            print(f"  {clean_text(name)[:26]:<26}  {cap:<16} {kn:<12}  {detail}")
    if "confirm" in out:
        _print_confirm(out["confirm"])
    return 0


def _confirm(args: argparse.Namespace, session: Any, preds: list[Any], out: WhatIfResult, knobs: Any) -> None:
    """Run the predicted cells for real (one sweep per workload) and add "measured" and "error" to each cell."""
    base = SweepSpec.from_toml(session.path)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(preds):
        groups.setdefault(p.workload, []).append(i)
    by_name = {w.name: w for w in _workloads(args, session)}
    done: Confirmation = {"sessions": [], "pairs": []}
    for name, idx in groups.items():
        ps = [preds[i] for i in idx]
        closed = [p.load.concurrency for p in ps if p.load.concurrency]
        rates = [p.load.rate for p in ps if p.load.rate]
        n = args.requests or max(p.requests or requests_for(p.load, None) for p in ps)  # as predicted
        spec = base.replace(name=f"{session.info.name or session.path.name}-confirm", workloads=(by_name[name],),
                            concurrency=tuple(closed) if closed else None, rates=tuple(rates) if rates else None,
                            requests=n, duration_s=None, warmup=0, repeat=1, variants=(),
                            seed=confirm_seed(session, base.seed))
        ctx = RunContext(api_key=api_key_from(args, spec.api_key_env),
                         sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None)
        print(f"confirming {name}: running {len(ps)} cell(s) for real against {spec.target_text} ...", file=sys.stderr,
              flush=True)
        buf = io.StringIO()
        with ExitStack() as stack:
            if not spec.launch:
                url, label = open_target(spec.url, stack, sys.stderr)
                ctx = replace(ctx, url=url, target_label=label)
            run_loop_for(spec, ctx, buf, sys.stderr, True)
        try:
            result = json.loads(buf.getvalue().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ServescopeError("the confirming run printed no result; see the messages above") from None
        cells = {(c.get("concurrency"), c.get("rate")): c for c in result.get("cells", [])}
        measured = [cells.get((p.load.concurrency, p.load.rate), {"status": "missing"}) for p in ps]
        pairs = confirm_pairs(ps, measured)
        record_confirmation(session, pairs, str(result.get("session")), knobs)
        done["sessions"].append(result.get("session"))
        for i, pr in zip(idx, pairs, strict=True):
            out["cells"][i]["measured"] = pr["measured"]
            out["cells"][i]["error"] = pr["error"]
        done["pairs"] += pairs
    out["confirm"] = done


def _print_confirm(c: Confirmation) -> None:
    print(f"confirmed by running the cells (sessions: {', '.join(clean_text(str(s)) for s in c['sessions'])}):")
    print("  workload              load      figure          predicted   measured   error")
    for p in c["pairs"]:
        load = f"c={p['concurrency']}" if p["concurrency"] else f"rate={p['rate']:g}/s"
        for k in p["predicted"]:
            e = p["error"][k]
            print(f"  {clean_text(p['workload'])[:20]:<20}  {load:<8} {k:<14} {_num(p['predicted'][k], 2):>10} "
                  f"{_num(p['measured'][k], 2):>10}  {'-' if e is None else f'{e:+.1%}'}")
