"""The real servers of a test session, each started once, the first time a test asks for it.

A CPU vLLM takes 20-40 s to start on 2 cores: the suite starts one per distinct (model, flags) and keeps it for the
session instead of one per module. Idle, a CPU vLLM or llama-server takes no CPU, so a few can stay up at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ServerPool:
    def __init__(self) -> None:
        self._servers: dict[tuple[Any, ...], Any] = {}

    def vllm(self, model: str, args: Sequence[str]) -> Any:
        """The real CPU vLLM serving `model` (a folder of .ci/setup_vllm.sh's models) with `args`."""
        key = ("vllm", model, tuple(args))
        if key not in self._servers:
            from tests.support import vllm_server

            self._servers[key] = vllm_server.start(model, list(args))
        return self._servers[key]

    def llamacpp(self, model: str, *, ctx: int, parallel: int, extra: Sequence[str] = ()) -> Any:
        """A real llama-server with `model` (a GGUF of .ci/setup_llamacpp.sh's), `ctx` shared by `parallel` slots."""
        key = ("llamacpp", model, ctx, parallel, tuple(extra))
        if key not in self._servers:
            from tests.support import llamacpp_server

            self._servers[key] = llamacpp_server.start(model, ctx=ctx, parallel=parallel, extra=extra)
        return self._servers[key]

    def close(self) -> None:
        for srv in reversed(list(self._servers.values())):
            srv.stop()
        self._servers.clear()
