"""`servescope tune`: the best server flags (and load) for an objective at the SLOs, measuring few cells. The
search is servescope.engine.tune, its model servescope.engine.tunemodel, the measuring and the session
servescope.engine.tunerun; this module reads the flags, prints the progress and the answer."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import NoReturn, TextIO

import msgspec

from servescope.cli.common import api_key_from
from servescope.cli.run import open_target
from servescope.core.errors import ServescopeError
from servescope.core.launchspec import INTERESTING, parse_launch
from servescope.core.slo import slo_terms
from servescope.core.textsafe import clean_text
from servescope.engine.plan import PRECISION_CEILING
from servescope.engine.runner import discard_unmeasured
from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.specsearch import SPEC_TOKENS_FLAG, check_spec_search
from servescope.engine.tune import Setting, Space, Step, Tuner, check_dims, design, parse_loads, parse_search
from servescope.engine.tunemodel import TwinModel, fit_summary
from servescope.engine.tunerun import (
    LiveMeasurer,
    TuneLock,
    progress_table,
    requests_for,
    result_json,
    running_entry,
    tune_table,
    with_setting,
)
from servescope.reports.tunereport import tune_summary
from servescope.sessions.meta import ServerMeta, SessionMeta, TargetMeta, TuneMeta
from servescope.sessions.store import SessionWriter, load_session, new_session_dir
from servescope.sessions.views import DEFAULT_SLOS
from servescope.sim.cli import build_parser, check_args
from servescope.sim.profile import ProfileError, profile_path
from servescope.workloads.spec import Workload

DEFAULT_REQUESTS = 32  # a cell's requests at least (and ROUNDS rounds of its users: engine.tunerun)


def _known_flags(launch: str) -> tuple[str, object]:
    """The launch command's kind, and a test of whether its server takes a flag."""
    ls = parse_launch(launch)
    if ls.kind == "sim":
        flags = {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
        flags -= {"--help", "--list", "--port", "--host", "--profile", "--log-level", "--exit-with-parent"}
        return ls.kind, flags | {SPEC_TOKENS_FLAG}
    # num-speculative-tokens: the --speculative-config JSON's (engine/specsearch.py)
    return ls.kind, {"--" + k.replace("_", "-") for k in INTERESTING} - {"--served-model-name"} | {SPEC_TOKENS_FLAG}


def _sim_problem(launch: str) -> str | None:
    """Why a launch of the built-in simulator cannot start (a flag it does not take, a value it refuses, an unknown
    profile), read with the simulator's own parser and checks; None when it can, or for another server."""
    ls = parse_launch(launch)
    if ls.kind != "sim":
        return None
    parser = build_parser()
    parser.exit_on_error = False

    def refuse(message: str) -> NoReturn:  # argparse's error() prints its usage and exits: one line instead
        raise argparse.ArgumentError(None, message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        args, extra = parser.parse_known_args(ls.argv[len(ls.head):])
    except argparse.ArgumentError as e:
        return f"the simulator's flags: {e}"
    if extra:
        return f"the simulator takes no {extra[0]!r} (see `servescope sim --help`)"
    problem = check_args(args)
    if problem:
        return f"the simulator's {problem}"
    try:
        profile_path(args.profile)
    except ProfileError as e:
        return f"servescope sim: {e}"
    return None


def tune_command(args: argparse.Namespace) -> int:
    out = sys.stderr if args.json else sys.stdout
    spec = SweepSpec.from_args(args)
    dims = [parse_search(x) for x in args.search]
    if dims and not spec.launch:
        raise ServescopeError("--search changes server flags: give --launch \"vllm serve MODEL ...\" (servescope "
                              "relaunches it per setting); without --launch tune searches the load only")
    if spec.launch:
        kind, flags = _known_flags(spec.launch)
        check_dims(dims, lambda f: f in flags)  # type: ignore[operator]
        for d in dims:
            if d.flag == SPEC_TOKENS_FLAG:
                check_spec_search(spec.launch, d.values)
            if d.flag in ("--host", "--port", "--model", "--profile"):
                raise ServescopeError(f"--search: {d.flag} is not a setting to tune; search a server flag such as "
                                      "max-num-seqs")
    if spec.launch:  # the simulator says now what it would refuse at each setting, before a session is made
        for setting in Space(tuple(dims), (1,)).settings:
            problem = _sim_problem(with_setting(spec.launch, setting))
            if problem is not None:
                at = f" with {setting.text}" if setting.args else ""
                raise ServescopeError(f"--launch{at}: {problem}")
    if len(spec.workloads) != 1:
        raise ServescopeError(f"tune optimises one workload; give one (-w NAME or FILE.toml), not "
                              f"{len(spec.workloads)}")
    w = spec.workloads[0]
    if w.kind != "single" or w.dataset:
        raise ServescopeError(f"workload {w.name!r}: tune predicts single-request workloads with token-length "
                              "distributions; give a preset such as sharegpt or a [workload] TOML file")
    loads = parse_loads(args.tune_loads)
    if not spec.slos:
        spec = spec.replace(slos=dict(DEFAULT_SLOS))
    if spec.requests is None:  # with --precision, the cells' ceiling (each stops once its figures are precise)
        spec = spec.replace(requests=DEFAULT_REQUESTS if spec.precision is None else PRECISION_CEILING)
    space = Space(tuple(dims), loads)
    first = design(space)
    budget = args.budget if args.budget is not None else max(len(first) + 2, math.ceil(space.cells / 3))
    if budget < len(first) + 1:
        raise ServescopeError(f"--budget {budget}: the first design alone takes {len(first)} cells; give "
                              f"--budget {len(first) + 1} or more (the full grid is {space.cells} cells)")
    if budget > space.cells:  # never more cells than the grid, beyond the one measurement again a confirmation takes
        budget = max(space.cells, len(first) + 1)
    ctx = RunContext(api_key=api_key_from(args, spec.api_key_env),
                     sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None)
    name = spec.name or f"tune-{w.name}"
    root = Path(args.save) if args.save else new_session_dir(ctx.sessions_dir, name)
    started = time.monotonic()
    made = not root.exists()  # a search that measures nothing removes the folder it made
    try:
        return _search(args, spec, space, first, budget, ctx, name, root, started, loads, w, out)
    except ServescopeError as e:
        if made and root.is_dir() and not _measured(root):
            message = discard_unmeasured(root, e.message)
            if message != e.message:
                raise ServescopeError(message) from None
        raise


def _measured(root: Path) -> bool:
    """Whether a tune session holds a measured cell or probe (a session of its own under cells/ or probes/)."""
    return any(root.glob("cells/*/session.toml")) or any(root.glob("probes/*/session.toml"))


def _search(args: argparse.Namespace, spec: SweepSpec, space: Space, first: list[tuple[int, int]], budget: int,
            ctx: RunContext, name: str, root: Path, started: float, loads: tuple[int, ...], w: Workload,
            out: TextIO) -> int:
    objective = args.objective
    print(f"tune: {space.cells} cells in the grid ({len(space.settings)} settings x {len(loads)} loads), budget "
          f"{budget}, design {len(first)}; objective {objective} at {', '.join(slo_terms(spec.slos))}; session {root}",
          file=out, flush=True)
    with ExitStack() as stack:
        label = spec.target_text
        if not spec.launch:
            url, sim_label = open_target(spec.url, stack, out)
            ctx = replace(ctx, url=url, target_label=sim_label)
            label = sim_label or spec.url
        lock = TuneLock(root)  # held while the search runs: the app and `attach` tell a live tune from a dead one
        stack.callback(lock.release)
        writer = SessionWriter.create(root, SessionMeta(
            kind="tune", name=name, model=spec.model or "?", target=TargetMeta(url=label), slos=dict(spec.slos),
            workloads=[w.to_dict()], sweep=spec.to_table(inline_workloads=True),
            server=ServerMeta(launch=spec.target_text) if spec.launch else None,
            tune=progress_table(space, objective, budget, [], root)))
        mins = int(spec.requests or DEFAULT_REQUESTS)
        measurer = LiveMeasurer(spec, ctx, root, objective, mins)
        stack.callback(measurer.close)
        model = TwinModel(space, w, spec.slos, requests_for(mins if spec.precision is None else DEFAULT_REQUESTS),
                          spec.seed, ramp_s=spec.ramp_s, steady=spec.window == "steady",
                          progress=lambda t: print(f"  model: {t}", file=out, flush=True))
        unit = "req/s" if objective == "goodput" else "users"
        steps: list[Step] = []

        def on_cell(n: int, setting: Setting, concurrency: int, cell: Path) -> None:
            writer.update(tune=progress_table(space, objective, budget, steps, root,
                                              running_entry(n, setting, concurrency, cell, root)))

        measurer.on_cell = on_cell

        def on_step(st: Step) -> None:
            steps.append(st)
            tune = progress_table(space, objective, budget, steps, root)  # the path so far
            if writer.meta.model == "?" and st.session:  # the served model, as the first cell found it
                info = load_session(st.session).info
                # the server as the cell met it (engine, version, /metrics, tokenizer), under the search's own
                # target line (its command or URL)
                writer.update(tune=tune, model=info.model, models_json=info.models_json or "",
                              max_model_len=info.max_model_len or writer.meta.max_model_len,
                              target=msgspec.structs.replace(info.target, url=label))
            else:
                writer.update(tune=tune)
            band = f" (predicted [{_f(st.band[0])}, {_f(st.band[1])}])" if st.band else ""
            print(clean_text(f"step {st.n}/{budget}: c={st.concurrency} {space.settings[st.setting].label}"
                             f"{' [relaunched]' if st.relaunch else ''}: "
                             f"{'skipped' if st.skipped else f'{objective} {_f(st.value)} {unit}'}{band}"
                             f" - {st.why}"), file=out, flush=True)

        tuner = Tuner(space, objective, budget, model, measurer, on_step=on_step)
        try:
            result = tuner.run()
        except KeyboardInterrupt:
            writer.update(tune=progress_table(space, objective, budget, steps, root))  # no cell runs now
            writer.finish("interrupted", "interrupted")
            print(f"tune: interrupted; the cells measured are in {root / 'cells'}", file=sys.stderr)
            return 130
        except ServescopeError as e:
            writer.update(tune=progress_table(space, objective, budget, steps, root))
            writer.finish("failed", e.message)
            raise
        table = tune_table(result, spec.launch, root, started, fit_summary(model.fits))
        writer.update(tune=table)
        writer.finish("completed")
    print(format_result(table), file=out)
    if args.json:
        print(json.dumps(result_json(str(root), result)))
    return 0


def _f(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def format_result(t: TuneMeta) -> str:
    """The answer, as `servescope tune` prints it (and the report's tune section reads the same table)."""
    lines = tune_summary(t)  # the best, the serve line, the runner-up, the cells: as the report and the app say them
    lines.append("path:")
    for st in t.path:
        pred = f" (predicted {_f(st.band[0])}-{_f(st.band[1])})" if len(st.band) == 2 else ""
        lines.append(f"  {st.step}. c={st.concurrency} {st.server_args or 'as launched'}"
                     f"{' [relaunch]' if st.relaunch else ''}: "
                     f"{'skipped' if st.skipped else _f(st.objective) + ' ' + t.unit}{pred}"
                     f" - {st.why}")
    return "\n".join(clean_text(x) for x in lines)
