"""A running `servescope tune` as the session screen follows it: the cell being measured, its requests done read
from that cell's event log (servescope.sessions.live.EventLogReader, as `servescope watch` reads a sweep's), and
the one line the tune view shows for it."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from servescope.engine import wire as w
from servescope.sessions.live import EventLogReader
from servescope.sessions.meta import TuneRunning


@runtime_checkable
class Attaches(Protocol):
    """The app as the tune view needs it: `attach(path)` opens the Run screen on a running sweep (the cell)."""

    def attach(self, path: Path) -> bool: ...


class CellProgress:
    """The running cell's progress: requests done and failed of those planned, from its events.jsonl. `poll()`
    reads what was written since the last call; it never blocks and never writes."""

    def __init__(self, cell_dir: Path) -> None:
        self.dir = cell_dir
        self.reader = EventLogReader(cell_dir)
        self.total: int | None = None
        self.done = 0
        self.failed = 0
        self.started = False
        self.finished = False

    def poll(self) -> None:
        for kind, fields in self.reader.poll():
            item = w.decode_item(kind, fields)
            if isinstance(item, w.CellStarted):
                self.started, self.total = True, item.cell.requests
            elif isinstance(item, w.RequestsMeasured):
                self.started = True
                self.done, self.failed = item.done, item.failed
                self.total = item.cell.requests or self.total
            elif isinstance(item, (w.CellFinished, w.CellSkipped, w.SweepFinished)):
                self.finished = True

    def close(self) -> None:
        self.reader.close()


def running_line(running: TuneRunning, progress: CellProgress | None) -> str:
    """`measuring c=16 --max-num-seqs 64 (step 3): 12/32 requests done` (the count from the cell's event log)."""
    what = f"measuring c={running.concurrency} {running.server_args or 'as launched'} (step {running.step})"
    if progress is None or not progress.started:
        return f"{what}: starting (server and warm-up)"
    if progress.finished:
        return f"{what}: {progress.done}/{progress.total or '?'} requests done, saving the cell"
    failed = f", {progress.failed} failed" if progress.failed else ""
    return f"{what}: {progress.done}/{progress.total or '?'} requests done{failed}"
