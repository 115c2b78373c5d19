"""Interference probes (`--probe-rate R`): small requests (`PROBE_INPUT` tokens in, `PROBE_OUTPUT` out) sent on their
own Poisson schedule at R per second during each cell's measured part, on their own connections. Their TTFT and E2E
show what the cell's load does to a newcomer: the wait for a slot and a prefill behind the running batch, which the
load's own figures (its users already admitted) do not show. They are not in the cell's figures; the cell's summary
holds them as `probes` (core.results.CellProbes)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence

from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
from servescope.core.metrics import describe
from servescope.core.records import RequestRecord
from servescope.core.results import CellProbes
from servescope.core.textsafe import clean_text

__all__ = ["MAX_OUT", "PROBE_INPUT", "PROBE_OUTPUT", "InterferenceProbes"]

PROBE_INPUT = 64  # tokens in a probe's prompt
PROBE_OUTPUT = 16  # tokens it asks for
MAX_OUT = 8  # probes in flight at most: past that the server is so slow that more would be a load of their own
FINISH_S = 60.0  # a probe out when the load ends may finish, this long at most


class InterferenceProbes:
    """Sends one cell's probes: `during()` beside the load (until `finish()`), then `take()` the figures."""

    def __init__(self, opts: ClientOptions, specs: Sequence[RequestSpec], rate: float, seed: int) -> None:
        self.opts = opts
        self.specs = list(specs)
        self.rate = rate
        self.rng = random.Random(f"servescope-probes:{seed}")
        self.records: list[RequestRecord] = []
        self.ending = False
        self.skipped = 0  # schedule slots passed over while MAX_OUT probes were out

    async def during(self) -> None:
        if not self.specs:
            return
        out: set[asyncio.Task[None]] = set()
        async with make_http_client(self.opts, MAX_OUT) as http:
            async def send(i: int, when: int) -> None:
                spec = self.specs[i % len(self.specs)]
                rec = RequestRecord(index=i, user=-2, warmup=False, input_tokens_requested=spec.input_tokens,
                                    output_tokens_requested=spec.output_tokens, scheduled_ns=when)
                try:
                    await stream_request(http, self.opts, spec, rec)
                except asyncio.CancelledError:
                    rec.status, rec.error = "cancelled", "cancelled when the cell ended"
                    raise
                finally:
                    self.records.append(rec)

            i = 0
            nxt = time.perf_counter_ns() + int(self.rng.expovariate(self.rate) * 1e9)
            try:
                while not self.ending:
                    delay = (nxt - time.perf_counter_ns()) / 1e9
                    if delay > 0:
                        await asyncio.sleep(min(delay, 0.25))
                        continue
                    if len(out) < MAX_OUT:
                        t = asyncio.create_task(send(i, nxt))
                        out.add(t)
                        t.add_done_callback(out.discard)
                        i += 1
                    else:
                        self.skipped += 1
                    nxt += int(self.rng.expovariate(self.rate) * 1e9)
                if out:
                    await asyncio.wait(set(out), timeout=FINISH_S)
            finally:
                for t in list(out):
                    t.cancel()
                if out:
                    await asyncio.gather(*out, return_exceptions=True)

    async def finish(self, task: asyncio.Task[None]) -> None:
        """The cell's load is done: no new probe; the ones out may finish (FINISH_S at most)."""
        self.ending = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), timeout=FINISH_S + 5)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def take(self) -> CellProbes | None:
        """The cell's probe figures (None when none was sent)."""
        recs = [r for r in self.records if r.status != "cancelled"]
        if not recs:
            return None
        import polars as pl

        ok = [r for r in recs if r.status == "ok"]
        ttft = pl.Series([(r.first_token_ns - r.sent_ns) / 1e6 for r in ok if r.first_token_ns and r.sent_ns],
                         dtype=pl.Float64)
        e2e = pl.Series([(r.end_ns - r.sent_ns) / 1e6 for r in ok if r.end_ns and r.sent_ns], dtype=pl.Float64)
        errors = list(dict.fromkeys(clean_text(r.error)[:160] for r in recs if r.status != "ok" and r.error))[:3]
        spec = self.specs[0]
        return CellProbes(rate=self.rate, input_tokens=spec.input_tokens, output_tokens=spec.output_tokens,
                          sent=len(recs), ok=len(ok), failed=len(recs) - len(ok), ttft_ms=describe(ttft),
                          e2e_ms=describe(e2e), errors=errors)
