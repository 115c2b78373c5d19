"""The command line's arguments: every subcommand's flags, in a module that imports nothing heavy, so that
`servescope --help` and argument errors answer at once. The commands themselves (servescope/cli/run.py, compare.py,
...) are imported only once one is chosen (servescope/__main__.py)."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import NoReturn

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine.spec import add_flags, add_workload_flag, seed_value, values_may_start_with_minus

_SESSIONS_DIR_HELP = "sessions directory (default $SERVESCOPE_HOME/sessions or the user data dir)"
MIN_EFFECT_PCT = 2.0
FAIL_ON_EXAMPLE = "output_tok_s:-5%,ttft_ms.p99:+10%"
MISMATCH_NAMES = ("servescope_version", "warmup", "max_model_len", "tokenizer", "host", "lengths", "token_basis",
                  "ttft", "itl", "tpot", "e2e", "percentiles", "throughput", "streaming", "ignore_eos", "window")


class UsageError(ServescopeError):
    """A command line argparse could not read: `message` is one line, and `prog` names the command it was read
    for ("servescope run", "servescope twin fit"); servescope/__main__.py prints "PROG: error: MESSAGE", exit 2."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """servescope's argument parser, every subcommand's too (argparse makes a subparser of its parent's class):
    each error argparse finds is raised as one UsageError line naming the command and, for a flag that does not
    exist, the closest that does (argparse printed the top-level usage, then "unrecognized arguments", for a
    flag mistyped after a subcommand; and its whole usage before every other error)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, clean_text(usage_message(self, message)))

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, but what this parser does not know is an error here, where the command is known (a
        subcommand's leftovers reached the top-level parser, which said only "unrecognized arguments")."""
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unknown_message(self, extras))
        return ns, extras


def _flags(p: argparse.ArgumentParser) -> list[str]:
    return [o for a in p._actions for o in a.option_strings if a.help is not argparse.SUPPRESS]


def _near(word: str, choices: Sequence[str]) -> str | None:
    near = difflib.get_close_matches(word, list(choices), n=1)
    return near[0] if near else None


def unknown_message(p: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """What is wrong with the arguments `p` does not know: the first flag, with the closest flag `p` has, else
    the first stray value."""
    flag = next((x for x in extras if x.startswith("-") and len(x) > 1 and not re.match(r"-\.?\d", x)), None)
    if flag is not None:
        name = flag.split("=", 1)[0]
        near = _near(name, [o for o in _flags(p) if o.startswith("--")] if name.startswith("--") else _flags(p))
        hint = f" (did you mean {near}?)" if near else f"; see `{p.prog} --help`"
        return f"unknown flag {name}{hint}"
    return f"unexpected argument {extras[0]!r}; see `{p.prog} --help`"


_ARGUMENT = re.compile(r"argument (?P<name>\S+?): (?P<rest>.*)", re.S)
_CHOICE = re.compile(r"invalid choice: (?P<value>.*?) \(choose from (?P<choices>.*)\)$", re.S)
_TYPED = re.compile(r"invalid (?P<type>int|float|_?\w+) value: (?P<value>.*)$", re.S)
_KINDS = {"int": "a whole number", "float": "a number"}


def usage_message(p: argparse.ArgumentParser, message: str) -> str:
    """argparse's error `message` as servescope says it: the flag (its long form) first, then what is wrong and
    what to give; a mistyped choice gets the closest valid one."""
    m = _ARGUMENT.fullmatch(message)
    if m is None:
        required = message.removeprefix("the following arguments are required: ")
        if required != message:
            return f"missing {required}; see `{p.prog} --help`"
        if message.startswith("ambiguous option: "):
            return f"{message.removeprefix('ambiguous option: ')}: give more of the flag's name"
        return message
    name = m["name"].split("/")[-1]  # "-c/--concurrency": --concurrency
    rest = m["rest"]
    action = next((a for a in p._actions if name in (*a.option_strings, a.metavar, a.dest)), None)
    if (c := _CHOICE.fullmatch(rest)) is not None:
        choices = [x.strip().strip("'") for x in c["choices"].split(",")]
        value = c["value"].strip("'")
        near = _near(value, choices)
        hint = f" (did you mean {near}?)" if near else ""
        if action is not None and isinstance(action, argparse._SubParsersAction):
            return f"unknown command {value!r}" + (hint or f"; the commands are {', '.join(choices)}")
        return f"{name} {value!r}: not one of {', '.join(choices)}{hint}"
    if (t := _TYPED.fullmatch(rest)) is not None:
        kind = _KINDS.get(t["type"], f"a {t['type'].lstrip('_')}")
        default = getattr(action, "default", None)
        example = f", e.g. {name} {default}" if isinstance(default, (int, float)) and default else ""
        return f"{name} {t['value']}: not {kind}; give {kind}{example}"
    if rest == "expected one argument":
        return f"{name} needs a value; see `{p.prog} --help`"
    if rest.startswith("expected at least one argument"):
        return f"{name} needs at least one value; see `{p.prog} --help`"
    if rest.startswith("ignored explicit argument "):
        return f"{name} takes no value (got {rest.removeprefix('ignored explicit argument ')})"
    return f"{name}: {rest}"


# The docs page that covers each command (paths in the repository's docs/ folder): every `--help` ends with it.
DOCS_PAGES = {
    "": "docs/getting-started.md; every command's flags: docs/reference/cli.md",
    "run": "docs/measuring.md", "resume": "docs/telemetry.md#a-server-that-dies-mid-sweep-and-servescope-resume",
    "workloads": "docs/measuring.md#workloads", "sim": "docs/simulator.md", "demo": "docs/getting-started.md",
    "sessions": "docs/sessions.md", "compare": "docs/compare.md",
    "gate": "docs/compare.md#gate-a-pull-request-servescope-gate", "report": "docs/compare.md#reports",
    "import": "docs/imports.md", "export": "docs/imports.md#export-an-llm-d-benchmark-report",
    "quality": "docs/quality.md",
    "twin": "docs/twin.md", "whatif": "docs/twin.md", "tune": "docs/tune.md",
    "watch": "docs/measuring.md#sweeps-that-outlive-the-terminal-detach-watch-attach",
    "attach": "docs/measuring.md#sweeps-that-outlive-the-terminal-detach-watch-attach", "tui": "docs/app.md",
}


def docs_epilog(p: argparse.ArgumentParser, command: str) -> None:
    """End `p`'s help with the docs page for `command` and its entry in the CLI reference."""
    ref = f"; every flag: docs/reference/cli.md#{command}" if command else ""
    p.epilog = f"docs: {DOCS_PAGES.get(command, 'docs/reference/cli.md')}{ref}"


def add_docs_epilogs(p: argparse.ArgumentParser, command: str = "") -> None:
    """The docs line for `servescope --help` and for every subcommand (twin's own included) that has none yet."""
    if not p.epilog:
        docs_epilog(p, command)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                add_docs_epilogs(sp, command or name)


def _add_min_effect(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-effect", type=_percent, default=MIN_EFFECT_PCT, metavar="PCT",
                   help=f"a change smaller than PCT percent is within noise (default {MIN_EFFECT_PCT:g})")


def _percent(text: str) -> float:
    try:
        v = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (e.g. 2 or 2%)") from None
    if not 0 <= v < 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percentage from 0 to 1000")
    return v


def _seed(text: str) -> int:
    """A seed, read as a sweep's is (engine/spec.py seed_value): a whole number TOML can store."""
    try:
        return seed_value(text, "--seed")
    except ServescopeError as e:
        raise argparse.ArgumentTypeError(e.message.removeprefix("--seed: ")) from None


DEFAULT_TASKS = "arithmetic,retrieval,needle,json"  # core.quality.TASKS (not imported here: the CLI starts light)


def _fit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-config", metavar="PATH", help="the model's Hugging Face config.json (or its directory), "
                   "for the model's shape (default: the simulator's profile, or the model's root directory when "
                   "/v1/models named one on this machine)")
    p.add_argument("--server-max-num-seqs", type=int, metavar="N", dest="fit_max_num_seqs",
                   help="the server's --max-num-seqs, when the session does not record it")
    p.add_argument("--server-max-num-batched-tokens", type=int, metavar="N", dest="fit_max_num_batched_tokens",
                   help="the server's --max-num-batched-tokens, when the session does not record it")
    p.add_argument("--sessions-dir", help="where sessions are (default $SERVESCOPE_HOME/sessions)")


def add_target_args(p: argparse.ArgumentParser) -> None:
    """--url, --model, --api-key-env (declared by SweepSpec) and --api-key (never stored)."""
    add_flags(p, only=("url", "model", "api_key_env"))
    p.add_argument("--api-key", help="API key (prefer --api-key-env: flags show up in `ps`)")
    docs_epilog(p, "tui")  # `servescope tui`; quality sets its own after


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Every sweep option's flag comes from SweepSpec (servescope/engine/spec.py); these are the run's own."""
    p.add_argument("--sweep", metavar="FILE.toml",
                   help="run a whole sweep saved from the app, written by hand, or recorded in a session "
                        "(SESSION/session.toml); flags given with it override the file's values")
    add_workload_flag(p)
    add_flags(p)
    p.add_argument("--api-key", help="API key (prefer --api-key-env: flags show up in `ps`)")
    p.add_argument("--save", help="session directory (default: a new one under the sessions directory)")
    p.add_argument("--sessions-dir", help="where sessions go (default $SERVESCOPE_HOME/sessions or the user data dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of tables")
    p.add_argument("--detach", action="store_true",
                   help="run the sweep in the background (it survives a closed terminal or SSH connection): print "
                        "the session directory and return; follow it with `servescope watch` or `servescope attach`")
    docs_epilog(p, "run")


def add_resume_args(p: argparse.ArgumentParser) -> None:
    values_may_start_with_minus(p)
    p.add_argument("session", help="session directory or id (see `servescope sessions`)")
    p.add_argument("--sessions-dir", help="where sessions are (default $SERVESCOPE_HOME/sessions or the user data dir)")
    p.add_argument("--url", help="the server's URL, when it moved since the session was recorded")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="environment variable holding the API key (default: the one the sweep recorded)")
    p.add_argument("--api-key", help="API key")
    p.add_argument("--recover-timeout", help="see `servescope run --help` (default: the sweep's own)")
    p.add_argument("--launch", metavar='"vllm serve MODEL ..."',
                   help="the server command in full, when the session stored it with its secrets as ••••")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of tables")
    docs_epilog(p, "resume")


# ---- sessions ---------------------------------------------------------------------------------------


def add_sessions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    docs_epilog(p, "sessions")


# ---- compare ----------------------------------------------------------------------------------------


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="+", metavar="SESSION", help="two or more session directories or ids; "
                   "deltas are against the first")
    p.add_argument("--label", metavar="TAGKEY", help="label each session by this tag (e.g. quant), else by name")
    p.add_argument("--slo", help="judge capacity and goodput by these SLOs, e.g. ttft_ms=3000,per_user_tok_s=20 "
                   "(default: the first session's, else TTFT <= 3 s and >= 20 tok/s per user)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    docs_epilog(p, "compare")
    p.add_argument("--format", choices=["md", "json", "html"], default=None,
                   help="md (default), json (as --json), or html: one self-contained file with the figures inline "
                        "(needs the plots extra: pip install 'servescope[plots]')")
    add_figures_arg(p)
    p.add_argument("-o", "--output", metavar="FILE.md", help="write the Markdown (or JSON) to FILE")
    p.add_argument("--include-bound", action="store_true",
                   help="count cells whose client was bound (the load generator, not the server, limited them) in "
                        "capacity, knee and peak; by default they are left out and named")
    _add_min_effect(p)
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)


def add_figures_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--figures", metavar="DIR", help="Markdown: write the figures to DIR as SVG and PNG files and link "
                   "them (relative paths) in place of the Mermaid charts (needs the plots extra)")


# ---- gate -------------------------------------------------------------------------------------------


def add_gate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sessions", nargs="+", metavar="SESSION", help="BASELINE CANDIDATE: session directories or "
                   "ids, the baseline also a baseline file (--save-baseline); one SESSION with --save-baseline "
                   "only writes that file")
    p.add_argument("--fail-on", metavar="SPEC", help="figures and signed thresholds, e.g. "
                   f'"{FAIL_ON_EXAMPLE.replace("%", "%%")}": -5%% fails on a drop of more than 5%%, '
                   "+10%% on a rise of more than 10%%")
    p.add_argument("--markdown", metavar="FILE", help="write a Markdown summary for a pull-request comment")
    docs_epilog(p, "gate")
    p.add_argument("--json", action="store_true", help="print the result as JSON (the one-line verdict goes "
                   "to stderr)")
    p.add_argument("--save-baseline", metavar="FILE", help="write the candidate (or the one SESSION) as a "
                   "baseline file (JSON, gzip when FILE ends in .gz) for later gates")
    p.add_argument("--allow-mismatch", metavar="NAMES", help="gate even though the sessions differ in these "
                   f"(all, or any of {', '.join(MISMATCH_NAMES)})")
    p.add_argument("--slo", help="judge goodput by these SLOs (default: the baseline's, else TTFT <= 3 s and "
                   ">= 20 tok/s per user)")
    _add_min_effect(p)
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)


# ---- report -----------------------------------------------------------------------------------------


def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", metavar="SESSION", help="session directory or id")
    p.add_argument("--compare", nargs="+", default=[], metavar="SESSION",
                   help="add delta tables against these sessions")
    p.add_argument("--label", metavar="TAGKEY", help="label sessions by this tag (e.g. quant), else by name")
    p.add_argument("--slo", help="judge capacity and goodput by these SLOs (default: the session's, else "
                   "TTFT <= 3 s and >= 20 tok/s per user)")
    p.add_argument("--format", choices=["md", "csv", "json", "html"], default="md",
                   help="output format (default md); html: one self-contained file with the figures inline (needs the "
                        "plots extra: pip install 'servescope[plots]')")
    add_figures_arg(p)
    docs_epilog(p, "report")
    p.add_argument("--include-bound", action="store_true",
                   help="count cells whose client was bound (the load generator, not the server, limited them) in "
                        "capacity, knee and peak; by default they are left out and named")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (default: stdout)")
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)


# ---- import -----------------------------------------------------------------------------------------


IMPORT_FORMATS = ("vllm-bench", "guidellm", "aiperf", "inference-perf", "llmd-report")  # sessions.provenance's


def add_import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="result files of one tool, or their folders: "
                   "`vllm bench serve --save-result` JSON (one cell each), GuideLLM's benchmarks JSON (each "
                   "benchmark a cell), AIPerf's profile_export.jsonl or profile_export_aiperf.json (each run a cell), "
                   "inference-perf's lifecycle reports (each stage a cell), llm-d benchmark reports (one cell each)")
    p.add_argument("--from", dest="from_", choices=IMPORT_FORMATS, metavar="TOOL",
                   help=f"the tool that wrote the files: {', '.join(IMPORT_FORMATS)} (default: recognised from the "
                        "files)")
    p.add_argument("--workload", help="workload name for the cells, e.g. sharegpt, to align them with a "
                   "servescope session's cells of the same load (default TOOL-inN-outM)")
    p.add_argument("--name", default="", help="session name")
    docs_epilog(p, "import")
    p.add_argument("--tag", action="append", default=[], help="KEY=VALUE label for the session, repeatable")
    p.add_argument("--save", help="session directory (default: a new one under the sessions directory)")
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)


EXPORT_FORMATS = ("llmd-report",)
LLMD_SCHEMAS = ("0.1", "0.2")  # sessions.llmd.SCHEMA_VERSIONS


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", metavar="SESSION", help="session directory or id (see `servescope sessions`)")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="llmd-report",
                   help="llmd-report (the default): one llm-d benchmark report (JSON) per cell")
    p.add_argument("--llmd-schema", choices=LLMD_SCHEMAS, default=None, metavar="0.1|0.2",
                   help="the llm-d benchmark report schema (--format llmd-report only): 0.1 (the default: top-level "
                        "version, scenario, metrics) or 0.2 (version, run, scenario, results)")
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="the folder the files go to (created; "
                   "files of the same names in it are replaced)")
    docs_epilog(p, "export")
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)


def add_quality_args(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    add_flags(p, only=("ca_cert", "tls_verify"))  # --ca-cert, --insecure: an https target is checked as run checks it
    docs_epilog(p, "quality")
    p.add_argument("--reference", metavar="SESSION",
                   help="a quality session of the reference server (e.g. BF16 or FP8): report KL divergence, top-1 "
                        "agreement and where the greedy outputs first part")
    p.add_argument("--tasks", default=DEFAULT_TASKS,
                   help=f"exact-answer tasks, comma-separated (default: {DEFAULT_TASKS})")
    p.add_argument("--context", default="1024", metavar="TOKENS",
                   help="prompt lengths of the long-context tasks (retrieval, needle), e.g. 1024,8192 or 1k,16k "
                        "(default 1024)")
    p.add_argument("--task-file", action="append", default=[], metavar="FILE.jsonl",
                   help="your own questions, one JSON object per line: prompt, answer, scorer exact|choice|regex "
                        "(repeatable; the task is named after the file)")
    p.add_argument("-n", "--n", type=int, default=20, help="questions per task and context length (default 20)")
    p.add_argument("--top-k", type=int, default=5, help="log-probabilities per position for divergence (default 5)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the generated questions (default 0)")
    p.add_argument("--concurrency", type=int, default=4, help="probe requests in flight (default 4)")
    p.add_argument("--no-perplexity", action="store_true", help="skip the corpus perplexity")
    p.add_argument("--tokenizer", metavar="PATH", help="a local tokenizer to size the long prompts (default: the "
                                                       "server's /tokenize, else an estimate)")
    p.add_argument("--save", help="session directory: an existing session gets the quality results beside its "
                                  "speed; else a new quality session there (default: a new one under the sessions "
                                  "directory)")
    p.add_argument("--sessions-dir", help="where sessions go (default $SERVESCOPE_HOME/sessions or the user data dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of a table")


def add_twin_args(p: argparse.ArgumentParser) -> None:
    docs_epilog(p, "twin")
    sub = p.add_subparsers(dest="twin_command", metavar="fit")
    f = sub.add_parser("fit", help="fit the simulator to a measured session and store the profile in it")
    values_may_start_with_minus(f)
    docs_epilog(f, "twin")
    f.add_argument("session", help="session directory or id")
    _fit_flags(f)
    f.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def add_whatif_args(p: argparse.ArgumentParser) -> None:
    values_may_start_with_minus(p)
    docs_epilog(p, "whatif")
    p.add_argument("session", help="session directory or id (fitted first when it has no twin yet)")
    p.add_argument("--workload", "-w", help="preset name(s) or TOML file(s), comma-separated (default: the "
                   "session's own; with --capacity, a table of task types from 1K code completion to a 96K coding "
                   "assistant)")
    p.add_argument("--concurrency", "-c", help="closed-loop users per cell, e.g. 1,32 (default: the session's)")
    p.add_argument("--rate", help="open-loop request rates per second, e.g. 2,5 (instead of --concurrency)")
    p.add_argument("--requests", "-n", type=int, help="requests per predicted cell (default max(64, 4 x load))")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="X", help="as vLLM's flag: the KV cache resized")
    p.add_argument("--kv-cache-dtype", metavar="DTYPE", help="as vLLM's flag: fp8 halves the KV bytes per token")
    p.add_argument("--max-model-len", type=int, metavar="N", help="as vLLM's flag")
    p.add_argument("--max-num-seqs", type=int, metavar="N", help="as vLLM's flag: the scheduler's sequence limit")
    p.add_argument("--slo", help="SLOs for --capacity, e.g. ttft_ms=3000,per_user_tok_s=20 (default: the "
                                 "session's, else TTFT <= 3000 ms and >= 20 tok/s per user)")
    p.add_argument("--capacity", action="store_true", help="per workload: the highest concurrency meeting the SLOs, "
                                                           "and the knee")
    p.add_argument("--confirm", action="store_true", help="run the predicted cells for real against the session's "
                   "target and report each figure's error (kept in the session: the twin's track record)")
    p.add_argument("--refit", action="store_true", help="fit again even when the session has a twin")
    _fit_flags(p)
    p.add_argument("--api-key", help="API key for --confirm (prefer the session's --api-key-env variable)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


# ---- watch -------------------------------------------------------------------------------------------------


def add_watch_args(p: argparse.ArgumentParser) -> None:
    docs_epilog(p, "watch")  # attach sets its own after
    p.add_argument("session", nargs="?", help="session directory or id (default: the most recent running sweep)")
    p.add_argument("--sessions-dir", help="where sessions are (default $SERVESCOPE_HOME/sessions or the user data dir)")


def add_attach_args(p: argparse.ArgumentParser) -> None:
    add_watch_args(p)
    docs_epilog(p, "attach")


# ---- tune --------------------------------------------------------------------------------------------------


def add_tune_args(p: argparse.ArgumentParser) -> None:
    """`servescope tune`: the sweep's target, workload and SLO flags (SweepSpec), and the search's own."""
    docs_epilog(p, "tune")
    add_workload_flag(p)
    add_flags(p, only=("url", "model", "api_key_env", "launch", "launch_timeout_s", "slos", "requests", "repeat",
                       "seed", "warmup", "tags", "name", "timeout_s", "precision", "window"))
    p._option_string_actions["--requests"].help = ("a cell's requests: at least N (default 32) and 3 x its users, who "
                                                   "start one by one over one request's E2E (docs/tune.md)")
    p.add_argument("--search", action="append", default=[], metavar="FLAG=LOW..HIGH|A|B",
                   help='a server flag to search, repeatable: "max-num-seqs=16..512" (a range: doubling, log scale) '
                        'or "max-num-batched-tokens=2048|8192|16384" (a list); needs --launch')
    p.add_argument("--concurrency", "-c", dest="tune_loads", default="1..256", metavar="LEVELS",
                   help="the load levels searched: closed-loop users, e.g. 4,8,16 or 4..256 (doubling; default 1..256)")
    p.add_argument("--objective", choices=["goodput", "capacity"], default="goodput",
                   help="goodput: requests/s meeting every SLO (default); capacity: the most users meeting them")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="cells to measure at most (default: a third of the grid, at least the design and 2 more)")
    p.add_argument("--api-key", help="API key (prefer --api-key-env: flags show up in `ps`)")
    p.add_argument("--save", help="session directory (default: a new one under the sessions directory)")
    p.add_argument("--sessions-dir", help=_SESSIONS_DIR_HELP)
    p.add_argument("--json", action="store_true", help='print one JSON object at the end: {"session", "best": '
                   '{"server_args", "objective", "ci"}, "cells_measured", "relaunches", "confirmed"}')
