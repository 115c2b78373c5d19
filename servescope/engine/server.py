"""The server a sweep runs against, over its life: the URL it was given, or the one servescope launches (and
relaunches once per server variant), its health check, the watchdog that notices it stopped answering
during a cell, and the recovery policy (relaunch it when servescope launched it, else wait for it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

from servescope.core.client import async_client
from servescope.core.errors import ServescopeError
from servescope.core.kvbudget import KVBudget
from servescope.core.launch import ServerProcess, parse_launch, with_variant
from servescope.core.launchspec import ArgValue
from servescope.core.results import Startup
from servescope.engine.background import Background
from servescope.engine.serving import adapter_names
from servescope.engine.spec import SweepSpec
from servescope.engine.startup import measure_startup

if TYPE_CHECKING:
    from servescope.core.launch import ServerProcess

__all__ = ["ServerManager", "Servers", "health", "launched_startup", "plain_args", "watchdog"]


def launched_startup(servers: object) -> Startup | None:
    """The cold start of the server `servers` launched last (None: it launched none, or a ServerManager that does
    not measure one, as the tests' fakes)."""
    v = getattr(servers, "startup", None)
    return v if isinstance(v, Startup) else None


class ServerManager(Protocol):
    """What the runner needs of the server's lifecycle."""

    @property
    def url(self) -> str:
        """The base URL to talk to now (changes when a launched server is started)."""
        ...

    @property
    def variant(self) -> int:
        """The server variant running now (-1 before the first launch)."""
        ...

    async def launch(self, variant: int, log_dir: Path) -> None:
        """(Re)start the launched server with variant `variant`'s arguments; its log goes in `log_dir`."""
        ...

    async def healthy(self, timeout_s: float = 5.0) -> bool: ...

    async def recover(self, timeout_s: float, stopping: Callable[[], bool]) -> bool:
        """The server stopped answering: bring it back (or wait for it) within `timeout_s`; False when it
        did not come back, or when `stopping()` became true."""
        ...

    def server_args(self) -> dict[str, ArgValue] | None:
        """The launched server's arguments (TOML-safe), None when servescope did not launch it."""
        ...

    def kv_budget(self) -> KVBudget | None:
        """The KV budget the launched server's log states, when there is one."""
        ...

    async def close(self) -> None: ...


def plain_args(args: Mapping[str, object]) -> dict[str, ArgValue]:
    """Server arguments as TOML-safe values."""
    return {k: (v if isinstance(v, (str, int, float, bool)) else str(v)) for k, v in args.items() if v is not None}


async def health(url: str, api_key: str | None, timeout_s: float = 5.0) -> bool:
    """Does the server answer /v1/models? A fresh connection each time (a dead server's pooled one lies)."""
    try:
        async with async_client(base_url=url, timeout=timeout_s,
                                limits=httpx.Limits(max_keepalive_connections=0)) as c:
            r = await c.get("/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
            return r.status_code < 500
    except Exception:
        return False


class Servers:
    """The real ServerManager: `url` as given, or the server `spec.launch` starts (health checks run on the
    background loop, never on the load's)."""

    def __init__(self, spec: SweepSpec, url: str, api_key: str | None, bg: Background,
                 stopping: Callable[[], bool] | None = None) -> None:
        self.spec = spec
        self.stopping = stopping  # the sweep is stopping: a launch still waiting for /health ends
        self._url = url
        self.api_key = api_key
        self.bg = bg
        self.proc: ServerProcess | None = None
        self._variant = -1
        self.startup: Startup | None = None  # the last launch's cold start (engine/startup.py)

    @property
    def url(self) -> str:
        return self._url

    @property
    def variant(self) -> int:
        return self._variant

    async def launch(self, variant: int, log_dir: Path) -> None:
        if self.spec.launch is None:
            raise ServescopeError("no server to launch: the sweep has no [server] launch command")
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop)
            self.proc = None
        ls = parse_launch(self.spec.launch)
        vargs = self.spec.variants[variant] if self.spec.variants else ""
        if vargs:
            ls = with_variant(ls, vargs)
        ls = ls.with_adapters(adapter_names(self.spec.workloads), self.spec.lora_dir)  # the workloads' LoRA adapters
        await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
        self.proc = await asyncio.to_thread(ServerProcess.start, ls, log_dir / f"server-{variant}.log", None,
                                            self.spec.launch_timeout_s, (self.api_key,), self.stopping)
        self._url = self.proc.url
        self._variant = variant
        self.startup = await measure_startup(self.proc, self.api_key)

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        return await self.bg.call(health(self._url, self.api_key, timeout_s))

    async def recover(self, timeout_s: float, stopping: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + timeout_s
        if self.proc is not None:
            while not stopping():
                try:
                    await asyncio.to_thread(self.proc.restart)
                    self.startup = await measure_startup(self.proc, self.api_key)
                    return True
                except ServescopeError:  # e.g. the dead server's port not free yet: try again
                    if time.monotonic() + 2 > deadline:
                        return False
                    await asyncio.sleep(2)
            return False
        while time.monotonic() < deadline and not stopping():
            if await self.healthy():
                return True
            await asyncio.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        return False

    def server_args(self) -> dict[str, ArgValue] | None:
        return plain_args(dict(self.proc.spec.server_args)) if self.proc is not None else None

    def kv_budget(self) -> KVBudget | None:
        return self.proc.kv_budget if self.proc is not None else None

    async def close(self) -> None:
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop)
            self.proc = None


async def watchdog(servers: ServerManager, interval_s: float, stopped: asyncio.Event,
                   on_lost: Callable[[], None], progress: Callable[[], int] | None = None) -> None:
    """Until `stopped` is set: check the server's health every `interval_s`; after two misses in a row call
    `on_lost()` and return. With `progress` (a count that moves while the server answers: requests finished and
    pieces of streams received), a tick at which it moved needs no check: the server is answering (a check is a
    fresh connection and a request, costly for a busy CPU server and the client during the load), and a
    check that fails while it moved is no miss (an overloaded server answers its streams before a new
    connection)."""
    misses = 0
    seen = progress() if progress is not None else 0

    def moved() -> bool:
        nonlocal seen
        if progress is None or progress() == seen:
            return False
        seen = progress()
        return True

    while not stopped.is_set():
        await asyncio.sleep(interval_s)
        if moved() or await servers.healthy(timeout_s=max(2.0, interval_s)) or moved():
            misses = 0
            continue
        misses += 1
        if misses >= 2 and not stopped.is_set():
            on_lost()
            return
