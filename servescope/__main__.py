"""servescope's command line. Nothing heavy is imported before a command needs it: the flags come from
servescope/cli/args.py, and a command's module is imported once it is chosen."""

from __future__ import annotations

import argparse
import os
import sys

from servescope import __version__
from servescope.cli import args as a
from servescope.cli.common import check_paths
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.workloads.spec import COMPOSITE, PRESETS, context_sweep, load_toml


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="servescope", description="Benchmark LLM inference servers (vLLM, "
                                "llama.cpp's server, SGLang, any OpenAI-compatible server).")
    p.add_argument("--version", action="version", version=f"servescope {__version__}")
    sub = p.add_subparsers(dest="command")
    a.add_run_args(sub.add_parser("run", help="run a sweep headless and save it as a session"))
    a.add_resume_args(sub.add_parser("resume", help="continue an interrupted sweep from its first unfinished cell"))
    wl = sub.add_parser("workloads", help="list the workload presets and their shapes")
    wl.add_argument("files", nargs="*", help="also check and show these workload TOML files")
    sub.add_parser("sim", help="run the built-in vLLM simulator (see `servescope sim --help`)", add_help=False)
    demo = sub.add_parser("demo", help="open the app on the simulator's default profile and run a short sweep")
    demo.add_argument("--profile", default=None, help="simulator profile (default: the default profile)")
    a.add_sessions_args(sub.add_parser("sessions", help="list saved sessions"))
    a.add_compare_args(sub.add_parser("compare", help="compare sessions side by side (Markdown or JSON)"))
    a.add_gate_args(sub.add_parser("gate", help="exit 1 when a candidate regresses beyond noise and a threshold "
                                   "(for CI)"))
    a.add_report_args(sub.add_parser("report", help="a Markdown (or CSV/JSON) report of a session"))
    a.add_import_args(sub.add_parser("import", help="import `vllm bench serve --save-result` JSON as a session"))
    a.add_quality_args(sub.add_parser("quality", help="probe answer quality (tasks, perplexity, divergence from a "
                                      "reference) and save it as a session"))
    a.add_twin_args(sub.add_parser("twin", help="fit the simulator to a measured session (the capacity twin)"))
    a.add_whatif_args(sub.add_parser("whatif", help="predict cells that were not run from a session's twin: other "
                                                    "loads, workloads, KV budgets; capacity at the SLOs"))
    a.add_tune_args(sub.add_parser("tune", help="search server flags and load for the best goodput or capacity at "
                                                "the SLOs, measuring few cells (a model picks each next one)"))
    a.add_watch_args(sub.add_parser("watch", help="print a running sweep's progress and finished cells until it ends"))
    a.add_attach_args(sub.add_parser("attach", help="open the app on a running sweep's live view"))
    a.add_target_args(sub.add_parser("tui", help="open the terminal app"))
    a.add_docs_epilogs(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from servescope.sim.cli import main as sim_main

        return int(sim_main(argv[1:]) or 0)
    args = _parser().parse_args(argv)
    try:
        check_paths(args)  # --save, --sessions-dir, -o: one check for every command
        return _command(args)
    except ServescopeError as e:
        print(f"servescope: error: {clean_text(e.message)}", file=sys.stderr)
        return e.exit_code


def _command(args: argparse.Namespace) -> int:
    """Run the chosen command. Each command's module is imported here, once it is chosen: they load polars, httpx
    or textual (benchmarks/import_cost.py measures what that costs), which `--help`, argument errors and the other
    commands do not need."""
    cmd = args.command
    if cmd in ("run", "resume"):
        from servescope.cli import run

        return run.run_command(args) if cmd == "run" else run.resume_command(args)
    if cmd == "workloads":
        return _workloads(args.files)
    if cmd in ("sessions", "compare", "gate", "report", "import"):
        from servescope.cli import compare as cc

        fn = {"sessions": cc.sessions_command, "compare": cc.compare_command, "gate": cc.gate_command,
              "report": cc.report_command, "import": cc.import_command}[cmd]
        return int(fn(args))
    if cmd == "quality":
        from servescope.cli.quality import quality_command

        return quality_command(args)
    if cmd in ("twin", "whatif"):
        from servescope.cli import twin as tw

        return int(tw.twin_command(args) if cmd == "twin" else tw.whatif_command(args))
    if cmd == "tune":
        from servescope.cli.tune import tune_command

        return tune_command(args)
    if cmd in ("watch", "attach"):
        from servescope.cli import detach as dt

        return int(dt.watch_command(args) if cmd == "watch" else dt.attach_command(args))
    from servescope.tui.app import run_app  # None (no command), "tui" or "demo"

    if cmd == "demo":
        return int(run_app(url=f"sim://{args.profile}" if args.profile else None, demo=True) or 0)
    if cmd is None:
        return int(run_app() or 0)
    return int(run_app(url=args.url or os.environ.get("SERVESCOPE_URL"),
                       api_key_env=args.api_key_env or "OPENAI_API_KEY") or 0)


def _workloads(files: list[str]) -> int:
    print(f"{'preset':<16} {'shape':<58} stands for")
    for w in PRESETS.values():
        extra = ""
        if w.default_concurrency:
            extra = f" [default c={','.join(map(str, w.default_concurrency))}, {w.default_requests} requests]"
        print(f"{w.name:<16} {w.shape():<58} {w.description}{extra}")
    for name, desc in COMPOSITE.items():
        print(f"{name:<16} {'5 workloads: ' + ', '.join(x.name.split('/')[1] for x in context_sweep()):<58} {desc}")
    for f in files:
        for w in load_toml(f):
            print(f"{w.name:<16} {w.shape():<58} {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
