"""The bridge between the engine and the app, run in a Textual *thread* worker. The engine runs either in a
separate process (servescope.tui.engineproc; the default when two or more CPUs are usable, so the app's
repaints and the load never share an interpreter lock) or on this thread's own asyncio event loop (one
CPU, SERVESCOPE_ENGINE=thread, or when the process cannot start). Either way results reach the app only
through `post` (the app's thread-safe `post_message`), in the engine's batches (a few per second)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.tui import messages as m
from servescope.tui.wire import app_wording, run_loop, start_failure

Post = Callable[[Any], Any]

CANCEL_GRACE_S = 3.0  # after a cancel, how long the engine process may take to save before it is terminated
_STD_LOCK = threading.Lock()


@contextlib.contextmanager
def real_std_streams() -> Iterator[None]:
    """sys.stdout/sys.stderr with real file descriptors while a process is spawned. Inside the app Textual
    replaces them with capture objects whose fileno() is -1, and multiprocessing hands sys.stderr's fd to the
    resource tracker it starts with the first spawn: `ValueError: bad value(s) in fds_to_keep`. os.devnull
    stands in, so nothing the spawned processes write ever lands on the app's screen."""
    def usable(f: Any) -> bool:
        try:
            return f is not None and f.fileno() >= 0
        except (AttributeError, ValueError, OSError):
            return False

    with _STD_LOCK:
        if usable(sys.stdout) and usable(sys.stderr):
            yield
            return
        saved = sys.stdout, sys.stderr
        with open(os.devnull, "w") as null:  # noqa: PTH123
            sys.stdout = sys.stdout if usable(sys.stdout) else null
            sys.stderr = sys.stderr if usable(sys.stderr) else null
            try:
                yield
            finally:
                sys.stdout, sys.stderr = saved


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


def probe_target(pool: SimPool, url: str, api_key_env: str) -> dict[str, Any]:
    """Blocking probe (run it in a thread worker): models, version, max length, /metrics, local GPUs."""
    from servescope.core.target import probe

    key = os.environ.get(api_key_env) or None
    try:
        real, label = pool.resolve(url)
        info = run_loop(probe(real, key))
    except ServescopeError as e:  # said as the app's fields are named ("check the URL field")
        raise ServescopeError(app_wording(e.message)) from None
    speed = None
    if len(info.models) == 1:  # with several, the model to time is not known yet
        try:
            speed = run_loop(measure_speed(real, info.models[0].id, key))
        except Exception:  # the estimate then stays a guess; the probe itself succeeded
            speed = None
    return {
        "url": label or info.url,
        "models": [(mi.id, mi.max_model_len) for mi in info.models],
        "version": info.version,
        "metrics": info.metrics_available,
        "gpus": local_gpus(),
        "speed": speed,
    }


SPEED_TOKENS = 32  # output tokens of the probe's one timed request


async def measure_speed(base_url: str, model: str, api_key: str | None, timeout_s: float = 20.0) -> dict[str, float] | None:
    """Time one short streamed completion, alone on the server: its TTFT (ms) and TPOT (ms per output token),
    for the Compose preview's duration estimate. None when it fails."""
    import time

    from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
    from servescope.core.records import RequestRecord

    opts = ClientOptions(base_url=base_url, model=model, api_key=api_key, timeout_s=timeout_s)
    spec = RequestSpec("completions", "Say hello. " * 4, 16, SPEED_TOKENS)
    rec = RequestRecord(index=0, user=0, warmup=True, input_tokens_requested=16,
                        output_tokens_requested=SPEED_TOKENS, scheduled_ns=time.perf_counter_ns())
    async with make_http_client(opts, 1) as http:
        await asyncio.wait_for(stream_request(http, opts, spec, rec), timeout_s)
    if rec.status != "ok" or not rec.first_token_ns or rec.output_tokens < 2:
        return None
    ttft = (rec.first_token_ns - rec.sent_ns) / 1e6
    tpot = (rec.end_ns - rec.first_token_ns) / 1e6 / (rec.output_tokens - 1)
    return {"ttft_ms": ttft, "tpot_ms": tpot}


def local_gpus() -> list[str]:
    """GPUs NVML sees on this machine ("" list when there is no NVML or no GPU)."""
    from servescope.core.gpu import describe_gpus

    return describe_gpus()


def engine_mode() -> str:
    """"process" when the app and the load would otherwise share a core (the interpreter lock makes a
    thread worker share the app's core whatever the machine): whenever this process may use two or more
    CPUs. "thread" on one CPU, where a second process gains nothing. SERVESCOPE_ENGINE=thread|process
    overrides."""
    forced = os.environ.get("SERVESCOPE_ENGINE", "").strip().lower()
    if forced in ("thread", "process"):
        return forced
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return "process" if cpus >= 2 else "thread"


