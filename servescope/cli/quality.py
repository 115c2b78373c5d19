"""`servescope quality`: the quality probe from the command line (servescope/engine/quality.py does the work)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servescope.cli.common import api_key_from, resolve_session
from servescope.cli.run import open_target
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.core.tls import TlsSettings, configure
from servescope.engine import fields
from servescope.engine.quality import ANSWER_ROOM, QualitySpec, parse_contexts, parse_tasks, run_quality
from servescope.engine.simtarget import sim_profile
from servescope.engine.spec import DEFAULT_URL, tls_without_https
from servescope.sessions.live import refuse_second_writer
from servescope.sim.launcher import SimStartError, url_args
from servescope.sim.profile import ProfileError, load_profile
from servescope.workloads.quality import load_user_tasks

if TYPE_CHECKING:
    from servescope.core.quality import QualityResult, QualitySummary

    class QualityJson(QualitySummary):
        """What `quality --json` prints: the session, then the result's summary."""

        session: str


def spec_from_args(args: argparse.Namespace) -> Any:
    if args.url is not None:
        fields.url(args.url, "--url")
    for flag, v in (("--api-key", args.api_key), ("--model", args.model), ("--api-key-env", args.api_key_env),
                    ("--tokenizer", args.tokenizer)):
        if v is not None and not v.strip():
            raise ServescopeError(f"{flag}: empty; give a value (or leave the flag out for its default)")
    for flag, v, lo in (("-n", args.n, 1), ("--top-k", args.top_k, 1), ("--concurrency", args.concurrency, 1)):
        if v < lo:
            raise ServescopeError(f"{flag} {v}: must be {lo} or more")
    if args.top_k > 20:
        raise ServescopeError(f"--top-k {args.top_k}: servers return at most 20 log-probabilities; use 20 or less")
    tasks, contexts = parse_tasks(args.tasks), parse_contexts(args.context)
    for f in args.task_file:
        if not Path(f).is_file():
            raise ServescopeError(f"--task-file {f}: no such file; give a JSONL file of prompt/answer/scorer lines")
        load_user_tasks(f)  # every line read now: a bad one is one line before a simulator starts
    ref = _reference(args.reference, args.sessions_dir) if args.reference is not None else None
    _check_save(args.save)
    _check_contexts(args.url or DEFAULT_URL, tasks, contexts)
    return QualitySpec(tasks=tasks, contexts=contexts, n=args.n, user_sets=tuple(args.task_file), reference=ref,
                       top_k=args.top_k, seed=args.seed, concurrency=args.concurrency,
                       perplexity=not args.no_perplexity)


def _reference(ref: str, sessions_dir: str | None) -> str:
    """--reference SESSION: a session that holds the greedy traces of a quality run (checked before anything
    starts; the probe found a speed session out only after it ran)."""
    s = resolve_session(fields.nonempty_text(ref, "--reference"), Path(sessions_dir) if sessions_dir else None)
    q = s.quality()
    if q is None or not q.traces:
        raise ServescopeError(f"--reference {s.path}: holds no greedy traces to compare against; run `servescope "
                              "quality` on the reference server first and pass that session to --reference")
    return str(s.path)


def _check_save(save: str | None) -> None:
    """--save DIR: an existing session gets the quality results (never one a running sweep writes), an empty or
    new directory a new quality session; anything else is refused before the probe runs."""
    if not save:
        return
    p = Path(save).expanduser()
    refuse_second_writer(p)
    if p.is_dir() and not (p / "session.toml").is_file() and any(p.iterdir()):
        raise ServescopeError(f"--save {p}: holds files but no session; give a session directory (its quality "
                              "results go beside its speed) or a new one")


