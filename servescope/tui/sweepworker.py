"""The bridge between the engine and the app. Everything here runs in a Textual *thread* worker with its
own asyncio event loop, so a slow repaint can never delay a request timestamp; results reach the app only
through `post` (the app's thread-safe `post_message`), in the engine's batches (a few per second)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.tui import messages as m

Post = Callable[[Any], Any]


def default_sim_profile() -> str:
    try:
        from servescope.sim.profile import DEFAULT_PROFILE

        return str(DEFAULT_PROFILE)
    except Exception:  # the simulator is optional for the app
        return "tiny"


def sim_profiles() -> list[str]:
    try:
        from servescope.sim.launcher import list_profiles

        return list(list_profiles())
    except Exception:
        return []


class SimPool:
    """Simulators started for `sim://PROFILE` targets; one per profile, reused by probes and sweeps,
    all stopped when the app exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}

    def resolve(self, url: str) -> tuple[str, str | None]:
        """The base URL to talk to and the label to store (`sim://NAME` for simulators, else None)."""
        url = url.strip()
        if not url.startswith("sim://"):
            return url, None
        profile = url[len("sim://"):].strip("/") or default_sim_profile()
        with self._lock:
            h = self._handles.get(profile)
            if h is not None and h.proc.poll() is None:
                return str(h.url), f"sim://{profile}"
            try:
                from servescope.sim.launcher import SimStartError, start_sim
            except ImportError:
                raise ServescopeError("the built-in simulator is not available in this install; give an http:// URL") from None
            try:
                h = start_sim(profile)
            except SimStartError as e:
                raise ServescopeError(e.message) from None
            self._handles[profile] = h
            return str(h.url), f"sim://{profile}"

    def stop_all(self) -> None:
        with self._lock:
            handles, self._handles = list(self._handles.values()), {}
        for h in handles:
            try:
                h.stop()
            except Exception:
                pass


def _run(coro: Any) -> Any:
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            return r.run(coro)
    except ImportError:
        return asyncio.run(coro)


def probe_target(pool: SimPool, url: str, api_key_env: str) -> dict[str, Any]:
    """Blocking probe (run it in a thread worker): models, version, max length, /metrics, local GPUs."""
    from servescope.core.target import probe

    real, label = pool.resolve(url)
    info = _run(probe(real, os.environ.get(api_key_env) or None))
    return {
        "url": label or info.url,
        "models": [(mi.id, mi.max_model_len) for mi in info.models],
        "version": info.version,
        "metrics": info.metrics_available,
        "gpus": local_gpus(),
    }


def local_gpus() -> list[str]:
    """GPUs NVML sees on this machine ("" list when there is no NVML or no GPU)."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml  # type: ignore[import-untyped]

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
            out.append(f"{i}: {name if isinstance(name, str) else name.decode()} ({mem:.0f} GiB)")
        return out
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def reduce_records(records: list[Any]) -> tuple[list[float], list[float], list[float], list[float], int,
                                                list[tuple[str, str]]]:
    """Per-request TTFT, TPOT, E2E (ms) and per-user tok/s of a batch, computed by core.metrics (the one
    definition), plus the batch's output tokens and its errors."""
    from servescope.core.metrics import per_request, records_frame

    measured = [r for r in records if not r.warmup]
    if not measured:
        return [], [], [], [], 0, []
    pr = per_request(records_frame(measured))
    ok = pr.filter(pr["status"] == "ok")
    errors = [(str(s), clean_text(str(e))[:200]) for s, e in zip(pr["status"], pr["error"], strict=True) if s != "ok"]
    return (
        ok["ttft_ms"].drop_nulls().to_list(),
        ok["tpot_ms"].drop_nulls().to_list(),
        ok["e2e_ms"].drop_nulls().to_list(),
        ok["per_user_tok_s"].drop_nulls().to_list(),
        int(ok["output_tokens"].sum() or 0),
        errors,
    )


class SweepDriver:
    """Runs one sweep to its end on the calling thread's own event loop, posting app messages."""

    def __init__(self, post: Post) -> None:
        self.post = post
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.control: Any = None
        self._cancelled = False

    def run(self, sweep: dict[str, Any], pool: SimPool, sessions_dir: Path | None) -> str:
        from servescope.sessions.runner import SweepControl
        from servescope.sessions.sweepfile import plan_from_sweep

        self.control = SweepControl()
        try:
            url, label = pool.resolve(sweep["url"])
            key = os.environ.get(sweep.get("api_key_env") or "OPENAI_API_KEY") or None
            plan = plan_from_sweep(sweep, url, label, api_key=key, sessions_dir=sessions_dir)
            status: str = _run(self._main(plan))
            return status
        except ServescopeError as e:
            self.post(m.SweepFinished(None, "failed", clean_text(e.message)))
            return "failed"
        except asyncio.CancelledError:
            self.post(m.SweepFinished(None, "interrupted", "the app closed during the sweep"))
            return "interrupted"
        except Exception as e:  # keep the app alive: show what broke
            self.post(m.SweepFinished(None, "failed", f"unexpected {type(e).__name__}: {clean_text(str(e))[:300]}"))
            return "failed"

    async def _main(self, plan: Any) -> str:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        if self._cancelled:
            raise asyncio.CancelledError
        from servescope.sessions import runner as r

        post = self.post
        status = "failed"
        async for ev in r.run_sweep(plan, self.control):
            if isinstance(ev, r.RequestsDone):
                info = m.CellInfo.from_cell(ev.cell)
                ttft, tpot, e2e, per_user, out_tok, errors = reduce_records(ev.records)
                post(m.RequestsMeasured(info, ttft, tpot, e2e, per_user, out_tok, ev.done, ev.failed, ev.elapsed_s,
                                        errors))
            elif isinstance(ev, r.CellStarted):
                post(m.CellStarted(m.CellInfo.from_cell(ev.cell), ev.total))
            elif isinstance(ev, r.CellFinished):
                post(m.CellFinished(m.CellInfo.from_cell(ev.cell), ev.summary, ev.status, clean_text(ev.reason)))
            elif isinstance(ev, r.CellSkipped):
                post(m.CellSkipped(m.CellInfo.from_cell(ev.cell), clean_text(ev.reason)))
            elif isinstance(ev, r.Notice):
                post(m.EngineNotice(ev.level, clean_text(ev.text)))
            elif isinstance(ev, r.SweepStarted):
                post(m.SweepStarted(ev.session_dir, [m.CellInfo.from_cell(c) for c in ev.cells], ev.target.url
                                    if not plan.target_label else plan.target_label, ev.model, ev.target.version,
                                    ev.tokenizer, ev.target.metrics_available))
            elif isinstance(ev, r.SweepFinished):
                status = ev.status
                post(m.SweepFinished(ev.session_dir, ev.status, clean_text(ev.message)))
        return status

    # thread-safe controls ------------------------------------------------------------------------
    def skip_cell(self) -> None:
        if self.control is not None:
            self.control.skip_cell("skipped from the app")

    def stop(self) -> None:
        if self.control is not None:
            self.control.stop("stopped from the app")

    def cancel(self) -> None:
        """Abort now (the app is closing): the running cell is marked interrupted, finished cells stay."""
        self._cancelled = True
        if self.control is not None:
            self.control.stopping = True
        loop, task = self.loop, self.task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass
