"""The sweep runner: plans cells (workload x load, per server variant), builds their prompts, runs them, saves
each finished cell to the session before the next starts, recovers a server lost mid-cell, and yields a
stream of events. The headless CLI, the TUI and the tests are three consumers of the same `run_sweep()`.

Its collaborators are Protocols with real defaults, so it runs in-process with fakes:
`target` (connection.Target: probe, tokenizer, the load), `servers` (server.ServerManager: launch, health,
recovery), `telemetry` (telemetryhub.Telemetry), `sink` (sink.SinkFactory: the session store)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError, error_text
from servescope.core.load import CellControl, Limits, Load, warm_prompts
from servescope.core.prices import Prices
from servescope.core.records import RequestRecord
from servescope.core.secrets import redact_command
from servescope.core.steady import ramp_from_probe
from servescope.core.target import ModelInfo, TargetInfo, Tokenizer
from servescope.core.textsafe import clean_text
from servescope.core.tls import configure as configure_tls
from servescope.engine.background import Background
from servescope.engine.bus import Bus, BusFactory, SweepBus
from servescope.engine.cell import CellAttempt
from servescope.engine.connection import HttpTarget, Target
from servescope.engine.events import (
    CellFinished,
    CellSkipped,
    CellStarted,
    Event,
    KvBudgetKnown,
    Notice,
    RequestsDone,
    SweepControl,
    SweepFinished,
    SweepStarted,
    TelemetrySample,
)
from servescope.engine.interference import PROBE_INPUT, PROBE_OUTPUT
from servescope.engine.measure import CellMeasure, ceiling_text
from servescope.engine.plan import (
    DEFAULT_CONCURRENCY,
    DEFAULT_REQUESTS,
    Cell,
    fits,
    plan_cells,
    prompts_to_build,
)
from servescope.engine.quality import QualityMixer
from servescope.engine.series import SweepSeries
from servescope.engine.server import ServerManager, Servers, launched_startup
from servescope.engine.serving import PrefixReset, block_sized, serving_specs, startup_text
from servescope.engine.sessionmeta import ran_with, session_meta
from servescope.engine.sink import FINISHED, SessionSink, SinkFactory
from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.telemetryhub import (
    KvBudgetMeta,
    Telemetry,
    TelemetryHub,
    kv_budget_meta,
    kv_budget_text,
    request_tokens,
)
from servescope.sessions.live import SessionWriteError
from servescope.sessions.meta import InputLengths, SessionMeta
from servescope.sessions.store import SessionWriter, new_session_dir
from servescope.workloads.prompts import CalibratedTokenizer, build_prompts, calibration_texts
from servescope.workloads.spec import Workload, fixed
from servescope.workloads.traces import trace_prompts, workload_trace

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_REQUESTS", "FINISHED", "Cell", "CellFinished", "CellSkipped",
           "CellStarted", "Event", "KvBudgetKnown", "Notice", "RequestsDone", "SweepControl", "SweepFinished",
           "SweepStarted", "TelemetrySample", "plan_cells", "run_sweep"]

MAX_ATTEMPTS = 3  # runs of one cell, lost ones included
CALIBRATION_RETRY_S = 30.0  # a calibration probe rate-limited (HTTP 429) waits at most this long to be sent again


async def run_sweep(spec: SweepSpec, ctx: RunContext, control: SweepControl | None = None, *,
                    target: Target | None = None, servers: ServerManager | None = None,
                    telemetry: Telemetry | None = None, sink: SinkFactory | None = None,
                    bus: BusFactory | None = None) -> AsyncIterator[Event]:
    """Run the sweep and yield events. Setup problems raise ServescopeError before any cell runs. Every
    event also goes to the session's bus (`bus`, default engine.bus.SweepBus: the lock, the event log that
    viewers follow, the control file they write)."""
    control = control or SweepControl()
    control.loop = asyncio.get_running_loop()
    cells = plan_cells(spec)
    if not cells:
        raise ServescopeError("the sweep has no cells: give at least one workload and one load level")
    bg = Background() if servers is None or telemetry is None else None
    if sink is None:
        sink = SessionWriter
    tls = spec.tls_settings()  # --ca-cert / --insecure: every client of the run checks the server so (core/tls.py)
    configure_tls(tls)
    run = _Sweep(spec, ctx, control, cells,
                 target or HttpTarget(ctx.api_key, spec.tokenizer, spec.engine, workers=spec.workers, ray=spec.ray,
                                      ray_nodes=spec.ray_nodes, tls=tls),
                 servers or Servers(spec, ctx.url, ctx.api_key, _need(bg), lambda: control.stopping),
                 telemetry or TelemetryHub(_need(bg), spec.telemetry_interval_s, ctx.api_key,
                                           spec.electricity_price),
                 sink, bg, bus or SweepBus)
    try:
        async for ev in run.events():
            if run.bus is not None:
                run.bus.publish(ev)
            yield ev
    except ServescopeError as e:
        if run.bus is not None and run.path is not None:
            run.bus.publish(SweepFinished(run.path, "failed", e.message))
        if run.made is not None and not run.measured():  # nothing measured: the folder this run made goes
            if run.bus is not None:
                run.bus.close()
                run.bus = None
            message = discard_unmeasured(run.made, e.message)
            if message != e.message:
                raise ServescopeError(message) from None
        raise
    except (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit):
        if run.bus is not None and run.path is not None:
            run.bus.publish(SweepFinished(run.path, "interrupted", "interrupted"))
        raise
    finally:
        if run.bus is not None:
            run.bus.close()


def discard_unmeasured(folder: Path, message: str) -> str:
    """Remove `folder`, a session folder a run made and measured nothing in (a server that would not launch, a target
    that would not answer): a failed run leaves no session behind. A launched server's log that `message` names
    (`server-N.log`, at any depth: it says why the server did not start) is moved to a folder of its own under the
    system's temporary directory first; returns `message` with its path changed to the new one."""
    logs = [p for p in sorted(folder.rglob("server-*.log")) if str(p) in message] if folder.is_dir() else []
    if logs:
        keep = Path(tempfile.mkdtemp(prefix=f"servescope-{folder.name}-"))
        for log in logs:
            dest = keep / "-".join(log.relative_to(folder).parts)
            with contextlib.suppress(OSError):
                shutil.move(str(log), dest)
                message = message.replace(str(log), str(dest))
    shutil.rmtree(folder, ignore_errors=True)
    return message


