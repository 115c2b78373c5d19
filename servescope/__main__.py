"""servescope's command line. Nothing heavy is imported before a command needs it."""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    from servescope import __version__

    p = argparse.ArgumentParser(prog="servescope", description="Benchmark LLM inference servers (vLLM, "
                                "llama.cpp's server, SGLang, any OpenAI-compatible server).")
    p.add_argument("--version", action="version", version=f"servescope {__version__}")
    sub = p.add_subparsers(dest="command")
    from servescope.cli.run import add_run_args, add_target_args

    run = sub.add_parser("run", help="run a sweep headless and save it as a session")
    add_run_args(run)
    from servescope.cli.run import add_resume_args

    add_resume_args(sub.add_parser("resume", help="continue an interrupted sweep from its first unfinished cell"))
    wl = sub.add_parser("workloads", help="list the workload presets and their shapes")
    wl.add_argument("files", nargs="*", help="also check and show these workload TOML files")
    sub.add_parser("sim", help="run the built-in vLLM simulator (see `servescope sim --help`)", add_help=False)
    demo = sub.add_parser("demo", help="open the app on the simulator's default profile and run a short sweep")
    demo.add_argument("--profile", default=None, help="simulator profile (default: the default profile)")
    from servescope.cli import compare as cc

    cc.add_sessions_args(sub.add_parser("sessions", help="list saved sessions"))
    cc.add_compare_args(sub.add_parser("compare", help="compare sessions side by side (Markdown or JSON)"))
    cc.add_gate_args(sub.add_parser("gate", help="exit 1 when a candidate regresses beyond noise and a threshold "
                                    "(for CI)"))
    cc.add_report_args(sub.add_parser("report", help="a Markdown (or CSV/JSON) report of a session"))
    cc.add_import_args(sub.add_parser("import", help="import `vllm bench serve --save-result` JSON as a session"))
    from servescope.cli.quality import add_quality_args

    add_quality_args(sub.add_parser("quality", help="probe answer quality (tasks, perplexity, divergence from a "
                                    "reference) and save it as a session"))
    from servescope.cli import twin as tw

    tw.add_twin_args(sub.add_parser("twin", help="fit the simulator to a measured session (the capacity twin)"))
    tw.add_whatif_args(sub.add_parser("whatif", help="predict cells that were not run from a session's twin: other "
                                                     "loads, workloads, KV budgets; capacity at the SLOs"))
    from servescope.cli import detach as dt

    dt.add_watch_args(sub.add_parser("watch", help="print a running sweep's progress and finished cells until it ends"))
    dt.add_attach_args(sub.add_parser("attach", help="open the app on a running sweep's live view"))
    tui = sub.add_parser("tui", help="open the terminal app")
    add_target_args(tui)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from servescope.sim.cli import main as sim_main

        return int(sim_main(argv[1:]) or 0)
    args = _parser().parse_args(argv)
    from servescope.core.errors import ServescopeError
    from servescope.core.textsafe import clean_text

    try:
        if args.command == "run":
            from servescope.cli.run import run_command

            return run_command(args)
        if args.command == "resume":
            from servescope.cli.run import resume_command

            return resume_command(args)
        if args.command == "workloads":
            return _workloads(args.files)
        if args.command == "demo":
            from servescope.tui.app import run_app

            return int(run_app(url=f"sim://{args.profile}" if args.profile else None, demo=True) or 0)
        if args.command in ("sessions", "compare", "gate", "report", "import"):
            from servescope.cli import compare as cc

            fn = {"sessions": cc.sessions_command, "compare": cc.compare_command, "gate": cc.gate_command,
                  "report": cc.report_command, "import": cc.import_command}[args.command]
            return int(fn(args))
        if args.command == "quality":
            from servescope.cli.quality import quality_command

            return quality_command(args)
        if args.command in ("twin", "whatif"):
            from servescope.cli import twin as tw

            return int(tw.twin_command(args) if args.command == "twin" else tw.whatif_command(args))
        if args.command in ("watch", "attach"):
            from servescope.cli import detach as dt

            return int(dt.watch_command(args) if args.command == "watch" else dt.attach_command(args))
        if args.command in (None, "tui"):
            from servescope.tui.app import run_app

            if args.command is None:
                return int(run_app() or 0)
            return int(run_app(url=args.url or os.environ.get("SERVESCOPE_URL"),
                                   api_key_env=args.api_key_env or "OPENAI_API_KEY") or 0)
    except ServescopeError as e:
        print(f"servescope: error: {clean_text(e.message)}", file=sys.stderr)
        return e.exit_code
    return 0


def _workloads(files: list[str]) -> int:
    from servescope.workloads.spec import COMPOSITE, PRESETS, context_sweep, load_toml

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
