"""The quality probe against one target: exact-answer tasks, the perplexity of the shipped corpus, greedy traces
for divergence from a reference session; saved as a session (kind "quality") or into an existing one.

Three instruments (formulas in servescope/core/quality.py and docs/quality.md):
    tasks        arithmetic, key-value retrieval and needle-in-a-haystack at chosen context lengths, strict JSON,
                 and a user's JSONL; greedy (temperature 0), scored exactly, accuracy with a Wilson interval
    perplexity   of the corpus, from the server's prompt log-probabilities (vLLM's `prompt_logprobs`)
    divergence   greedy generations of fixed prompts with top-k log-probabilities; against a reference
                 session's: KL over the positions where both still share their context, top-1 agreement, and
                 where the greedy outputs first part
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import msgspec

from servescope.core import probe
from servescope.core.client import KEEPALIVE_S, async_client
from servescope.core.errors import ServescopeError, error_text
from servescope.core.quality import (
    TASKS,
    QualityResult,
    TaskItem,
    Trace,
    divergence,
    perplexity,
    perplexity_interval,
    score,
    task_score,
)
from servescope.core.results import CellQuality, TaskTally
from servescope.core.target import ModelInfo, TargetInfo, Tokenizer
from servescope.core.tls import TlsSettings
from servescope.engine.connection import HttpTarget
from servescope.sessions.store import SessionWriter, load_session, new_session_dir
from servescope.workloads.quality import DIVERGENCE_PROMPTS, build_tasks, corpus_text, load_user_tasks

T = TypeVar("T")
Progress = Callable[[str], None]

DEFAULT_CONTEXTS = (1024,)
ANSWER_ROOM = 32  # tokens kept free after a long prompt for the answer (and the tokenizer's estimate)


@dataclass(frozen=True)
class QualitySpec:
    """What the probe runs. `contexts` apply to the long-context tasks (retrieval, needle); `user_sets` are JSONL
    files (prompt, answer, scorer); `reference` a session directory holding quality results."""

    tasks: tuple[str, ...] = TASKS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    n: int = 20
    user_sets: tuple[str, ...] = ()
    reference: str | None = None
    top_k: int = 5
    divergence_tokens: int = 32
    perplexity: bool = True
    divergence: bool = True
    seed: int = 0
    concurrency: int = 4
    notes: list[str] = field(default_factory=list, compare=False)

    def settings(self) -> dict[str, object]:
        """What session.toml records (no secrets, no URL)."""
        d = asdict(self)
        d.pop("notes")
        d["tasks"] = list(self.tasks)
        d["contexts"] = list(self.contexts)
        d["user_sets"] = list(self.user_sets)
        return {k: v for k, v in d.items() if v is not None}


def parse_tasks(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        raise ServescopeError(f"unknown task {bad[0] if bad else text!r} in --tasks; use a comma-separated list of "
                              f"{', '.join(TASKS)} (a JSONL of your own goes in --task-file)")
    return names


def parse_contexts(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        p = part.strip().lower()
        if not p:
            continue
        mult = 1024 if p.endswith("k") else 1
        try:
            v = int(float(p[:-1] if p.endswith("k") else p) * mult)
        except ValueError:
            raise ServescopeError(f"bad --context value {part.strip()!r}; use token counts such as 1024,8192 or "
                                  "1k,16k") from None
        if v < 256:
            raise ServescopeError(f"--context {part.strip()} is too short for a long-context task; use 256 tokens "
                                  "or more")
        out.append(v)
    if not out:
        raise ServescopeError("--context is empty; give token counts such as 1024,8192")
    return tuple(dict.fromkeys(out))


async def _bounded(n: int, jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    sem = asyncio.Semaphore(max(1, n))

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _chars_per_token(tokenizer: Tokenizer, sample: str) -> float:
    """Characters per token of the target's tokenizer on English text (a sample of the corpus)."""
    try:
        n = await tokenizer.count_prompt(sample)
    except (ServescopeError, httpx.HTTPError):
        n = 0
    return len(sample) / n if n > 0 else 3.0


def _counter(cpt: float) -> Callable[[str], int]:
    """Tokens of a text from characters per token, 5% over to absorb the tokenizer's variance."""
    return lambda text: math.ceil(len(text) / cpt * 1.05)


