"""Running ONE cell once (an attempt): the load, batches of finished requests for live views, the watchdog,
the boundary samples of telemetry, and saving the cell (its requests, then its summary) before the next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping

import msgspec

from servescope.core.client import ClientOptions, RequestSpec, reads
from servescope.core.cost import with_cost
from servescope.core.health import RateShortfall, judge_client
from servescope.core.load import CellControl, CellRun, Limits
from servescope.core.metrics import client_figures, records_frame, summarize
from servescope.core.prices import Prices
from servescope.core.records import RequestRecord
from servescope.core.results import CellQuality, CellResult, ServerWindow, Startup, TelemetryWindow
from servescope.core.steady import WindowSpan, steady_span
from servescope.core.telemetry import server_delta
from servescope.core.textsafe import clean_text
from servescope.engine.connection import Target
from servescope.engine.events import CellFinished, CellSkipped, Event, Notice, RequestsDone, SweepControl
from servescope.engine.interference import InterferenceProbes
from servescope.engine.measure import CellMeasure, Stopper, cell_figures, imprecise_reason
from servescope.engine.plan import Cell, pool_size
from servescope.engine.quality import QualityMixer
from servescope.engine.server import ServerManager, watchdog
from servescope.engine.serving import serving_figures
from servescope.engine.sink import SessionSink
from servescope.engine.telemetryhub import CellWindows, Metrics, Telemetry
from servescope.workloads.conversation import mark_turns

__all__ = ["CellAttempt"]

# how often finished requests and the latest telemetry sample go to the live views during a cell: each batch
# wakes the load's loop and the bus's writer thread and writes to the event log, CPU taken from the load
LIVE_BATCH_S = 0.5
CALIBRATED_TOLERANCE = 0.03  # calibrated input lengths (no /tokenize) this far from the request, on average, are said
SEEN_BEFORE_HIT = 0.3  # a cell of distinct prompts whose prefix cache hits reach this share: the server saw them before


class CellAttempt:
    """One attempt at one cell. `events()` runs it and yields RequestsDone batches, TelemetrySamples, then
    CellFinished (status "done", "stopped" or "server_lost"), or CellSkipped when the user skipped it (saved
    as `skipped`, without its partial requests); afterwards `lost` says whether the server stopped answering
    during it. Interrupted (the task cancelled: the app closed, a second Ctrl-C), it saves what it measured
    as `interrupted` and re-raises."""

    def __init__(self, cell: Cell, specs: list[RequestSpec], attempt: int, *, opts: ClientOptions,
                 slos: dict[str, float], control: SweepControl, sink: SessionSink, target: Target,
                 servers: ServerManager, telemetry: Telemetry, health_interval_s: float, label: str,
                 ran_with: Mapping[str, str] | None = None, mixer: QualityMixer | None = None,
                 prices: Prices | None = None, measure: CellMeasure | None = None,
                 prefix_reset: bool | None = None, startup: Startup | None = None) -> None:
        self.cell = cell
        self.prefix_reset = prefix_reset  # --reset-prefix-cache: whether the server's cache was reset before it
        self.startup = startup  # the launched server's cold start (engine/startup.py)
        self.prices = prices or Prices()  # --price / --gpu-hour / --electricity-price: each cell's cost
        self.specs = mark_turns(cell.workload, cell.prompt_key, specs)  # a multi-turn cell's requests are turns
        self.attempt = attempt
        self.opts = opts
        self.slos = slos
        self.control = control
        self.sink = sink
        self.target = target
        self.servers = servers
        self.telemetry = telemetry
        self.health_interval_s = health_interval_s
        self.label = label  # the target, for messages
        self.ran_with = dict(ran_with or {})  # settings recorded in the cell's row (tokenizer, transport, ...)
        self.cc = CellControl()
        self.lost = False  # the server stopped answering during the cell
        self.ok = 0  # measured requests so far
        self.failed = 0
        self.rate_limited = 0  # answered HTTP 429 (not among the failed)
        self.pending: list[RequestRecord] = []  # finished, not yet yielded
        self.t0_ns = 0  # the measured window (perf_counter_ns), set around the boundary samples
        self.t1_ns = 0
        self.server_before: Metrics | None = None  # /metrics at the window's start and end
        self.server_after: Metrics | None = None
        self.wake = asyncio.Event()
        self.mixer = mixer  # --quality-share: probe questions beside the load
        # the window, --precision's stop rule, --probe-rate's probes, the saturation mark (engine/measure.py)
        self.measure = measure or CellMeasure(slos=dict(slos))
        self.stopper = Stopper(self.measure, cell) if self.measure.targets else None
        self.probes = (InterferenceProbes(opts, self.measure.probe_specs, self.measure.probe_rate, cell.seed)
                       if self.measure.probe_rate and self.measure.probe_specs else None)

    def _on_record(self, r: RequestRecord) -> None:
        self.pending.append(r)
        if self.stopper is not None:
            self.stopper.add(r)
        if r.status == "ok":
            self.ok += 1
        elif r.status == "rate_limited":
            self.rate_limited += 1
        else:
            self.failed += 1

    async def _before_measured(self) -> None:
        self.t0_ns = time.perf_counter_ns()  # before the boundary samples, so they fall inside the window
        self.server_before = await self.telemetry.boundary()

    def _on_lost(self) -> None:
        self.lost = True
        self.cc.request_stop(f"server lost: {self.label} stopped answering its health check")

    def _batch(self, t0: float) -> RequestsDone:
        batch, self.pending = self.pending, []
        return RequestsDone(self.cell, batch, self.ok, self.failed, time.monotonic() - t0, self.rate_limited)

    async def events(self) -> AsyncIterator[Event]:
        cell, control = self.cell, self.control
        control.cell = self.cc
        self.telemetry.begin_cell()
        t0 = time.monotonic()
        task = asyncio.create_task(self.target.run_cell(
            self.opts, self.specs, self.measure.load(cell), Limits(cell.requests, cell.duration_s, cell.warmup),
            self._on_record,
            self.cc, seed=cell.seed, before_measured=self._before_measured))
        task.add_done_callback(lambda _t: self.wake.set())
        dog = asyncio.create_task(watchdog(self.servers, self.health_interval_s, self.cc.stop, self._on_lost,
                                           progress=lambda: self.ok + reads()))
        mix = (asyncio.create_task(self.mixer.during(lambda: self.ok + self.failed + self.rate_limited))
               if self.mixer else None)
        probing = asyncio.create_task(self.probes.during()) if self.probes is not None else None
        try:
            while not task.done():
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=LIVE_BATCH_S)
                except TimeoutError:
                    pass
                if self.stopper is not None and self.stopper.look():
                    self.cc.request_finish()  # precise enough: no more requests; the ones in flight finish
                if self.pending and control.skipped is not self.cc:  # a skipped cell's cancelled requests: not shown
                    yield self._batch(t0)
                sample = self.telemetry.latest()
                if sample is not None:
                    yield sample
        except BaseException:
            self.cc.request_stop("interrupted")
            dog.cancel()
            if mix is not None:
                mix.cancel()
            if probing is not None:
                probing.cancel()
            await asyncio.gather(task, dog, *(t for t in (mix, probing) if t is not None), return_exceptions=True)
            control.cell = None
            self._save(task, interrupted=True)
            raise
        dog.cancel()
        if mix is not None and self.mixer is not None:
            await self.mixer.finish(mix)  # the probe out when the load ended is the cell's: it may finish
        await asyncio.gather(dog, return_exceptions=True)
        quality = self.mixer.take() if self.mixer is not None else None
        if probing is not None and self.probes is not None:
            await self.probes.finish(probing)
        run = task.result()
        if control.skipped is self.cc and not self.lost:
            control.cell = None
            self.pending = []
            reason = self.cc.reason or "skipped by the user"
            self.sink.write_cell({**cell.row(), **self.ran_with, "status": "skipped", "reason": clean_text(reason)},
                                 None, None)
            self.telemetry.save(self.sink.path)
            yield CellSkipped(cell, reason)
            return
        if self.pending:
            yield self._batch(t0)
        self.server_after = await self.telemetry.boundary(metrics=not self.lost)
        self.t1_ns = time.perf_counter_ns()
        # a server killed near a cell's end fails its last requests fast, before the watchdog's second miss:
        # any failure (not only an early stop) gets a health check before the cell counts as done
        if (run.stopped or self.failed) and not self.lost and not control.stopping \
                and not await self.servers.healthy():
            self.lost = True
        status = "server_lost" if self.lost else None
        windows = CellWindows()
        if self.t0_ns:
            out_tok = sum(r.output_tokens for r in run.records if r.status == "ok")
            windows = await self.telemetry.window(self.t0_ns, self.t1_ns, out_tok)
        span, steady_tele = await self._span(run, windows)
        summary = self._save(task, status=status, suffix=f"-lost{self.attempt}" if self.lost else "",
                             windows=windows, quality=quality, span=span, steady_tele=steady_tele)
        self.telemetry.save(self.sink.path)
        control.cell = None
        yield CellFinished(cell, summary or CellResult(), status or ("stopped" if run.stopped else "done"),
                           run.stopped or imprecise_reason(summary))
        if summary is not None and summary.output_check is not None:  # output counts that do not hold up
            for note in summary.output_check.notes:
                self.sink.add_event("output_counts", f"cell {cell.index + 1} ({cell.label}): {note}")
                yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): {note}")
        if run.warmup_note:  # a duration-only cell's warmup lasts at most its duration
            self.sink.add_event("warmup_cut", f"cell {cell.index + 1} ({cell.label}): {run.warmup_note}")
            yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): {run.warmup_note}")
        if run.workers_note:  # --workers auto spread the load, or could not (core/workers.py auto_note)
            self.sink.add_event("workers", f"cell {cell.index + 1} ({cell.label}): {run.workers_note}")
            yield Notice("warning" if run.workers_short else "info",
                         f"cell {cell.index + 1} ({cell.label}): {run.workers_note}")
        sent = self.ok + self.failed + self.rate_limited
        if cell.requests is not None and cell.requests > (pool := pool_size(cell)) and sent > pool:
            yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): {sent:,} requests cycled "
                                    f"{pool:,} distinct prompts (at most {pool:,} are built for a cell); a repeat may "
                                    "be served from the server's prefix cache")
        elif (summary is not None and (hit := summary.prefix_cache_hit_rate) is not None and hit >= SEEN_BEFORE_HIT
              and cell.workload.kind == "single" and not cell.workload.dataset and not cell.workload.shared_tokens):
            # every prompt of this cell is its own window of the corpus, so its prefix cache hits mean the server has
            # seen these prompts before: a session with the same seed against the same server
            yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): the server's prefix cache served "
                                    f"{hit:.0%} of the prompt tokens, though no two of this cell's prompts share a "
                                    "start: the server has seen these prompts before (a run with the same --seed "
                                    "against it), so TTFT reads low; give another --seed or restart the server")
        mm = summary.input_tokens_mismatch if summary is not None else None
        if summary is not None and summary.input_lengths == "calibrated":
            # sized on the server's usage: a few tokens off each is expected; the mean is what is said when it is far
            req, got = summary.input_tokens_requested, summary.input_tokens_mean
            if req and got is not None and abs(got - req) > CALIBRATED_TOLERANCE * req:
                yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): calibrated input lengths averaged "
                                        f"{got:,.0f} tokens for {req:,.0f} requested ({(got - req) / req:+.1%}); "
                                        "later cells are sized with the corrected calibration")
        elif mm is not None and mm.max_abs:
            yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): input tokens differ from the request by "
                                    f"up to {mm.max_abs} (mean {mm.mean or 0:+.1f})")

    async def _span(self, run: CellRun, windows: CellWindows) -> tuple[WindowSpan | None, TelemetryWindow | None]:
        """The cell's steady window (None with `--window whole`, or none to be had), and the server's /metrics over
        it (over the measured part with `--window whole`): what the saturation mark reads."""
        if self.measure.window != "steady":
            return None, windows.telemetry
        end = self.stopper.end_ns if self.stopper is not None and self.stopper.fired else None
        span = steady_span(run.records, self.measure.load(self.cell), self.cell.requests, end)
        if span is None or windows.telemetry is None:
            return span, windows.telemetry
        return span, (await self.telemetry.window(span.start_ns, span.end_ns, 0)).telemetry

    def _save(self, task: asyncio.Task[CellRun], interrupted: bool = False, status: str | None = None,
              suffix: str = "", windows: CellWindows | None = None, quality: CellQuality | None = None,
              span: WindowSpan | None = None, steady_tele: TelemetryWindow | None = None) -> CellResult | None:
        """Write the cell to the session; its summary as saved (None when the load itself failed)."""
        cell = self.cell
        if task.cancelled() or interrupted and not task.done():
            self.sink.set_cell_status(cell.index, "interrupted", "interrupted: the sweep was aborted mid-cell")
            return None
        if task.exception() is not None:
            self.sink.set_cell_status(cell.index, "interrupted" if interrupted else "failed",
                                      "interrupted: the sweep was aborted mid-cell" if interrupted
                                      else clean_text(str(task.exception())))
            return None
        run = task.result()
        df = records_frame(run.records)
        wall = max(0.0, (run.end_ns - run.start_ns) / 1e9)
        server = server_delta(self.server_before, self.server_after)
        own = [x for x in df["server_prompt_ms"].to_list() if x is not None] if "server_prompt_ms" in df.columns else []
        if own and (server is None or server.ttft_ms_mean is None):
            # llama.cpp times each request's prompt itself (`timings`): the server's TTFT beside the client's
            server = msgspec.structs.replace(server or ServerWindow(), ttft_ms_mean=sum(own) / len(own))
        hit = server.prefix_cache_hit_rate if server is not None else None
        figures = summarize(df, wall, self.slos, server_prefix_hit_rate=hit, ignore_eos=self.opts.ignore_eos)
        # the window's figures with the whole cell's beside them, intervals, precision, saturation (engine/measure.py)
        figures, df = cell_figures(figures, df, run, cell, self.measure, self.slos, hit, self.stopper, steady_tele,
                                   span)
        client = None
        if run.client:  # is the client the bottleneck? (core/health.py)
            load = cell.load
            figs = client_figures(df, open_loop=load.rate is not None and not load.max_concurrency)
            short = (RateShortfall(run.behind_s, cell.duration_s, run.sent, load.rate)
                     if load.rate is not None and cell.duration_s and run.behind_s > 0 else None)
            win = windows or CellWindows()
            client = judge_client(run.client, **figs, shortfall=short, scrapes=win.scrapes, scrape_cpu_s=win.scrape_cpu_s)
        windows = windows or CellWindows()
        tokenizer = self.ran_with.get("tokenizer", "")
        lengths = "calibrated" if tokenizer.startswith("calibrated") else "estimated" if tokenizer.startswith(
            "estimate") else None
        summary = msgspec.structs.replace(  # the one shape from here on: saved, sent, shown
            figures, server=server, telemetry=windows.telemetry, gpu=windows.gpu, client=client, quality=quality,
            input_lengths=lengths, connections=self.target.cell_connections)
        if self.probes is not None:
            summary = msgspec.structs.replace(summary, probes=self.probes.take())
        # engine/serving.py; the adapters' figures over the whole cell's requests, as the server's own counts and
        # /metrics samples (at the cell's two ends) are
        summary = serving_figures(summary, df, self.server_before, self.server_after, windows.gpu, cell.workload,
                                  self.prefix_reset, self.startup)
        summary = with_cost(summary, self.prices)  # what its tokens cost (core/cost.py), sent with the summary
        status = status or ("interrupted" if interrupted else "stopped" if run.stopped else "done")
        reason = "interrupted: the sweep was aborted mid-cell" if interrupted else run.stopped or imprecise_reason(
            summary)
        self.sink.write_cell({**cell.row(), **self.ran_with, "status": status, "reason": clean_text(reason)},
                             df, summary, suffix=suffix)
        return summary
