"""The simulator's engine loop: runs the scheduler (`servescope.sim.engine`) against the event loop's clock.

Each step sleeps until its simulated end (an absolute deadline, so timer granularity never accumulates) and
then emits its tokens. When the simulator's own CPU makes a step end late, the lag is counted, exported in
`/metrics` and logged.
"""

from __future__ import annotations

import asyncio
import logging

from servescope.sim.engine import Scheduler
from servescope.sim.metrics import Metrics
from servescope.sim.profile import CostModel
from servescope.sim.request import ABORTED, SimRequest

log = logging.getLogger("servescope.sim")

LATE_TOLERANCE_S = 0.003  # beyond timer granularity: a step this late is counted as lag
RESYNC_S = 0.025  # a step later than this restarts the simulated clock from now (time lost for good)
WARN_EVERY_S = 5.0


class EngineLoop:
    def __init__(self, cost: CostModel, metrics: Metrics) -> None:
        self.cost = cost
        self.sched = Scheduler(cost)
        self.metrics = metrics
        self.wake = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self._late_window = 0
        self._late_window_max = 0.0
        self._last_warn = self.loop.time()
        self._ready_t = float("inf")
        self._last_end = 0.0

    def add(self, req: SimRequest, ready_t: float) -> None:
        """Queue a request that became ready (front end done) at `ready_t` on the loop clock."""
        self.sched.add(req)
        self._ready_t = min(self._ready_t, ready_t)
        self.wake.set()

    def abort(self, req: SimRequest) -> None:
        if req.state != ABORTED and req.done_t < 0:
            self.sched.abort(req)
            self.metrics.success["abort"] += 1

    async def run(self) -> None:
        loop = self.loop
        sched = self.sched
        m = self.metrics
        t_next = loop.time()
        while True:
            if not sched.has_work():
                self._ready_t = float("inf")
                self.wake.clear()
                await self.wake.wait()
                # start when the request became ready, so that the handler's oversleep is not added
                t_next = max(self._last_end, min(loop.time(), self._ready_t))
            now = loop.time()
            if now - t_next > RESYNC_S:
                t_next = now
            step = sched.schedule(t_next)
            if not step.reqs:
                # nothing fits; wait for an abort or a finish to free blocks
                self.wake.clear()
                await self.wake.wait()
                continue
            t_end = t_next + step.duration
            delay = t_end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let handlers write
            late = loop.time() - t_end
            if late > LATE_TOLERANCE_S:
                m.late_steps += 1
                m.lag_seconds += late
                m.max_lag_seconds = max(m.max_lag_seconds, late)
                self._late_window += 1
                self._late_window_max = max(self._late_window_max, late)
            sched.finish(step, t_end)
            t_next = self._last_end = t_end
            if self._late_window and t_end - self._last_warn > WARN_EVERY_S:
                log.warning(
                    "%d engine steps ended late (up to %.1f ms) in the last %.0f s: the simulator's own CPU "
                    "cannot keep real time at this load; latencies are pessimistic",
                    self._late_window, self._late_window_max * 1e3, t_end - self._last_warn,
                )
                self._late_window = 0
                self._late_window_max = 0.0
                self._last_warn = t_end