class SweepDriver:
    """Runs one sweep to its end, posting app messages, from a Textual thread worker. mode "thread": the
    engine runs on this thread's own event loop. mode "process": it runs in a spawned process
    (servescope.tui.engineproc) and this thread only relays its event batches; if the process cannot
    start, the thread path runs instead."""

    def __init__(self, post: Post, mode: str | None = None) -> None:
        self.post = post
        self.mode = mode or engine_mode()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.control: Any = None
        self._cancelled = False
        self._conn: Any = None
        self._lock = threading.Lock()
        self.engine_pid: int | None = None  # the process the engine runs in (this one in thread mode)
        self.done = threading.Event()  # set when run() returns: the session is as the engine left it
        self.aborted = False  # abort(): the app leaves at once, the engine process is terminated

    def run(self, spec: Any, pool: SimPool, sessions_dir: Path | None) -> str:
        """Run `spec` (a SweepSpec) to its end; the sweep's final status."""
        try:
            return self._run(spec, pool, sessions_dir)
        finally:
            self.done.set()

    def _post_items(self, items: list[tuple[str, dict[str, Any]]]) -> str | None:
        """Post the items as app messages; the sweep's final status when one says it finished."""
        status = None
        for kind, fields in items:
            if kind == "SweepFinished":
                status = str(fields["status"])
            self.post(m.from_wire(kind, fields))
        return status

    def _run(self, spec: Any, pool: SimPool, sessions_dir: Path | None) -> str:
        from servescope.engine.runner import SweepControl
        from servescope.engine.spec import RunContext

        self.control = SweepControl()
        try:
            # a launched server is started by the engine itself ([server] launch); its URL comes from its command
            url, label = ("", None) if spec.launch else pool.resolve(spec.url)
            ctx = RunContext(url=url, target_label=label, api_key=os.environ.get(spec.api_key_env) or None,
                             sessions_dir=sessions_dir)
            if self.mode == "process":
                status = self._run_process(spec, ctx)
                if status is not None:
                    return status
                self.mode = "thread"  # the process did not start: fall back
            result: str = run_loop(self._main(spec, ctx))
            return result
        except ServescopeError as e:
            self.post(m.SweepFinished(None, "failed", app_wording(clean_text(e.message))))
            return "failed"
        except asyncio.CancelledError:
            self.post(m.SweepFinished(None, "interrupted", "the app closed during the sweep"))
            return "interrupted"
        except Exception as e:  # keep the app alive: show what broke, in one line
            self.post(m.SweepFinished(None, "failed", f"the sweep stopped on an unexpected error: "
                                                      f"{clean_text(str(e))[:300] or type(e).__name__}"))
            return "failed"

    async def _main(self, spec: Any, ctx: Any) -> str:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.engine_pid = os.getpid()
        if self._cancelled:
            raise asyncio.CancelledError
        from servescope.engine import runner as r
        from servescope.tui.wire import Translator

        translate = Translator(ctx.target_label)
        status = "failed"
        async for ev in r.run_sweep(spec, ctx, self.control):
            done = self._post_items(translate(ev))
            if done is not None:
                status = done
        return status

    def _run_process(self, spec: Any, ctx: Any) -> str | None:
        """Relay the engine process's batches until it ends; None when it could not be started."""
        import multiprocessing as mp
        import time

        from servescope.tui import engineproc

        if self._cancelled:
            raise asyncio.CancelledError
        mpc = mp.get_context("spawn")
        here, there = mpc.Pipe(duplex=True)
        proc = mpc.Process(target=engineproc.main, args=(there, spec, ctx),
                           name="servescope-engine", daemon=True)
        try:
            with real_std_streams():  # Textual's stderr has no fd: the spawn would fail on it
                proc.start()
        except Exception as e:  # e.g. a sweep that does not pickle, or no /dev/shm: use the thread
            self.post(m.EngineNotice("warning", start_failure(e)))
            here.close()
            there.close()
            return None
        there.close()
        self.engine_pid = proc.pid
        with self._lock:
            self._conn = here
        status: str | None = None
        cancel_at: float | None = None
        try:
            while True:
                if self._cancelled and cancel_at is None:
                    self._send(("cancel",))
                    cancel_at = time.monotonic()
                if self.aborted:
                    proc.terminate()
                    break
                if cancel_at is not None and time.monotonic() - cancel_at > CANCEL_GRACE_S:
                    proc.terminate()  # it did not save in time: the session then reads as interrupted
                    break
                try:
                    ready = here.poll(0.1)
                    batch = here.recv() if ready else None
                except (EOFError, OSError):
                    break
                if batch is None:
                    if not proc.is_alive() and not here.poll(0):
                        break
                    continue
                if batch and batch[0][0] == engineproc.END:
                    break
                done = self._post_items(batch)
                if done is not None:
                    status = done
        finally:
            with self._lock:
                self._conn = None
            here.close()
            proc.join(timeout=CANCEL_GRACE_S if self._cancelled else 5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        if status is None:
            status = "interrupted" if self._cancelled else "failed"
            why = ("the app closed during the sweep" if self._cancelled
                   else f"the engine process ended unexpectedly (exit code {proc.exitcode})")
            self.post(m.SweepFinished(None, status, why))
        return status

    def _send(self, cmd: tuple[str, ...]) -> bool:
        with self._lock:
            conn = self._conn
            if conn is None:
                return False
            try:
                conn.send(cmd)
                return True
            except (OSError, ValueError):
                return False

    # thread-safe controls ------------------------------------------------------------------------
    def skip_cell(self) -> None:
        """Skip the running cell: its in-flight requests are cancelled and it is saved as `skipped`."""
        if self._send(("skip",)):
            return
        if self.control is not None:
            self.control.skip_cell("skipped by the user")

    def stop(self) -> None:
        """Stop the sweep after the running cell's in-flight requests (no new ones are sent); called again,
        cancel those requests."""
        if self._send(("stop",)):
            return
        if self.control is not None:
            self.control.stop("stopped by the user", let_in_flight_finish=True)

    def abort(self) -> None:
        """Leave at once (a second ctrl+q): cancel, and terminate the engine process without waiting for it
        to save the running cell (the session then reads as interrupted; finished cells are on disk)."""
        self.aborted = True
        self.cancel()

    def cancel(self) -> None:
        """End the sweep now (the app is closing): the engine cancels the running cell's requests and saves
        it as interrupted; finished cells stay."""
        self._cancelled = True  # the process relay sends ("cancel",) on its next turn
        if self.control is not None:
            self.control.stopping = True
        loop, task = self.loop, self.task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass
