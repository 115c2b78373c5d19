"""A stop (SIGTERM, the app's q) during the wait for a lost server: the runner says the wait it really made,
and the sweep is interrupted (resumable), not failed with the wait it was allowed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from servescope.engine.events import Event, Notice, SweepControl, SweepFinished
from servescope.sessions.store import load_session
from tests.engine.test_runner_fakes import FakeServer, FakeTarget, _ctx, _run, _spec
from tests.support.meta import stored


@dataclass
class WaitingServer(FakeServer):
    """Never comes back: its recovery waits until the sweep is stopped (`stopped` is set with the stop)."""

    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def recover(self, timeout_s: float, stopping: Callable[[], bool]) -> bool:
        self.recoveries += 1
        async with asyncio.timeout(timeout_s):
            await self.stopped.wait()
        assert stopping()
        return False


async def test_a_stop_during_the_recovery_wait_says_the_real_wait_and_interrupts(tmp_path: Path) -> None:
    server = WaitingServer()
    target = FakeTarget(server, die_in={(0, 1): 1})

    def stop_when_waiting(ev: Event, control: SweepControl) -> None:
        if isinstance(ev, Notice) and "waiting up to 300 s" in ev.text:
            control.stop("stopped by SIGTERM")
            server.stopped.set()

    events = await asyncio.wait_for(_run(_spec(recover_timeout_s=300.0), _ctx(tmp_path / "s"), server, target,
                                         on_event=stop_when_waiting), timeout=60)
    texts = [e.text for e in events if isinstance(e, Notice)]
    assert not any("300 s;" in t or "within 300 s" in t for t in texts), texts
    said = [t for t in texts if t.startswith("stopped after waiting")]
    assert len(said) == 1 and "stopped after waiting 0 s (of up to 300 s)" in said[0], texts
    assert f"servescope resume {tmp_path / 's'}" in said[0]
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "interrupted"
    assert stored(load_session(tmp_path / "s"))["status"] == "interrupted"
