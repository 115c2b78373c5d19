"""The runner's side of the session bus (servescope.sessions.live): while a sweep runs it holds the session's
lock, writes every event to the session's event log, keeps a heartbeat and obeys the viewers' commands
(skip the running cell, stop the sweep).

Events are handed over with `publish` (a queue put: the sweep's event loop never waits on a disk or a
viewer); one writer thread turns them into the wire's items (servescope.engine.wire), appends them, flushes per
batch, fsyncs per finished cell, touches the heartbeat and polls the control file."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from pathlib import Path
from typing import Literal, Protocol

from servescope.engine.events import (
    CellFinished,
    CellSkipped,
    CellStarted,
    Event,
    SweepControl,
    SweepFinished,
)
from servescope.engine.wire import Translator
from servescope.sessions.live import HEARTBEAT_S, ControlReader, EventLogWriter, RunnerLock

__all__ = ["Bus", "BusFactory", "SweepBus"]

POLL_S = 0.5  # how often an idle writer thread looks at the control file (it also looks after every batch)


class Bus(Protocol):
    def publish(self, ev: Event) -> None: ...

    def close(self) -> None: ...


class BusFactory(Protocol):
    def __call__(self, session_dir: Path, control: SweepControl, target_label: str | None) -> Bus: ...


class SweepBus:
    """Acquires the session's lock on creation (ServescopeError when another runner holds it)."""

    def __init__(self, session_dir: Path, control: SweepControl, target_label: str | None) -> None:
        self.dir = Path(session_dir)
        self.control = control
        self.lock = RunnerLock.acquire(self.dir)
        try:
            self.log = EventLogWriter(self.dir)
            self.commands = ControlReader(self.dir)
        except BaseException:
            self.lock.release()
            raise
        self.translate = Translator(target_label)
        self.running_cell: int | None = None
        self._q: queue.SimpleQueue[Event | None] = queue.SimpleQueue()  # None: close
        self._stops = 0
        self._thread = threading.Thread(target=self._work, name="servescope-bus", daemon=True)
        self._thread.start()

    def publish(self, ev: Event) -> None:
        if isinstance(ev, CellStarted):
            self.running_cell = ev.cell.index
        elif isinstance(ev, (CellFinished, CellSkipped)) and self.running_cell == ev.cell.index:
            self.running_cell = None
        self._q.put(ev)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
        self.log.close()
        self.lock.release()

    # ---- the writer thread ----------------------------------------------------------------------------
    def _work(self) -> None:
        beat = time.monotonic()
        while True:
            ev: Event | Literal[False] | None  # False: nothing queued
            try:
                ev = self._q.get(timeout=POLL_S)
            except queue.Empty:
                ev = False
            if ev is None:
                return
            sync = False
            while ev is not False:
                if ev is None:
                    self._q.put(None)  # seen below, after this batch is written
                    break
                sync = sync or self._write(ev)
                try:
                    ev = self._q.get_nowait()
                except queue.Empty:
                    ev = False
            with contextlib.suppress(OSError, ValueError):
                self.log.flush(sync=sync)
            self._obey()
            if time.monotonic() - beat >= HEARTBEAT_S:
                beat = time.monotonic()
                self.lock.heartbeat()

    def _write(self, ev: Event) -> bool:
        """Write one event's items; True when the log should be fsync'd (a cell or the sweep ended)."""
        try:
            items = self.translate(ev)
        except Exception:  # noqa: BLE001 - a viewer's convenience never stops the sweep
            return False
        for item in items:
            with contextlib.suppress(OSError, ValueError, TypeError):
                self.log.write(item.kind, item.fields())
        return isinstance(ev, (CellFinished, CellSkipped, SweepFinished))

    def _obey(self) -> None:
        try:
            cmds = self.commands.poll()
        except OSError:
            return
        for c in cmds:
            if c.cmd == "skip":
                if c.cell is None or c.cell == self.running_cell:
                    self.control.skip_cell("skipped by the user")
            elif c.cmd == "stop":
                self._stops += 1
                self.control.stop("stopped by the user", let_in_flight_finish=self._stops == 1)
