"""The bridge between a sweep and the app, run in a Textual *thread* worker. By default the sweep runs in a runner
process of its own (servescope.engine.detached): it outlives the app, and the app follows the session's event
log (servescope.sessions.live), as it does for a sweep it attaches to. With SERVESCOPE_ENGINE=thread (or when
the runner cannot start) the engine runs on this thread's own asyncio event loop and ends with the app.
Either way results reach the app only through `post` (the app's thread-safe `post_message`), in the
engine's batches (a few per second).

Imported inside functions, to keep httpx and polars off the app's start-up: core.client, core.gpu, core.target,
engine.detached, engine.runner, engine.simtarget, sim.launcher (benchmarks/import_cost.py; docs/developer.md's Layout gives
the figures)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

import msgspec

from servescope.core.errors import ServescopeError
from servescope.core.records import RequestRecord
from servescope.core.textsafe import clean_text
from servescope.engine import wire as w
from servescope.engine.spec import RunContext
from servescope.sessions.live import EventLogReader, runner_state, send_command
from servescope.tui import messages as m
from servescope.tui.wire import Translator, app_wording, run_loop, start_failure

if TYPE_CHECKING:
    from servescope.engine.events import SweepControl
    from servescope.engine.spec import RunContext, SweepSpec

Post = Callable[[m.SweepMessage], object]

CANCEL_GRACE_S = 3.0  # thread mode: after a cancel, how long the engine may take to save the running cell
_STD_LOCK = threading.Lock()


@contextlib.contextmanager
def real_std_streams() -> Iterator[None]:
    """sys.stdout/sys.stderr with real file descriptors while a process is spawned. Inside the app Textual
    replaces them with capture objects whose fileno() is -1, and multiprocessing hands sys.stderr's fd to the
    resource tracker it starts with the first spawn: `ValueError: bad value(s) in fds_to_keep`. os.devnull
    stands in, so nothing the spawned processes write ever lands on the app's screen."""
    def usable(f: TextIO | None) -> bool:
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
    """The profile `sim://` alone means (engine/simtarget.py), "tiny" when the simulator is not installed."""
    try:
        from servescope.engine.simtarget import default_profile

        return default_profile()
    except Exception:  # the simulator is optional for the app
        return "tiny"


def sim_profiles() -> list[str]:
    try:
        from servescope.sim.launcher import list_profiles

        return list(list_profiles())
    except Exception:
        return []


class Simulator(Protocol):
    """A started simulator (servescope.sim.launcher.SimHandle)."""

    @property
    def url(self) -> str: ...

    @property
    def proc(self) -> subprocess.Popen[str]: ...

    def stop(self) -> None: ...


class SimPool:
    """Simulators started for `sim://PROFILE` targets, one per profile and set of flags (a sweep's LoRA adapters:
    engine/serving.py sim_serving_args), reused by probes and sweeps, all stopped when the app exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[tuple[str, tuple[str, ...]], Simulator] = {}

    def resolve(self, url: str, args: Sequence[str] | None = None) -> tuple[str, str | None]:
        """The base URL to talk to and the label to store (`sim://PROFILE` for simulators, else None). `args`: the
        simulator's flags the caller needs (a sweep's: the adapters its workloads name), a simulator started with
        other flags is not reused for them; None (a probe): any simulator of the profile that runs will do."""
        from servescope.engine.simtarget import sim_label, sim_profile, start_simulator

        profile = sim_profile(url)
        if profile is None:
            return url.strip(), None
        with self._lock:
            key = (profile, tuple(args or ()))
            h = self._handles.get(key)
            if args is None and (h is None or h.proc.poll() is not None):
                h = next((x for (p, _), x in self._handles.items() if p == profile and x.proc.poll() is None), None)
            if h is None or h.proc.poll() is not None:
                h = self._handles[key] = start_simulator(profile, key[1])
            return str(h.url), sim_label(profile)

    def stop_all(self) -> None:
        with self._lock:
            handles, self._handles = list(self._handles.values()), {}
        for h in handles:
            try:
                h.stop()
            except Exception:
                pass


def probe_target(pool: SimPool, url: str, api_key_env: str) -> m.ProbeInfo:
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
        "speed": speed or {},
    }


SPEED_TOKENS = 32  # output tokens of the probe's one timed request


async def measure_speed(base_url: str, model: str, api_key: str | None, timeout_s: float = 20.0) -> dict[str, float] | None:
    """Time one short streamed completion, alone on the server: its TTFT (ms) and TPOT (ms per output token),
    for the Compose preview's duration estimate. None when it fails."""
    import time

    from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
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
    """"detached" (the default): the sweep runs in a runner process of its own session, which outlives the app
    (a dropped SSH connection leaves it running) and never shares the app's interpreter lock; the app follows
    its event log. "thread": on this thread's own event loop, ending with the app (SERVESCOPE_ENGINE=thread;
    also the fallback when the runner cannot start)."""
    forced = os.environ.get("SERVESCOPE_ENGINE", "").strip().lower()
    return "thread" if forced == "thread" else "detached"