def _check_contexts(url: str, tasks: tuple[str, ...], contexts: tuple[int, ...]) -> None:
    """The long-context tasks' lengths against a simulator profile's max_model_len, before the simulator starts
    (a real server's is known once it answers, before any question is sent)."""
    profile = sim_profile(url)
    if profile is None or not any(t in ("retrieval", "needle") for t in tasks):
        return
    try:
        max_len = load_profile(url_args(profile)[0]).model.max_model_len
    except (ProfileError, SimStartError):
        return  # the simulator's start says what is wrong with the profile
    for c in contexts:
        if c + ANSWER_ROOM > max_len:
            raise ServescopeError(f"--context {c} does not fit the model's max_model_len {max_len} (with "
                                  f"{ANSWER_ROOM} tokens for the answer); use {max_len - ANSWER_ROOM} or less")


def tls_from_args(args: argparse.Namespace) -> TlsSettings:
    """--ca-cert PATH (a private or self-signed CA, the file checked now) or --insecure (no verification), as `run`
    reads them (engine/spec.py); the system's CAs when neither is given."""
    insecure = getattr(args, "tls_verify", None) is True  # --insecure stores True in tls_verify (a negated option)
    ca_cert = getattr(args, "ca_cert", None)
    if ca_cert is not None and insecure:
        raise ServescopeError("--ca-cert and --insecure: give --ca-cert PATH (verify the server with this CA) or "
                              "--insecure (verify nothing), not both")
    said = "--ca-cert" if ca_cert is not None else "--insecure" if insecure else None
    if said is not None and (rule := tls_without_https(args.url or DEFAULT_URL, said)) is not None:
        raise ServescopeError(rule)
    return TlsSettings.load(ca_cert, verify=not insecure)


def quality_json(session: str, result: QualityResult) -> QualityJson:
    """The Contract's shape: {"session", "perplexity", "tasks": {NAME: {"accuracy", "n"}}, "reference"}."""
    return {"session": session, **result.summary()}


def format_result(path: Path, result: Any, model: str) -> str:
    lines = [f"quality of {clean_text(model)}"]
    if result.perplexity is not None:
        lines.append(f"  perplexity       {result.perplexity:.3f}  (exp of the mean negative log-likelihood over "
                     f"{result.perplexity_tokens:,} corpus tokens)")
    else:
        lines.append(f"  perplexity       not measured: {result.perplexity_note or 'skipped'}")
    if result.tasks:
        lines.append("  task             accuracy   n    95% interval (Wilson)")
        for name, s in result.tasks.items():
            lines.append(f"  {clean_text(name):<16} {s.accuracy * 100:6.1f} %  {s.n:<4} "
                         f"{s.lo * 100:.0f}-{s.hi * 100:.0f} %")
    r = result.reference
    if r is not None:
        lines.append(f"  vs reference {clean_text(result.reference_session or '')}: KL mean {r.kl_mean:.4g} nats, "
                     f"p99 {r.kl_p99:.4g} (top-k, over {r.positions} positions of {r.prompts} prompts); top-1 "
                     f"agreement {r.top1_agreement * 100:.1f} %; greedy outputs differ in {r.diverged} of "
                     f"{r.prompts}, first at token {r.first_divergence_mean:.1f} on average (the generation's "
                     "length when they never do)")
    lines.append(f"saved {path}")
    return "\n".join(lines)


def quality_command(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)  # every flag is checked before a simulator starts
    tls = tls_from_args(args)
    configure(tls)  # every client of the probe checks the server so; --insecure is said once on stderr
    err = sys.stderr
    with ExitStack() as stack:
        url, label = open_target(args.url or DEFAULT_URL, stack, err)

        def progress(text: str) -> None:
            print(text, file=err, flush=True)

        run = asyncio.run(run_quality(url, label, args.model, spec, api_key_from(args, args.api_key_env),
                                      Path(args.save) if args.save else None,
                                      Path(args.sessions_dir) if args.sessions_dir else None, progress,
                                      tokenizer_path=args.tokenizer, tls=tls))
    if args.json:
        print(json.dumps(quality_json(str(run.path), run.result)))
    else:
        print(format_result(run.path, run.result, run.model.id))
    return 0
