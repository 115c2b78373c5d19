"""The Compose screen's quality probe (servescope/engine/quality.py does the work), run in a Textual *thread*
worker on an event loop of its own: its progress lines and its result reach the screen only as messages
(`post`, the screen's thread-safe `post_message`). Also here: the probe's fields read as a `QualitySpec`, a
reference session named by directory or id, and the result said as lines and table rows, each number with
its unit and how it was computed.

Imported inside functions, to keep httpx and polars off the app's start-up: engine.quality, sessions.store
(benchmarks/import_cost.py; docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.message import Message

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.tui.wire import app_wording, run_loop

if TYPE_CHECKING:
    from servescope.engine.quality import QualitySpec

Post = Callable[[Any], Any]

# the probe's CLI flags as the Quality pane names its fields
QUALITY_FIELDS = {"--tasks": "the tasks field", "--context": "context", "--reference": "the reference field",
                  "-n": "questions", "--task-file": "`servescope quality --task-file`"}
_FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z-]*)(?![\w-])")
MAX_QUESTIONS = 1000  # per task and context length: more is a long wait for an interval that hardly narrows


def quality_wording(text: str) -> str:
    """An engine message as the Quality pane says it (its field names, not the CLI's flags)."""
    return app_wording(_FLAG.sub(lambda mo: QUALITY_FIELDS.get(mo.group(1), mo.group(1)), clean_text(text)))


@dataclass
class QualityProgress(Message):
    """One line of the running probe's progress (what it is doing, what it found so far)."""

    text: str


@dataclass
class QualityFinished(Message):
    """The probe ended: `run` (an engine QualityRun: .path, .result, .model) or `error` says why not."""

    url: str
    run: Any
    error: str = ""
    seconds: float = 0.0


# ---- the fields -------------------------------------------------------------------------------------------
def parse_questions(text: str) -> int:
    t = text.strip()
    if not t.isdigit() or int(t) < 1:
        raise ServescopeError(f"{t!r} is not a count; give the questions per task and context length, e.g. 20")
    n = int(t)
    if n > MAX_QUESTIONS:
        raise ServescopeError(f"{n} is more than {MAX_QUESTIONS}: use {MAX_QUESTIONS} or less (the 95% interval "
                              "narrows with the square root of the count)")
    return n


def resolve_reference(ref: str, sessions_dir: Path | None = None) -> Path:
    """A session named by its directory, or by its id (a prefix of its directory name) under the sessions
    folder; the path of its directory. Raises ServescopeError saying what is wrong."""
    from servescope.sessions.store import session_dirs, sessions_home

    p = Path(ref).expanduser()
    if (p / "session.toml").is_file():
        return p
    if p.is_dir():
        raise ServescopeError(f"{ref}: not a servescope session (no session.toml in it); see the Sessions screen (F4)")
    base = sessions_dir or sessions_home()
    dirs = session_dirs(base)
    hits = [d for d in dirs if d.name == ref] or [d for d in dirs if d.name.startswith(ref)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        shown = ", ".join(d.name for d in hits[:3]) + (" ..." if len(hits) > 3 else "")
        raise ServescopeError(f"{ref!r} names {len(hits)} sessions ({shown}); give a longer id")
    raise ServescopeError(f"no session {ref!r}: not a session directory, nor an id in the sessions folder (F4 "
                          "lists them)")


def check_field(fid: str, text: str, sessions_dir: Path | None = None) -> tuple[object, str]:
    """(parsed value, error) of one of the probe's fields: q-tasks, q-contexts, q-n, q-reference."""
    from servescope.engine.quality import parse_contexts, parse_tasks

    try:
        if fid == "q-tasks":
            return parse_tasks(text), ""
        if fid == "q-contexts":
            return parse_contexts(text), ""
        if fid == "q-n":
            return parse_questions(text), ""
        if fid == "q-reference":
            return (str(resolve_reference(text.strip(), sessions_dir)) if text.strip() else None), ""
    except ServescopeError as e:
        return None, quality_wording(e.message)
    raise KeyError(fid)


def probe_spec(value: Callable[[str], str], sessions_dir: Path | None = None) -> QualitySpec:
    """The probe's settings from its fields' texts (`value(fid)`), each one checked by `check_field` first."""
    from servescope.engine.quality import QualitySpec, parse_contexts, parse_tasks

    ref = value("q-reference").strip()
    return QualitySpec(tasks=parse_tasks(value("q-tasks")), contexts=parse_contexts(value("q-contexts")),
                       n=parse_questions(value("q-n")),
                       reference=str(resolve_reference(ref, sessions_dir)) if ref else None)


# ---- the run ----------------------------------------------------------------------------------------------
class QualityProbe:
    """One quality probe, run (blocking) from a Textual thread worker; `cancel()` (any thread) ends it."""

    def __init__(self, post: Post) -> None:
        self.post = post
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._lock = threading.Lock()
        self.done = threading.Event()

    def run(self, pool: Any, url: str, api_key_env: str, model: str | None, spec: Any,
            sessions_dir: Path | None) -> None:
        """Start the simulator a sim:// URL names (in the app's pool), probe, save; posts QualityFinished."""
        t0 = time.monotonic()
        try:
            if self._cancelled:
                raise asyncio.CancelledError
            real, label = pool.resolve(url)
            key = os.environ.get(api_key_env) or None  # read here, never shown, never stored
            run = run_loop(self._main(real, label, model, spec, key, sessions_dir))
            self.post(QualityFinished(url, run, seconds=time.monotonic() - t0))
        except ServescopeError as e:
            self.post(QualityFinished(url, None, quality_wording(e.message), time.monotonic() - t0))
        except asyncio.CancelledError:
            self.post(QualityFinished(url, None, "stopped: nothing saved", time.monotonic() - t0))
        except Exception as e:  # keep the app alive: say what broke, in one line
            what = clean_text(str(e))[:300] or type(e).__name__
            self.post(QualityFinished(url, None, f"the probe stopped on an unexpected error: {what}",
                                      time.monotonic() - t0))
        finally:
            self.done.set()

    async def _main(self, url: str, label: str | None, model: str | None, spec: Any, key: str | None,
                    sessions_dir: Path | None) -> Any:
        from servescope.engine.quality import run_quality

        with self._lock:
            self.loop = asyncio.get_running_loop()
            self.task = asyncio.current_task()
            if self._cancelled:
                raise asyncio.CancelledError

        def progress(text: str) -> None:
            self.post(QualityProgress(quality_wording(text)))

        return await run_quality(url, label, model, spec, key, None, sessions_dir, progress)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            loop, task = self.loop, self.task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed meanwhile: the run is over
                pass


# ---- the result, said -------------------------------------------------------------------------------------
ACCURACY_HOW = ("accuracy = correct / n, answers greedy (temperature 0) and scored exactly; interval: Wilson "
                "score at 95%")


def task_rows(result: Any) -> dict[str, Sequence[Any]]:
    """One row per task (and context length): task, accuracy %, n, 95% interval."""
    return {name: [name, f"{s.accuracy * 100:.1f} %", str(s.n), f"{s.lo * 100:.0f}-{s.hi * 100:.0f} %"]
            for name, s in result.tasks.items()}


def perplexity_line(result: Any) -> str:
    if result.perplexity is not None:
        return (f"perplexity {result.perplexity:.3f} (no unit: exp of the mean negative log-likelihood per token, "
                f"over {result.perplexity_tokens:,} tokens of the shipped corpus)")
    return f"perplexity: not measured: {result.perplexity_note or 'skipped'}"


def divergence_line(result: Any, reference_given: bool) -> str:
    r = result.reference
    if r is not None:
        return (f"vs reference {result.reference_session or ''}: KL mean {r.kl_mean:.4g} nats per position, p99 "
                f"{r.kl_p99:.4g} nats (top-k log-probabilities, {r.positions} positions of {r.prompts} greedy "
                f"prompts); top-1 agreement {r.top1_agreement * 100:.1f} % of positions; greedy outputs first differ "
                f"at token {r.first_divergence_mean:.1f} on average")
    if reference_given:
        return "divergence: not compared (see the progress lines below)"
    traces = len(result.traces)
    return ("divergence: no reference given; " + (f"this session's {traces} greedy traces can be the reference of a "
                                                   "later probe" if traces else "no greedy traces were taken"))