FOLLOW_POLL_S = 0.1  # how often an attached app reads the event log


class SweepDriver:
    """Runs or follows one sweep to its end, posting app messages, from a Textual thread worker.

    - `run(spec, ...)` in mode "detached": starts the runner process (servescope.engine.detached) and follows
      its session; in mode "thread": runs the engine on this thread's own event loop.
    - `follow(path)`: attach to a sweep already running (started by `servescope run --detach`, another app, or
      this app before it was closed).
    Controls (skip, stop) go to the runner through the session's control file, or straight to the engine in
    thread mode."""

    def __init__(self, post: Post, mode: str | None = None) -> None:
        self.post = post
        self.mode = mode or engine_mode()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[str] | None = None
        self.control: SweepControl | None = None
        self._cancelled = False
        self.session_dir: Path | None = None  # the followed session (detached and attached sweeps)
        self.running_cell: int | None = None
        self.own = True  # this app started the sweep: its messages name the Compose fields
        self.engine_pid: int | None = None  # the process the sweep runs in (this one in thread mode)
        self.done = threading.Event()  # set when run()/follow() returns
        self.aborted = False
        self._leave = threading.Event()  # stop following (the app leaves; the sweep goes on)
        self._started = False  # a SweepStarted was seen

    def run(self, spec: SweepSpec, pool: SimPool, sessions_dir: Path | None) -> str:
        """Run `spec` (a SweepSpec) to its end; the sweep's final status."""
        try:
            return self._run(spec, pool, sessions_dir)
        finally:
            self.done.set()

    def follow(self, path: Path) -> str:
        """Follow the sweep of session `path` to its end (or until the app leaves); its final status."""
        self.own = False
        try:
            return self._follow(Path(path))
        finally:
            self.done.set()

    @property
    def detached(self) -> bool:
        """The sweep lives in a runner process of its own (it may outlive the app)."""
        return self.session_dir is not None

    def _post_items(self, items: Sequence[w.Item]) -> str | None:
        """Post the items as app messages; the sweep's final status when one says it finished."""
        status = None
        for item in items:
            if isinstance(item, w.SweepFinished):
                status = item.status
                if not self._started:  # it ended before its session was made: there is no session to show
                    item = msgspec.structs.replace(item, session_dir=None)
                if self.own:
                    item = msgspec.structs.replace(item, message=app_wording(item.message))
            elif isinstance(item, w.EngineNotice) and self.own:
                item = msgspec.structs.replace(item, text=app_wording(item.text))
            elif isinstance(item, w.CellStarted):
                self.running_cell = item.cell.index
            elif isinstance(item, w.SweepStarted):
                self._started = True
                self.engine_pid = item.engine_pid or self.engine_pid
            self.post(m.message(item))
        return status

    def _run(self, spec: SweepSpec, pool: SimPool, sessions_dir: Path | None) -> str:
        from servescope.engine import runner, serving  # one import: the house keeps few inside functions
        self.control = runner.SweepControl()
        try:
            ctx = RunContext(api_key=os.environ.get(spec.api_key_env) or None, sessions_dir=sessions_dir)
            if self.mode == "detached":
                status = self._run_detached(spec, ctx)
                if status is not None:
                    return status
                self.mode = "thread"  # the runner did not start: fall back
            # a launched server is started by the engine itself ([server] launch); its URL comes from its command
            url, label = ("", None) if spec.launch else pool.resolve(spec.url, serving.sim_serving_args(spec.workloads))
            result: str = run_loop(self._main(spec, replace(ctx, url=url, target_label=label)))
            return result
        except ServescopeError as e:
            self._post_end("failed", app_wording(clean_text(e.message)))
            return "failed"
        except asyncio.CancelledError:
            self._post_end("interrupted", "the app closed during the sweep")
            return "interrupted"
        except Exception as e:  # keep the app alive: show what broke, in one line
            self._post_end("failed", f"the sweep stopped on an unexpected error: "
                                     f"{clean_text(str(e))[:300] or type(e).__name__}")
            return "failed"

    def _post_end(self, status: str, message: str, session_dir: Path | None = None) -> None:
        self.post(m.SweepFinished(w.SweepFinished(session_dir, status, message)))

    async def _main(self, spec: SweepSpec, ctx: RunContext) -> str:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.engine_pid = os.getpid()
        if self._cancelled:
            raise asyncio.CancelledError
        from servescope.engine import runner as r
        translate = Translator(ctx.target_label)
        status = "failed"
        async for ev in r.run_sweep(spec, ctx, self.control):
            done = self._post_items(translate(ev))
            if done is not None:
                status = done
        return status

    def _run_detached(self, spec: SweepSpec, ctx: RunContext) -> str | None:
        """Start the runner and follow it; None when it could not be started (the thread runs it instead)."""
        from servescope.engine.detached import discard_unstarted, start_runner, wait_started

        if self._cancelled:
            raise asyncio.CancelledError
        try:
            with real_std_streams():
                path, proc = start_runner(spec, ctx)
        except ServescopeError:
            raise
        except Exception as e:  # e.g. a sweep that does not pickle: use the thread
            self.post(m.EngineNotice(w.EngineNotice("warning", start_failure(e))))
            return None
        self.engine_pid = proc.pid
        err = wait_started(path, proc, wait_s=30.0)
        if err:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
            discard_unstarted(path)
            raise ServescopeError(err)
        try:
            return self._follow(path, proc)
        finally:  # the runner is this app's child: reaped when it ends (no `<defunct>` left until the next sweep)
            threading.Thread(target=_reap, args=(proc,), name="servescope-reap-runner", daemon=True).start()

    def _follow(self, path: Path, proc: subprocess.Popen[bytes] | None = None) -> str:
        """Post the session's logged events, then the new ones as they come, until the sweep ends, its runner
        dies, or the app leaves (status "detached": it goes on without us)."""
        self.session_dir = path
        reader = EventLogReader(path)
        first = True
        idle = 0
        try:
            while not self._leave.is_set():
                items = read_items(reader)
                if first:  # attaching: catch up on what the sweep did so far, without its old request batches
                    more = items
                    while more:
                        more = read_items(reader)
                        items += more
                    items = catch_up(items)
                    first = False
                if items:
                    idle = 0
                    status = self._post_items(items)
                    if status is not None:
                        return status
                    continue
                idle += 1
                if idle % 10 == 0 and not runner_state(path).running and (proc is None or proc.poll() is not None):
                    if reader.poll():  # its last words arrived meanwhile: read them on the next turn
                        continue
                    why = runner_state(path).reason or "its runner ended"
                    self._post_end("interrupted", f"the sweep is not running: {why}; continue it with "
                                                  f"`servescope resume {path}`", path)
                    return "interrupted"
                self._leave.wait(FOLLOW_POLL_S)
            return "detached"
        finally:
            reader.close()

    # thread-safe controls ------------------------------------------------------------------------
    def skip_cell(self) -> None:
        """Skip the running cell: its in-flight requests are cancelled and it is saved as `skipped`."""
        if self.session_dir is not None:
            send_command(self.session_dir, "skip", self.running_cell)
        elif self.control is not None:
            self.control.skip_cell("skipped by the user")

    def stop(self) -> None:
        """Stop the sweep after the running cell's in-flight requests (no new ones are sent); called again,
        cancel those requests."""
        if self.session_dir is not None:
            send_command(self.session_dir, "stop")
        elif self.control is not None:
            self.control.stop("stopped by the user", let_in_flight_finish=True)

    def leave(self) -> None:
        """Stop following: the app leaves, a detached sweep goes on."""
        self._leave.set()

    def abort(self) -> None:
        """Leave at once (a second ctrl+q)."""
        self.aborted = True
        self.cancel()

    def cancel(self) -> None:
        """End the sweep now (the app is closing and the user chose to stop it): the runner cancels the running
        cell's requests and saves it as interrupted; finished cells stay."""
        self._cancelled = True
        if self.session_dir is not None:
            send_command(self.session_dir, "stop")
            send_command(self.session_dir, "stop")  # the second stop cancels the in-flight requests
            self._leave.set()
            return
        if self.control is not None:
            self.control.stopping = True
        loop, task = self.loop, self.task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a runner process to end (a sweep left running goes on; its exit is collected when it comes)."""
    with contextlib.suppress(Exception):
        proc.wait()


def read_items(reader: EventLogReader) -> list[w.Item]:
    """The items logged since the last read (a line this servescope cannot read is left out)."""
    return [item for k, f in reader.poll() if (item := w.decode_item(k, f)) is not None]


def catch_up(items: list[w.Item]) -> list[w.Item]:
    """What an app attaching mid-sweep needs of the log so far: every item but the request batches of cells
    already finished and all but the newest telemetry sample (their figures are in the finished cells)."""
    ended = {x.cell.index for x in items if isinstance(x, (w.CellFinished, w.CellSkipped))}
    last_tele = max((i for i, x in enumerate(items) if isinstance(x, w.TelemetryUpdated)), default=-1)
    return [x for i, x in enumerate(items)
            if not (isinstance(x, w.RequestsMeasured) and x.cell.index in ended)
            and not (isinstance(x, w.TelemetryUpdated) and i != last_tele)]