async def _task_items(spec: QualitySpec, tokenizer: Tokenizer, max_len: int | None,
                      prose: float | None = None) -> list[TaskItem]:
    """The questions, long prompts sized with the target's own tokenizer: characters per token measured on a
    sample of each long task's text (prose for the needle, keys and numbers for retrieval)."""
    if any(t in ("retrieval", "needle") for t in spec.tasks):
        for c in spec.contexts:
            if max_len is not None and c + ANSWER_ROOM > max_len:
                raise ServescopeError(f"--context {c} does not fit the model's max_model_len {max_len} (with "
                                      f"{ANSWER_ROOM} tokens for the answer); use {max_len - ANSWER_ROOM} or less")
    items: list[TaskItem] = []
    if prose is None:
        prose = await _chars_per_token(tokenizer, corpus_text()[:4000])
    for task in spec.tasks:
        cpt = prose
        if task == "retrieval":
            sample = build_tasks(("retrieval",), (1024,), n=1, seed=spec.seed)[0].prompt
            cpt = await _chars_per_token(tokenizer, sample)
        items.extend(build_tasks((task,), spec.contexts, n=spec.n, seed=spec.seed, count_tokens=_counter(cpt)))
    for path in spec.user_sets:
        items.extend(load_user_tasks(path))
    return items


def _group(item: TaskItem) -> str:
    """The task's name as results show it: `retrieval@8K` for a long-context task, else the task."""
    if item.context:
        k = item.context / 1024
        return f"{item.task}@{k:g}K" if item.context % 1024 == 0 else f"{item.task}@{item.context}"
    return item.task


async def run_probe(http: httpx.AsyncClient, url: str, model: ModelInfo, spec: QualitySpec, tokenizer: Tokenizer,
                    progress: Progress) -> QualityResult:
    """Run the three instruments against `url` and return their results (the reference compared last)."""
    result = QualityResult()
    corpus = corpus_text()
    cpt = await _chars_per_token(tokenizer, corpus[:4000])
    items = await _task_items(spec, tokenizer, model.max_model_len, prose=cpt)
    if items:
        progress(f"tasks: {len(items)} questions, {spec.concurrency} at a time")
        t0 = time.monotonic()
        outputs = await _bounded(spec.concurrency, [
            functools.partial(probe.answer, http, url, model.id, it.prompt, it.max_tokens) for it in items])
        groups: dict[str, list[bool]] = {}
        for it, out in zip(items, outputs, strict=True):
            ok = score(it, out)
            groups.setdefault(_group(it), []).append(ok)
            result.answers.append({"task": _group(it), "context": it.context, "answer": it.answer,
                                   "output": out[:200], "ok": ok})
        result.tasks = {k: task_score(v) for k, v in groups.items()}
        progress(f"tasks done in {time.monotonic() - t0:.1f} s: " + ", ".join(
            f"{k} {v.accuracy * 100:.0f}% of {v.n}" for k, v in result.tasks.items()))
    if spec.perplexity:
        await _perplexity(http, url, model, corpus, cpt, result, progress)
    if spec.divergence or spec.reference:
        progress(f"divergence: {len(DIVERGENCE_PROMPTS)} greedy generations of {spec.divergence_tokens} tokens, "
                 f"top-{spec.top_k} log-probabilities")
        try:
            pairs = await _bounded(spec.concurrency, [
                functools.partial(probe.greedy, http, url, model.id, p, spec.divergence_tokens, spec.top_k)
                for p in DIVERGENCE_PROMPTS])
            result.traces = [t for _, t in pairs]
        except ServescopeError as e:
            if spec.reference:
                raise
            spec.notes.append(f"divergence: {e}")
            progress(f"divergence: not measured ({e})")
    if spec.reference:
        result.reference = divergence(_reference_traces(spec.reference), result.traces)
        result.reference_session = Path(spec.reference).name
    return result


async def _perplexity(http: httpx.AsyncClient, url: str, model: ModelInfo, corpus: str, cpt: float,
                      result: QualityResult, progress: Progress) -> None:
    limit = min(model.max_model_len or 2048, 2048) - ANSWER_ROOM
    chunks = probe.split_text(corpus, max(256, int(limit * cpt / 1.15)))
    progress(f"perplexity: the corpus in {len(chunks)} chunks of up to {limit} tokens")
    logprobs: list[float] = []
    for chunk in chunks:
        lps = await probe.prompt_logprobs(http, url, model.id, chunk)
        if lps is None:
            result.perplexity_note = "the server returns no prompt log-probabilities (vLLM's prompt_logprobs)"
            progress(f"perplexity: not measured: {result.perplexity_note}")
            return
        logprobs.extend(lps)
    result.perplexity = perplexity(logprobs)
    result.perplexity_ci = perplexity_interval(logprobs)
    result.perplexity_tokens = len(logprobs)
    progress(f"perplexity {result.perplexity:.3f} over {len(logprobs)} tokens")


def _reference_traces(ref: str) -> list[Trace]:
    session = load_session(ref)
    q = session.quality()
    if q is None or not q.traces:
        raise ServescopeError(f"{ref}: holds no greedy traces to compare against; run `servescope quality` on the "
                              "reference server first and pass that session to --reference")
    return list(q.traces)