def _need(bg: Background | None) -> Background:
    assert bg is not None
    return bg


class _Sweep:
    """State of one sweep: the cells, the collaborators, the session, the label the target is shown as."""

    def __init__(self, spec: SweepSpec, ctx: RunContext, control: SweepControl, cells: list[Cell], target: Target,
                 servers: ServerManager, telemetry: Telemetry, sinks: SinkFactory, bg: Background | None,
                 buses: BusFactory) -> None:
        self.spec = spec
        self.ctx = ctx
        self.control = control
        self.cells = cells
        self.target = target
        self.servers = servers
        self.telemetry = telemetry
        self.sinks = sinks
        self.bg = bg
        self.buses = buses
        self.bus: Bus | None = None  # from the moment the session's directory is known
        self.path: Path | None = None
        self.label = ctx.target_label or ctx.url
        self.sink: SessionSink | None = None
        self.model = ""
        self.mixer: QualityMixer | None = None
        self.minfo = ModelInfo("")
        self.tok: Tokenizer | None = None
        self.info: TargetInfo | None = None
        self.close_error = ""  # why the telemetry's last samples could not be saved at the end, if so
        self.calibrated: CalibratedTokenizer | None = None  # no /tokenize nor --tokenizer: lengths from usage
        self.calibration_note = ""  # what the calibration found (or why it could not calibrate)
        self.eos_refused = ""  # the server refused ignore_eos (its 400's text): dropped for the rest of the sweep
        self.no_usage_stats = False  # the server refused continuous_usage_stats: not sent again
        self.series = SweepSeries(spec.stop_after_saturation)  # across a series' loads: saturation, the auto ramp
        self.probe_specs: dict[str, list[RequestSpec]] = {}  # --probe-rate: the probes' prompts, per API
        self.made: Path | None = None  # the session folder this run made (None: it was there, a resumed one)
        self.prefix_reset = PrefixReset(ctx.api_key) if spec.reset_prefix_cache else None

    def measured(self) -> bool:
        """Whether the session holds anything measured (a cell finished or lost, or a quality result)."""
        sink = self.sink
        if sink is None:
            return False
        return any(st not in ("planned", "running") for st in sink.cell_statuses().values()) \
            or sink.meta.quality is not None

    def _stopping(self) -> bool:
        return self.control.stopping

    async def _connect(self) -> TargetInfo:
        try:
            target, self.minfo = await self.target.connect(self.servers.url, self.spec.model)
        except ServescopeError as e:
            if not self.spec.launch or "check --url" not in e.message:
                raise
            # servescope launched this server: no --url to check, its log says what it did
            raise ServescopeError(e.message.replace("check --url", "the server servescope launched stopped "
                                                    "answering: see its log in the session folder")) from None
        self.info = target
        if self.ctx.target_label is None:
            self.label = target.url
        return target

    async def _start_telemetry(self) -> list[Event]:
        """(Re)start telemetry on the server now running; its settings go in session.toml."""
        sink = self.sink
        assert sink is not None
        st = await self.telemetry.start(self.servers.url, self.minfo.max_model_len)
        out: list[Event] = [Notice("info", n) for n in st.notices]
        kv = kv_budget_meta(st.kv_budget, self.servers.kv_budget(), self.spec.workloads) or self._slot_budget()
        sink.update(telemetry=st.telemetry, gpu=st.gpu if st.gpu is not None else sink.meta.gpu,
                    kv_budget=kv if kv is not None else sink.meta.kv_budget)
        if kv is not None:
            out.append(KvBudgetKnown(kv, kv_budget_text(kv)))
        return out

    def _slot_budget(self) -> KvBudgetMeta | None:
        """llama.cpp's KV budget: `-c` tokens shared by `--parallel` slots, each request in one slot of
        `-c / --parallel` tokens; past that many users requests wait (its `requests_deferred`)."""
        info, n_ctx = self.info, self.minfo.max_model_len
        if info is None or info.engine != "llamacpp" or not info.slots or not n_ctx:
            return None
        return {"kv_cache_tokens": info.slots * n_ctx, "source": "llama.cpp /props", "slots": info.slots,
                "slot_tokens": n_ctx,
                "max_concurrency_by_workload": {w.name: float(info.slots if request_tokens(w) <= n_ctx else 0)
                                                for w in self.spec.workloads if not w.dataset}}

    def _claim(self, path: Path) -> None:
        """Become the one writer of the session at `path` (its lock, event log and control file)."""
        if self.bus is None:
            self.bus = self.buses(path, self.control, self.ctx.target_label)
            self.path = path

    # ---- the sweep ---------------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        spec, ctx = self.spec, self.ctx
        path = ctx.resume or ctx.save_dir
        if ctx.save_dir is not None and ctx.resume is None and not ctx.save_dir.exists():
            self.made = ctx.save_dir  # --save DIR made here: removed again when the run measures nothing
        try:
            if path is not None:
                self._claim(path)
            if spec.launch:
                if path is None:
                    path = self.made = _new_dir(ctx, spec.name or "launch")
                self._claim(path)
                await self.servers.launch(self.cells[0].variant, path)
            target = await self._connect()
            self.model = self.minfo.id
            self.tok = await self._tokenizer()
            name = spec.name or (f"{self.model.rstrip('/').split('/')[-1]}-"
                                 f"{'-'.join(sorted({w.name.split('/')[0] for w in spec.workloads}))}")
            if path is None:
                path = self.made = _new_dir(ctx, name)
            self._claim(path)
            if ctx.resume is not None:
                self.sink = self.sinks.open(path)
                self.sink.update(status="running")
                self.sink.add_event("resumed", "the sweep was resumed")
            else:
                self.sink = self.sinks.create(path, self._meta(name, target, self.tok), exist_ok=bool(spec.launch))
            self._note_lengths()
            started = self._note_startup("the server")
            tele = await self._start_telemetry()
        except BaseException:
            await self._close()
            raise
        sink = self.sink
        yield SweepStarted(path, self.cells, target, self.model, self.tok.name)
        for ev in [*started, *tele]:
            yield ev
        if spec.quality_share > 0:
            self.mixer = QualityMixer(self.servers.url, self.minfo, ctx.api_key, spec.quality_share, spec.seed)
            line = await self.mixer.prepare(self.tok)
            sink.add_event("quality", line)
            yield Notice("info", line)
        if self.calibrated is not None and self.calibrated.fitted:
            yield Notice("info", self.calibration_note)
        elif not self.tok.exact:
            yield Notice("warning", f"{self.label} has no /tokenize: input lengths are estimated (1 token per word)"
                                    + (f" ({self.calibration_note})" if self.calibration_note else "")
                                    + "; pass --tokenizer PATH for exact lengths. Each cell shows requested vs measured.")
        if self.eos_refused:
            yield Notice("warning", self._eos_text())
        done_before = ({i for i, st in sink.cell_statuses().items() if st in FINISHED}
                       if ctx.resume is not None else set())
        status, message = "completed", ""
        try:
            for cell in self.cells:
                if cell.index in done_before:
                    continue
                if self.control.stopping:
                    status = "interrupted"
                    break
                if spec.launch and cell.variant != self.servers.variant:
                    async for ev in self._relaunch(cell, path):
                        yield ev
                why = self.series.skip_reason(cell)  # --stop-after-saturation: above the load run past a saturated one
                if why:
                    sink.write_cell({**cell.row(), "status": "skipped", "reason": why}, None, None)
                    yield CellSkipped(cell, why)
                    continue
                reason = fits(cell.workload, self.minfo.max_model_len)
                if reason:
                    sink.write_cell({**cell.row(), "status": "skipped", "reason": reason}, None, None)
                    yield CellSkipped(cell, reason)
                    continue
                outcome: list[str] = []
                async for ev in self._run_cell(cell, path, outcome):
                    yield ev
                if outcome:
                    status, message = "failed", outcome[0]
                    break
                if self.control.stopping:
                    status = "interrupted"
        except (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit):
            with contextlib.suppress(SessionWriteError):  # a full disk: the interruption is what is said
                sink.finish("interrupted", "interrupted")
            await self._close()
            raise
        except ServescopeError as e:
            err = _failed(sink, e)
            await self._close()
            if err is not e:
                raise err from None
            raise
        try:
            sink.finish(status, message)
        except SessionWriteError as e:
            await self._close()
            raise _failed(sink, e) from None
        try:
            await self._close()
        except Exception as e:  # noqa: BLE001 - the sweep is saved: a failure to close its connections is said,
            # and the event log still ends with the sweep's end (a viewer waits for it)
            yield Notice("warning", clean_text(f"closing the sweep's connections failed: {error_text(e)}"))
        if self.close_error:
            yield Notice("warning", f"{self.close_error}: the server telemetry of the last cell is not saved")
        yield SweepFinished(path, status, message)

    async def _relaunch(self, cell: Cell, path: Path) -> AsyncIterator[Event]:
        """Start the server of the cell's variant, then reconnect and restart telemetry."""
        sink = self.sink
        assert sink is not None
        yield Notice("info", f"relaunching the server for variant {cell.variant + 1}: "
                             f"{redact_command(cell.variant_args)}")
        await self.servers.launch(cell.variant, path)
        await self._connect()
        self.tok = await self._tokenizer()
        if self.mixer is not None:  # another server: its own answers at idle
            self.mixer = QualityMixer(self.servers.url, self.minfo, self.ctx.api_key, self.spec.quality_share,
                                      self.spec.seed)
            await self.mixer.prepare(self.tok)
        sink.add_event("server_launched", f"variant {cell.variant + 1}: {redact_command(cell.variant_args)}")
        sink.set_variant_args(cell.variant, self.servers.server_args() or {})
        for ev in self._note_startup(f"variant {cell.variant + 1}'s server"):
            yield ev
        for ev in await self._start_telemetry():
            yield ev

    def _note_startup(self, what: str) -> list[Event]:
        """A launched server's cold start (engine/startup.py), said; every cell it serves carries it."""
        st = launched_startup(self.servers)
        if st is None or not self.spec.launch:
            return []
        return [Notice("info", startup_text(what, st))]

    async def _run_cell(self, cell: Cell, path: Path, failed: list[str]) -> AsyncIterator[Event]:
        """Run one cell, again after the server came back when it was lost (up to MAX_ATTEMPTS runs), whether it
        was lost during the cell or before it (building its prompts asks the server's /tokenize). When the server
        does not come back, the failure message is appended to `failed`."""
        spec, sink = self.spec, self.sink
        assert sink is not None and self.tok is not None
        attempt = 0
        while True:
            attempt += 1
            try:
                if cell.workload.kind == "trace":  # the trace's requests, in its order, sharing its blocks
                    prompts = await trace_prompts(workload_trace(cell.workload), self.tok, cell.seed,
                                                  chat=cell.workload.api == "chat")
                else:  # a prefix-cache target's shared prefix in the server's whole KV blocks (engine/serving.py)
                    kv = sink.meta.kv_budget
                    workload = block_sized(cell.workload, kv.get("block_size") if kv is not None else None)
                    prompts = await build_prompts(workload, prompts_to_build(cell), cell.prompt_key, self.tok)
            except httpx.HTTPError as e:
                # the server stopped answering between cells (its /tokenize): wait for it as during a cell
                why = clean_text(str(e)) or type(e).__name__
                outcome: list[str] = []
                async for ev in self._recover(cell, path, attempt, f"before cell {cell.index + 1} ({cell.label}), "
                                                                   f"while building its prompts ({why})", outcome):
                    yield ev
                if outcome == ["again"]:
                    continue
                failed.extend(outcome)
                return
            specs = serving_specs(cell.workload, cell.prompt_key, [
                RequestSpec(cell.workload.api, p.text, p.input_tokens, p.output_tokens, cell.workload.thinking)
                for p in prompts])
            ramp, notes = await self._auto_ramp(cell)  # --ramp auto: a closed loop's users start over one E2E
            for note in notes:
                yield note
            reset = None
            if self.prefix_reset is not None:  # --reset-prefix-cache: the cell starts from an empty prefix cache
                reset = await self.prefix_reset.before_cell(self.servers.url)
                if self.prefix_reset.notice:
                    yield Notice("warning", self.prefix_reset.notice)
                    sink.add_event("prefix_cache_not_reset", self.prefix_reset.notice)
                    self.prefix_reset.notice = ""
            yield CellStarted(cell, len(self.cells))
            opts = self._options()
            run = CellAttempt(cell, specs, attempt, opts=opts, slos=dict(spec.slos), control=self.control,
                              sink=sink, target=self.target, servers=self.servers, telemetry=self.telemetry,
                              health_interval_s=self.ctx.health_interval_s, label=self.label,
                              ran_with=self._ran_with(), mixer=self.mixer,
                              prices=Prices(spec.price, spec.gpu_hour, spec.electricity_price),
                              measure=await self._measure(cell, ramp), prefix_reset=reset,
                              startup=launched_startup(self.servers) if spec.launch else None)
            lost = False
            measured = specs[warm_prompts(cell.warmup):] or specs
            async for ev in run.events():
                if isinstance(ev, RequestsDone) and self.calibrated is not None:
                    self._observe(measured, ev.records)
                if opts.ignore_eos_refused and not self.eos_refused:
                    yield self._eos_dropped(opts.ignore_eos_refused)
                self.no_usage_stats = self.no_usage_stats or not opts.continuous_usage
                yield ev
                if isinstance(ev, CellFinished):
                    for note in self._saturation_notes(cell, ev):
                        yield note
                if isinstance(ev, CellFinished) and ev.status in ("stopped", "server_lost"):
                    lost = ev.status == "server_lost" or (not self.control.stopping
                                                          and not await self.servers.healthy())
            if not lost:
                return
            outcome = []
            async for ev in self._recover(cell, path, attempt, f"during cell {cell.index + 1} ({cell.label})", outcome):
                yield ev
            if outcome == ["again"]:
                continue
            failed.extend(outcome)
            return

    async def _recover(self, cell: Cell, path: Path, attempt: int, when: str,
                       outcome: list[str]) -> AsyncIterator[Event]:
        """The server stopped answering `when` (during the cell, or before it): wait up to --recover-timeout for it
        to come back (relaunched when servescope launched it). `outcome` gets "again" (it is back: run the cell
        again), the failure message (it did not come back, or was lost MAX_ATTEMPTS times), or nothing (a stop
        ended the wait: the sweep is interrupted, resumable)."""
        spec, sink = self.spec, self.sink
        assert sink is not None
        t_lost = time.monotonic()
        sink.add_event("server_lost", f"{when}, attempt {attempt}")
        yield Notice("error", f"{self.label} stopped answering {when}; waiting up to {spec.recover_timeout_s:g} s for "
                              "it to come back")
        back = await self.servers.recover(spec.recover_timeout_s, self._stopping)
        if back and attempt < MAX_ATTEMPTS and not self.control.stopping:
            try:
                await self._connect()
                self.tok = await self._tokenizer()
            except (ServescopeError, httpx.HTTPError) as e:  # back, and gone again: one more loss of the cell's
                back = False
                why = e.message if isinstance(e, ServescopeError) else clean_text(str(e)) or type(e).__name__
                sink.add_event("server_lost", f"again after it came back: {why}")
            else:
                waited = time.monotonic() - t_lost
                sink.add_event("server_back", f"after {waited:.0f} s; re-running cell {cell.index + 1}")
                yield Notice("info", f"{self.label} is back after {waited:.0f} s: re-running cell "
                                     f"{cell.index + 1} ({cell.label})")
                for ev in self._note_startup("the relaunched server"):
                    yield ev
                outcome.append("again")
                return
        waited = time.monotonic() - t_lost  # the real wait: a stop (SIGTERM, q) can end it early
        if self.control.stopping:
            # stopped while waiting: the sweep is interrupted (resumable), not failed, and the wait it says is the
            # one it made, not the one it was allowed
            yield Notice("warning", f"stopped after waiting {waited:.0f} s (of up to {spec.recover_timeout_s:g} s)"
                                    f" for {self.label} to come back {when}; finished cells are saved in {path} "
                                    f"(continue later with `servescope resume {path}`)")
            return
        within = (f"did not come back within {spec.recover_timeout_s:g} s" if not back else
                  f"was lost {attempt} times (came back after {waited:.0f} s the last time)")
        message = (f"{self.label} stopped answering {when} and {within}; finished cells are saved in {path} "
                   f"(continue later with `servescope resume {path}`)")
        yield Notice("error", message)
        self.control.stopping = True
        outcome.append(message)

    # ---- how a cell is measured: its ramp, window, precision, probes, saturation (engine/measure.py) -----------
    async def _measure(self, cell: Cell, ramp: float | None) -> CellMeasure:
        spec = self.spec
        targets = spec.precision.targets(spec.slos) if spec.precision is not None else ()
        return CellMeasure(window=spec.window, targets=targets, slos=dict(spec.slos),
                           ceiling=ceiling_text(cell.requests, cell.duration_s), probe_rate=spec.probe_rate,
                           probe_specs=await self._probe_specs(cell) if spec.probe_rate else (),
                           lower=self.series.lower(cell), auto_ramp_s=ramp)

    async def _probe_specs(self, cell: Cell) -> list[RequestSpec]:
        """--probe-rate: the probes' prompts (PROBE_INPUT tokens in, PROBE_OUTPUT out), built once per API."""
        api = cell.workload.api
        if api not in self.probe_specs:
            assert self.tok is not None
            w = Workload(name="interference-probe", api=api, input_tokens=fixed(PROBE_INPUT),
                         output_tokens=fixed(PROBE_OUTPUT), seed=self.spec.seed)
            prompts = await build_prompts(w, 16, "interference-probes", self.tok)
            self.probe_specs[api] = [RequestSpec(api, p.text, p.input_tokens, p.output_tokens) for p in prompts]
        return self.probe_specs[api]

    async def _auto_ramp(self, cell: Cell) -> tuple[float | None, list[Event]]:
        """`--ramp auto` (the default) on a closed loop of several users with no ramp of its own: its users start
        one by one over one request's E2E measured alone, as `servescope tune` starts them: the E2E p50 of this
        workload's one-user cell when one ran before, else one probe request sent alone now (not a cell's). The
        ramp (s, None: none), and the notices saying so (once per workload and server variant). The cell's planned
        load is left as it is: its summary's window says the ramp it ran with."""
        load = cell.load
        if (self.spec.ramp_s is not None or load.ramp_s or load.rate is not None or (load.concurrency or 1) <= 1
                or cell.workload.kind == "trace" or (cell.requests is not None and cell.requests <= 1)):
            return None, []
        key = (cell.variant, cell.workload.name)
        out: list[Event] = []
        ramp = self.series.ramps.get(key)
        if ramp is None:
            e2e, how = self.series.known_e2e(cell), "the E2E p50 of its c=1 cell"
            if e2e is None:
                e2e, how = await self._probe_e2e(cell), "one request sent alone first"
                await self.telemetry.boundary()  # a /metrics sample after it: no cell's counters count it
            if e2e is None:
                ramp = self.series.ramps[key] = 0.0
                out.append(Notice("warning", f"{cell.workload.name}: the request sent alone to time the ramp failed; "
                                             "its cells start their users together (--ramp 0)"))
            else:
                ramp = self.series.ramps[key] = ramp_from_probe(e2e)
                line = (f"{cell.workload.name}: closed-loop users start one by one over {ramp:g} s ({how}: "
                        f"{e2e:.2f} s), as tune starts them; --ramp 0 starts them together")
                if self.sink is not None:
                    self.sink.add_event("ramp", line)
                out.append(Notice("info", line))
        return ramp or None, out

    async def _probe_e2e(self, cell: Cell) -> float | None:
        """One request of the cell's workload sent alone (its own prompt, not one of the cell's): its E2E (s)."""
        assert self.tok is not None
        try:
            prompts = await build_prompts(cell.workload, 1, f"{cell.prompt_key}-ramp", self.tok)
        except (httpx.HTTPError, ServescopeError):
            return None
        if not prompts:
            return None
        p = prompts[0]
        got: list[RequestRecord] = []
        await self.target.run_cell(self._options(), [RequestSpec(cell.workload.api, p.text, p.input_tokens,
                                                                 p.output_tokens, cell.workload.thinking)],
                                   Load(concurrency=1), Limits(requests=1), got.append, CellControl(), cell.seed,
                                   _nothing)
        rec = next((r for r in got if r.status == "ok" and r.end_ns > r.sent_ns > 0), None)
        return (rec.end_ns - rec.sent_ns) / 1e9 if rec is not None else None

    def _saturation_notes(self, cell: Cell, ev: CellFinished) -> list[Event]:
        """Record the finished cell in its series; a saturated cell says so (and, with --stop-after-saturation,
        which loads the sweep will skip)."""
        before = self.series.saturated.copy()
        self.series.record(cell, ev.summary)
        sat = ev.summary.saturation
        if sat is None or not sat.saturated or before.keys() == self.series.saturated.keys():
            return []
        then = (" (--stop-after-saturation: the next load runs, the ones above it are skipped)"
                if self.spec.stop_after_saturation else "")
        return [Notice("info", f"cell {cell.index + 1} ({cell.label}): {sat.reason}{then}")]

    def _options(self, retry_after_s: float | None = None) -> ClientOptions:
        """The load's client options: the sweep's, ignore_eos dropped once the server refused it."""
        spec = self.spec
        return ClientOptions(base_url=self.servers.url, model=self.model, api_key=self.ctx.api_key,
                             timeout_s=spec.timeout_s, ignore_eos=spec.ignore_eos and not self.eos_refused,
                             continuous_usage=not self.no_usage_stats,
                             transport=spec.transport, max_model_len=self.minfo.max_model_len,
                             retry_after_max_s=spec.retry_after_s if retry_after_s is None else retry_after_s)

    # ---- what the server accepts and how it counts --------------------------------------------------
    async def _tokenizer(self) -> Tokenizer:
        """The target's tokenizer; a server with neither /tokenize nor --tokenizer is calibrated on its usage
        (once: a relaunched or recovered server keeps the calibration)."""
        tok = await self.target.tokenizer(self.model)
        if tok.exact or not isinstance(self.target, HttpTarget):  # a target in memory (tests' fakes) has no usage
            return tok
        if self.calibrated is None:
            self.calibrated = CalibratedTokenizer()
            await self._calibrate(self.calibrated)
        return self.calibrated if self.calibrated.fitted else tok

    async def _calibrate(self, tok: CalibratedTokenizer) -> None:
        """Send the calibration's probe texts (one output token each, one at a time) with each API the sweep
        uses and fit the tokenizer on the prompt tokens the server's usage says. A probe's 429 is waited out
        (at most CALIBRATION_RETRY_S); a refused ignore_eos is found here, before any cell."""
        apis = sorted({w.api for w in self.spec.workloads}) or ["completions"]
        longest = self.minfo.max_model_len // 2 if self.minfo.max_model_len else None
        texts = calibration_texts(self.spec.seed, longest)
        specs = [RequestSpec(api, t, len(t.split()), 1) for api in apis for t in texts]
        opts = self._options(retry_after_s=CALIBRATION_RETRY_S)
        opts.timeout_s = min(opts.timeout_s, 120.0)
        got: list[RequestRecord] = []
        run = await self.target.run_cell(opts, specs, Load(concurrency=1), Limits(requests=len(specs)), got.append,
                                         CellControl(), 0, _nothing)
        for r in run.records:
            spec = specs[r.index % len(specs)]
            if r.status == "ok" and r.prompt_tokens > 0:
                tok.observe(spec.api == "chat", spec.prompt, r.prompt_tokens)
        if opts.ignore_eos_refused:
            self.eos_refused = opts.ignore_eos_refused
        self.no_usage_stats = not opts.continuous_usage
        n = tok.samples()
        if n and tok.fitted:
            self.calibration_note = (f"{self.label} has no /tokenize: input lengths are calibrated on the server's "
                                     f"own usage.prompt_tokens ({n} probe requests: {tok.tokens_per_word:.3f} tokens "
                                     "per word) and corrected as answers arrive; they are calibrated, not exact "
                                     "(pass --tokenizer PATH for exact lengths)")
        elif n:
            counts = sorted({r.prompt_tokens for r in run.records if r.status == "ok" and r.prompt_tokens > 0})
            self.calibration_note = (f"calibrating on the server's usage failed: its usage.prompt_tokens did not grow "
                                     f"with the prompt ({', '.join(map(str, counts[:6]))} for "
                                     f"{min(len(t.split()) for t in texts)} to {max(len(t.split()) for t in texts)} "
                                     "words)")
        else:
            bad = [r for r in run.records if r.status != "ok"]
            why = (clean_text(bad[0].error)[:160] if bad else "its answers carried no usage.prompt_tokens")
            self.calibration_note = f"calibrating on the server's usage failed: {why}"

    def _observe(self, measured: list[RequestSpec], records: list[RequestRecord]) -> None:
        """Correct the calibration with what the server counted for the cell's answered prompts (single-turn ones:
        a conversation's turn carries its history)."""
        tok = self.calibrated
        if tok is None:
            return
        for r in records:
            if r.status == "ok" and r.prompt_tokens > 0 and not r.warmup and r.conversation < 0 and r.index >= 0:
                spec = measured[r.index % len(measured)]
                if spec.messages is None and spec.input_tokens == r.input_tokens_requested:  # its own prompt
                    tok.observe(spec.api == "chat", spec.prompt, r.prompt_tokens)

    def _note_lengths(self) -> None:
        """Say in session.toml how input lengths were sized (calibrated) and whether ignore_eos was dropped."""
        sink = self.sink
        if sink is None:
            return
        if self.calibrated is not None and self.calibrated.fitted:
            sink.update(input_lengths=InputLengths(method="calibrated", probes=self.calibrated.samples(),
                                                   tokens_per_word=round(self.calibrated.tokens_per_word, 4)))
            sink.add_event("calibrated", self.calibration_note)
        if self.eos_refused:
            sink.update(ignore_eos_dropped=self.eos_refused)
            sink.add_event("ignore_eos_dropped", self._eos_text())

    def _eos_text(self) -> str:
        return (f"{self.label} refused ignore_eos ({clean_text(self.eos_refused)[:160]}): it is dropped for the rest "
                "of the session, so outputs may end before max_tokens")

    def _eos_dropped(self, why: str) -> Notice:
        """The server refused ignore_eos during a cell: said once, recorded in the session, dropped from here on."""
        self.eos_refused = why
        if self.sink is not None:
            self.sink.update(ignore_eos_dropped=why)
            self.sink.add_event("ignore_eos_dropped", self._eos_text())
        return Notice("warning", self._eos_text())

    def _ran_with(self) -> dict[str, str]:
        """What a cell really runs with beyond its plan (a resumed sweep may differ from its first part)."""
        return ran_with(self.spec, self.tok.name if self.tok is not None else "")

    def _meta(self, name: str, target: TargetInfo, tok: Tokenizer) -> SessionMeta:
        spec = self.spec
        return session_meta(spec, self.cells, name=name, label=self.label, target=target, model=self.minfo,
                            tokenizer=tok.name, api_key=self.ctx.api_key,
                            server_args=self.servers.server_args() if spec.launch else None)

    async def _close(self) -> None:
        """Close the telemetry (its last samples saved), the target and the servers. Samples that cannot be written
        (a full disk) never keep the rest open: the error is kept in `close_error`, for the caller to say."""
        try:
            try:
                await self.telemetry.close(self.sink.path if self.sink is not None else None)
            except SessionWriteError as e:
                self.close_error = e.message
            await self.target.close()
            await self.servers.close()
        finally:
            if self.bg is not None:
                self.bg.close()


async def _nothing() -> None:
    return None


def _failed(sink: SessionSink, e: ServescopeError) -> ServescopeError:
    """Mark the session failed with `e`'s reason. A session file that could not be written (a full or read-only
    disk) ends the run with one line that says so, that the cells finished before it are kept and how to go on;
    when session.toml cannot take the reason either, the line says that too."""
    message = e.message
    if isinstance(e, SessionWriteError):
        message = (f"{e.message}; the cells finished before are kept in {sink.path} (`servescope resume "
                   f"{sink.path}` runs the rest)")
    try:
        sink.finish("failed", message)
    except SessionWriteError as again:
        return SessionWriteError(f"{message}; session.toml could not be marked failed either "
                                 f"({again.message.partition(' (')[2].partition(')')[0] or again.message})")
    return SessionWriteError(message) if message != e.message else e


def _new_dir(ctx: RunContext, name: str) -> Path:
    return new_session_dir(ctx.sessions_dir, name)
