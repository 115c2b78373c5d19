"""The target as the runner sees it: probe it (models, version, /metrics), pick the tokenizer, and run one
cell's load against it: in this process (`core.load.run_cell`), in worker processes (`--workers N|auto`:
`core.workers.run_cell_workers`) or in Ray actors across a cluster (`--ray ADDRESS|auto`, `--ray-nodes`:
`core.rayworkers.run_cell_ray`, imported only then)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import httpx

from servescope.core.client import ClientOptions, RequestSpec, async_client
from servescope.core.llamacpp import LlamaCppTokenizer
from servescope.core.load import CellControl, CellRun, Limits, Load, run_cell
from servescope.core.rayworkers import run_cell_ray
from servescope.core.records import RequestRecord
from servescope.core.results import CellConnections
from servescope.core.target import (
    EstimateTokenizer,
    LocalTokenizer,
    ModelInfo,
    ServerTokenizer,
    TargetInfo,
    Tokenizer,
    has_tokenize,
    probe,
)
from servescope.core.tls import CONNECTIONS, TlsSettings, current, handshake_figures
from servescope.core.workercount import DEFAULT_WORKERS, Workers
from servescope.core.workers import auto_note, resolve_workers, run_cell_workers

__all__ = ["HttpTarget", "Target"]


class Target(Protocol):
    # how many connections the last cell's load opened, and what they cost (None: not counted)
    cell_connections: CellConnections | None

    async def connect(self, url: str, model: str | None) -> tuple[TargetInfo, ModelInfo]:
        """Probe the server at `url` (again after a relaunch or recovery) and pick the model."""
        ...

    async def tokenizer(self, model: str) -> Tokenizer:
        """The tokenizer prompts are built with (the last `connect()`'s server)."""
        ...

    async def run_cell(self, opts: ClientOptions, specs: Sequence[RequestSpec], load: Load, limits: Limits,
                       on_record: Callable[[RequestRecord], None], control: CellControl, seed: int,
                       before_measured: Callable[[], Awaitable[None]]) -> CellRun:
        """One cell's load (warmup, then the measured part); `before_measured` runs between the two."""
        ...

    async def close(self) -> None: ...


class HttpTarget:
    """The real Target: `core.target.probe`, a small HTTP client for /tokenize, `core.load.run_cell`.
    `workers` ("auto" or N), `ray` (an address, "auto", or None) and `ray_nodes` say where a cell's load runs
    (the sweep's `--workers`, `--ray`, `--ray-nodes`); the defaults run it in this process. `tls` (--ca-cert,
    --insecure: core/tls.py; None: this process's setting) reaches every request: the probe, /tokenize, and the
    load's transports in this process, in worker processes and in Ray actors. After each cell,
    `cell_connections` says how many connections its load opened and what they cost (TCP connect and TLS
    handshake p50, apart from the TTFT): with keep-alive, one per user, not one per request."""

    def __init__(self, api_key: str | None, tokenizer_path: str | None = None, engine: str = "auto",
                 workers: Workers = DEFAULT_WORKERS, ray: str | None = None, ray_nodes: tuple[str, ...] = (),
                 tls: TlsSettings | None = None) -> None:
        self.api_key = api_key
        self.tokenizer_path = tokenizer_path
        self.engine = engine  # "auto": recognised from the server's answers
        self.workers = workers
        self.ray = ray
        self.ray_nodes = ray_nodes
        self.http: httpx.AsyncClient | None = None
        self.info: TargetInfo | None = None
        self.tls = tls
        self.cell_connections: CellConnections | None = None  # the last cell's (its summary's `connections`)

    @property
    def tls_settings(self) -> TlsSettings:
        return self.tls or current()

    async def connect(self, url: str, model: str | None) -> tuple[TargetInfo, ModelInfo]:
        target = await probe(url, self.api_key, engine=self.engine, tls=self.tls_settings)
        self.info = target
        minfo = target.model(model)
        if self.http is not None:
            await self.http.aclose()
        self.http = async_client(
            base_url=url,
            headers={"Authorization": f"Bearer {self.api_key}"} if self.api_key else None,
            timeout=httpx.Timeout(120.0, connect=10.0),
            limits=httpx.Limits(max_connections=16),
            tls=self.tls_settings,
        )
        return target, minfo

    async def tokenizer(self, model: str) -> Tokenizer:
        if self.tokenizer_path:
            return LocalTokenizer(self.tokenizer_path)
        if self.http is not None and self.info is not None and self.info.engine == "llamacpp":
            return LlamaCppTokenizer(self.http, self.api_key, self.info.url)
        if self.http is not None and await has_tokenize(self.http, model, self.api_key):
            return ServerTokenizer(self.http, model, self.api_key)
        return EstimateTokenizer()

    async def run_cell(self, opts: ClientOptions, specs: Sequence[RequestSpec], load: Load, limits: Limits,
                       on_record: Callable[[RequestRecord], None], control: CellControl, seed: int,
                       before_measured: Callable[[], Awaitable[None]]) -> CellRun:
        if opts.tls is None:  # the load's transports, here and in workers, check the server as the probe did
            opts.tls = self.tls_settings  # in place: the caller's options are the cell's (what it learns lands there)
        mark = CONNECTIONS.mark()
        try:
            return await self._run_cell(opts, specs, load, limits, on_record, control, seed, before_measured)
        finally:
            hs = handshake_figures(CONNECTIONS.since(mark))
            self.cell_connections = CellConnections(opened=hs.opened, connect_ms_p50=hs.connect_ms_p50,
                                                    tls_handshake_ms_p50=hs.tls_handshake_ms_p50)
            CONNECTIONS.forget(CONNECTIONS.mark())

    async def _run_cell(self, opts: ClientOptions, specs: Sequence[RequestSpec], load: Load, limits: Limits,
                        on_record: Callable[[RequestRecord], None], control: CellControl, seed: int,
                        before_measured: Callable[[], Awaitable[None]]) -> CellRun:
        if self.ray:
            # Ray: one actor per node unless a count is given (auto's sizing is for this machine's cores)
            n = 1 if self.workers == "auto" else resolve_workers(self.workers, load, specs, limits.warmup)
            return await run_cell_ray(opts, specs, load, limits, on_record, control, seed=seed,
                                      before_measured=before_measured, address=self.ray,
                                      nodes=tuple(self.ray_nodes), workers=n)
        n = resolve_workers(self.workers, load, specs, limits.warmup)
        if n > 1:
            run = await run_cell_workers(opts, specs, load, limits, on_record, control, seed=seed,
                                         before_measured=before_measured, workers=n)
        else:
            run = await run_cell(opts, specs, load, limits, on_record, control, seed=seed,
                                 before_measured=before_measured)
        if self.workers == "auto":  # decided before the cell started; said with its result
            run.workers_note, run.workers_short = auto_note(load, specs, limits.warmup)
        return run

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None
