"""A launched server's cold start: seconds from starting its command to a healthy `/health` (the launcher's own
measure) and to the first token of a one-token request sent as soon as it is healthy, with the phases its log
names (core/startup.py). Measured at every launch: the first, each server variant's, each relaunch after a crash."""

from __future__ import annotations

import time

import httpx

from servescope.core.client import async_client
from servescope.core.launch import ServerProcess
from servescope.core.results import Startup
from servescope.core.startup import startup_phases

FIRST_TOKEN_TIMEOUT_S = 300.0  # a first request on a cold server may wait for lazy compilation


async def measure_startup(proc: ServerProcess, api_key: str | None) -> Startup:
    """The start of the server `proc` runs (healthy now): the first token's time is None when the one-token request
    fails (its failure is the sweep's to meet)."""
    first: float | None = None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with async_client(base_url=proc.url, timeout=FIRST_TOKEN_TIMEOUT_S, headers=headers) as c:
            models = (await c.get("/v1/models")).json().get("data") or []
            base = next((m["id"] for m in models if isinstance(m, dict) and not m.get("parent") and "id" in m), None)
            body = {"prompt": "Hello", "max_tokens": 1, "stream": True, **({"model": base} if base else {})}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code == 200:
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and '"text"' in line:
                            first = time.monotonic() - proc.started_at
                            break
    except (httpx.HTTPError, ValueError, AttributeError):
        first = None
    return Startup(healthy_s=proc.healthy_after_s, first_token_s=first, phases=startup_phases(proc.log_text()) or None)
