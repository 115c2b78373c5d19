"""servescope's command line. Nothing heavy is imported before a command needs it: the flags come from
servescope/cli/args.py, and a command's module is imported once it is chosen."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from servescope import __version__
from servescope.cli import args as a
from servescope.cli.common import check_paths
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine import fields
from servescope.engine.simtarget import sim_profile
from servescope.sim.launcher import SimStartError, url_args
from servescope.sim.profile import ProfileError, load_profile
from servescope.workloads.spec import COMPOSITE, PRESETS, context_sweep, load_toml


def _parser() -> argparse.ArgumentParser:
    p = a.Parser(prog="servescope", description="Benchmark LLM inference servers (vLLM, "
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
    a.add_compare_args(sub.add_parser("compare", help="compare sessions side by side (Markdown, HTML or JSON)"))
    a.add_gate_args(sub.add_parser("gate", help="exit 1 when a candidate regresses beyond noise and a threshold "
                                   "(for CI)"))
    a.add_report_args(sub.add_parser("report", help="a report of a session: Markdown, HTML with its figures, CSV or "
                                                    "JSON"))
    a.add_import_args(sub.add_parser("import", help="import another tool's results as a session (vllm bench serve, "
                                     "GuideLLM, AIPerf, inference-perf, llm-d benchmark reports)"))
    a.add_export_args(sub.add_parser("export", help="write a session as llm-d benchmark reports (one per cell)"))
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
    """Run one command. Every error a user can act on ends here as one line on stderr, "servescope COMMAND: error:
    ...", the command named (argparse's errors too: cli/args.py's Parser raises them as UsageError), exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "servescope"
    try:
        if argv and argv[0] == "sim":
            from servescope.sim.cli import main as sim_main

            prog = "servescope sim"
            return int(sim_main(argv[1:], parser_class=a.Parser) or 0)
        args = _parser().parse_args(argv)
        prog = command_prog(args)
        check_paths(args)  # --save, --sessions-dir, -o: one check for every command
        return _command(args)
    except a.UsageError as e:
        print(f"{e.prog}: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except ServescopeError as e:
        print(f"{prog}: error: {clean_text(e.message)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # the reader left (`servescope sim --list | head`): stop quietly as a command killed by SIGPIPE does, and
        # keep Python's exit-time flush of stdout from failing again on the closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + int(signal.SIGPIPE)


def command_prog(args: argparse.Namespace) -> str:
    """How error lines name the command: "servescope run", "servescope twin fit" ("servescope" for none)."""
    words = [w for w in (getattr(args, "command", None), getattr(args, "twin_command", None)) if w]
    return " ".join(["servescope", *words])


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
    if cmd in ("sessions", "compare", "gate", "report", "import", "export"):
        from servescope.cli import compare as cc

        fn = {"sessions": cc.sessions_command, "compare": cc.compare_command, "gate": cc.gate_command,
              "report": cc.report_command, "import": cc.import_command, "export": cc.export_command}[cmd]
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
    url = _app_target(args)  # checked before the app takes the terminal
    from servescope.tui.app import run_app  # None (no command), "tui" or "demo"

    if cmd == "demo":
        return int(run_app(url=url, demo=True) or 0)
    if cmd is None:
        return int(run_app() or 0)
    return int(run_app(url=url, api_key_env=args.api_key_env or "OPENAI_API_KEY") or 0)


def _app_target(args: argparse.Namespace) -> str | None:
    """The app's target from `tui --url` (else $SERVESCOPE_URL) or `demo --profile`, checked as `run` checks it:
    a malformed URL, an empty flag or an unknown simulator profile is one line before the app opens."""
    if args.command == "demo":
        if args.profile is None:
            return None
        given = fields.nonempty_text(args.profile, "--profile")
        flag, url = f"--profile {given}", f"sim://{given}"
    elif args.command == "tui":
        for f, v in (("--api-key-env", args.api_key_env), ("--model", args.model), ("--api-key", args.api_key)):
            if v is not None:
                fields.nonempty_text(v, f)
        where = "--url" if args.url is not None else "$SERVESCOPE_URL"
        given_url = args.url if args.url is not None else os.environ.get("SERVESCOPE_URL")
        if given_url is None:
            return None
        url = fields.url(given_url, where)
        flag = f"{where} {url}"
    else:
        return None
    profile = sim_profile(url)
    if profile is not None:
        try:
            load_profile(url_args(profile)[0])
        except ProfileError as e:
            raise ServescopeError(f"{flag}: {e}") from None
        except SimStartError as e:
            raise ServescopeError(f"{flag}: {e.message}") from None
    return url


def _workloads(files: list[str]) -> int:
    loaded = [(f, load_toml(f)) for f in files]  # every file read before a line is printed: a bad one is the one line
    print(f"{'preset':<16} {'shape':<58} stands for")
    for w in PRESETS.values():
        extra = ""
        if w.default_concurrency:
            extra = f" [default c={','.join(map(str, w.default_concurrency))}, {w.default_requests} requests]"
        print(f"{w.name:<16} {w.shape():<58} {w.description}{extra}")
    for name, desc in COMPOSITE.items():
        print(f"{name:<16} {'5 workloads: ' + ', '.join(x.name.split('/')[1] for x in context_sweep()):<58} {desc}")
    for f, ws in loaded:
        for w in ws:
            print(clean_text(f"{w.name:<16} {w.shape():<58} {f}"))  # names are data: no escape reaches the terminal
    return 0


if __name__ == "__main__":
    sys.exit(main())