@dataclass
class QualityRun:
    path: Path
    result: QualityResult
    target: TargetInfo
    model: ModelInfo


async def run_quality(url: str, label: str | None, model: str | None, spec: QualitySpec, api_key: str | None,
                      save: Path | None, sessions_dir: Path | None, progress: Progress,
                      tokenizer_path: str | None = None, tls: TlsSettings | None = None) -> QualityRun:
    """Probe the target at `url`, then save: into `save` when it is an existing session (it then holds quality
    results beside its speed), else as a new session of kind "quality". `tls` (--ca-cert, --insecure: core/tls.py;
    None: this process's setting) checks an https target for every request, as a sweep's do; a new session records
    it as a sweep's does (`[target] tls_verify`, `tls_ca`)."""
    if spec.reference:  # a bad reference fails before the probe runs
        _reference_traces(spec.reference)
    conn = HttpTarget(api_key, tokenizer_path=tokenizer_path, tls=tls)
    try:
        target, minfo = await conn.connect(url, model)
        tok = await conn.tokenizer(minfo.id)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        async with async_client(base_url=url, headers=headers, timeout=httpx.Timeout(300.0, connect=10.0),
                                limits=httpx.Limits(max_connections=max(4, spec.concurrency),
                                                    keepalive_expiry=KEEPALIVE_S), tls=conn.tls_settings) as http:
            result = await run_probe(http, url, minfo, spec, tok, progress)
    finally:
        await conn.close()
    existing = save is not None and (save / "session.toml").is_file()
    if existing:
        assert save is not None
        writer = SessionWriter.open(save)
    else:
        path = save or new_session_dir(sessions_dir, f"quality-{minfo.id}")
        meta = {"kind": "quality", "name": f"quality {minfo.id}", "model": minfo.id,
                "max_model_len": minfo.max_model_len,
                "target": {"url": label or target.url, "version": target.version,
                           "metrics": target.metrics_available, "engine": target.engine,
                           **({"tls_verify": target.tls_verify} if target.tls_verify is not None else {}),
                           **({"tls_ca": target.tls_ca} if target.tls_ca else {})}}
        writer = SessionWriter.create(path, meta)
    writer.write_quality(result, spec.settings())
    for note in spec.notes:
        writer.add_event("quality", note)
    if not existing:
        writer.finish("completed")
    return QualityRun(writer.path, result, target, minfo)


# --------------------------------------------------------------------------------------------------------
# quality under load: probe requests mixed into a sweep's cells (`--quality-share`)
# --------------------------------------------------------------------------------------------------------

MIX_TASKS = ("arithmetic", "retrieval", "json")
MIX_CONTEXT = 1024
MIX_TOKENS = 16  # greedy tokens per divergence prompt under load


class QualityMixer:
    """Sends probe requests beside a cell's load, two at most at a time, keeping them near `share` of all the
    cell's requests: exact-answer questions (arithmetic, retrieval at 1K, JSON) in one lane, and in another the
    divergence prompts, whose greedy traces are compared with the same prompts' traces at idle (taken by
    `prepare` before the first cell). The probe requests are not part of the cell's speed figures."""

    def __init__(self, url: str, model: ModelInfo, api_key: str | None, share: float, seed: int = 0) -> None:
        self.url = url
        self.model = model
        self.api_key = api_key
        self.share = share
        self.seed = seed
        self.items: list[TaskItem] = []
        self.idle: dict[str, Trace] = {}
        self.next_item = 0
        self.next_prompt = 0
        self._reset()

    def _reset(self) -> None:
        self.oks: dict[str, list[bool]] = {}
        self.traces: list[Trace] = []
        self.failed = 0
        self.errors: list[str] = []  # why probes failed: the first few distinct one-line messages
        self.ending = False  # the cell's load is done: send no new probe, let the ones out finish

    def _client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return async_client(base_url=self.url, headers=headers, timeout=httpx.Timeout(300.0, connect=10.0),
                            limits=httpx.Limits(max_connections=2, keepalive_expiry=KEEPALIVE_S))

    async def prepare(self, tokenizer: Tokenizer) -> str:
        """Build the questions and take the idle traces; returns a line saying what it did."""
        max_len = self.model.max_model_len
        tasks = tuple(t for t in MIX_TASKS if t != "retrieval" or max_len is None or max_len >= MIX_CONTEXT + ANSWER_ROOM)
        self.items = await _task_items(QualitySpec(tasks=tasks, contexts=(MIX_CONTEXT,), n=50, seed=self.seed),
                                       tokenizer, max_len)
        order = random.Random(self.seed)
        order.shuffle(self.items)
        async with self._client() as http:
            self.idle = {}
            for p in DIVERGENCE_PROMPTS:
                try:
                    _, trace = await probe.greedy(http, self.url, self.model.id, p, MIX_TOKENS, 5)
                except ServescopeError:
                    break
                self.idle[p] = trace
        how = "and greedy traces at idle" if self.idle else "(no divergence: the server returns no log-probabilities)"
        return (f"quality under load: about {self.share * 100:g}% of each cell's requests are probe questions "
                f"({', '.join(tasks)}) {how}")

    async def during(self, counted: Callable[[], int]) -> None:
        """Run beside the load until cancelled; `counted()` is the cell's finished requests so far. The divergence
        prompts and the questions go in two lanes, one probe out in each, sharing one pace and taking turns: a
        question first, then a trace; a lane goes out of turn only while the other's probe is out. A greedy trace
        out does not hold back the cell's questions (one lane of both, a trace first, left a short cell under a
        busy host with its trace and no answer), and a lane whose probe ends just as the pace allows one more
        does not take every turn (the trace lane did, and a short cell had traces and no question)."""
        ratio = self.share / (1 - self.share) if self.share < 1 else 1.0
        sent = 0
        count = {True: 0, False: 0}  # probes sent by the trace lane (True) and the question lane (False)
        busy = {True: False, False: False}  # a lane's probe is out
        both = bool(self.idle) and bool(self.items)  # two lanes to take turns

        def turn(traces: bool) -> bool:
            mine, other = count[traces], count[not traces]
            return not both or busy[not traces] or (mine < other if traces else mine <= other)

        async def lane(http: httpx.AsyncClient, traces: bool) -> None:
            nonlocal sent
            while not self.ending:
                if sent >= ratio * counted() or not turn(traces):
                    await asyncio.sleep(0.05)
                    continue
                sent += 1
                count[traces] += 1
                busy[traces] = True
                try:
                    if traces:
                        p = DIVERGENCE_PROMPTS[self.next_prompt % len(DIVERGENCE_PROMPTS)]
                        self.next_prompt += 1
                        if p in self.idle:
                            _, trace = await probe.greedy(http, self.url, self.model.id, p, MIX_TOKENS, 5)
                            self.traces.append(trace)
                        continue
                    it = self.items[self.next_item % len(self.items)]
                    self.next_item += 1
                    out = await probe.answer(http, self.url, self.model.id, it.prompt, it.max_tokens)
                    self.oks.setdefault(_group(it), []).append(score(it, out))
                except (ServescopeError, httpx.HTTPError) as e:
                    self.failed += 1
                    why = str(e).splitlines()[0][:200] if str(e) else error_text(e)
                    if why not in self.errors and len(self.errors) < 3:
                        self.errors.append(why)
                finally:
                    busy[traces] = False

        async with self._client() as http:
            await asyncio.gather(*([lane(http, True)] if self.idle else []),
                                 *([lane(http, False)] if self.items else []))

    async def finish(self, task: asyncio.Task[None], limit_s: float = 120.0) -> None:
        """The cell's load is done: no new probe; the probes out (sent under the cell's load, so the cell's) may
        finish, `limit_s` at most, then `task` (this mixer's `during`) is cancelled."""
        self.ending = True
        outer = False
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=limit_s)
        except asyncio.CancelledError:  # the mixer's own task cancelled, or this one (the sweep is stopping)
            current = asyncio.current_task()
            outer = current is not None and current.cancelling() > 0
        except Exception:  # noqa: BLE001 - the time is up; a probe's failure was counted by during() already
            pass
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if outer:
            raise asyncio.CancelledError

    def take(self) -> CellQuality | None:
        """The cell's quality figures (as the session stores them), then start over for the next cell.
        None when no probe was sent; a cell whose every probe failed keeps its count and reasons (n 0)."""
        oks, traces, failed, errors = self.oks, self.traces, self.failed, self.errors
        self._reset()
        every = [o for v in oks.values() for o in v]
        if not every and not traces and not failed:
            return None
        total = task_score(every)
        out = CellQuality(accuracy=total.accuracy, n=total.n, correct=total.correct,
                          tasks={k: TaskTally(accuracy=sc.accuracy, n=sc.n, correct=sc.correct)
                                 for k, sc in ((k, task_score(v)) for k, v in oks.items())},
                          failed=failed, errors=list(errors) if errors else None)
        if traces:
            d = divergence(list(self.idle.values()), traces)
            out = msgspec.structs.replace(out, kl_mean=d.kl_mean, kl_p99=d.kl_p99, top1_agreement=d.top1_agreement,
                                          first_divergence_mean=d.first_divergence_mean, positions=d.positions,
                                          prompts=d.prompts, diverged=d.diverged)
        return out
