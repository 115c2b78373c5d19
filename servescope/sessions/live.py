"""A running sweep's session directory is its bus: the runner writes, any number of viewers read, none can
slow it (they only read files the runner appends to).

    runner.lock      who writes the session: {"pid", "host", "started_at"}, held with flock(2) while the runner
                     lives (the kernel drops it when the process dies, kill -9 included); its mtime is the
                     runner's heartbeat, touched every HEARTBEAT_S
    events.jsonl     the append-only event log: one JSON object per line, {"seq", "t", "kind", "fields"}; flushed
                     per batch, fsync'd per finished cell; rotated to events.1.jsonl past MAX_LOG_BYTES, the new
                     file opening with a snapshot (the sweep's start, every finished cell, the running cell's
                     batches) so a viewer that opens late still rebuilds everything
    control.jsonl    the viewers' commands to the runner, one JSON object per line: {"cmd": "skip"|"stop", "cell"}
    runner.log       a detached runner's stdout and stderr

Nothing here knows what the events mean (servescope.engine.wire does); items are plain JSON, written with msgspec
(a NaN is written as null) and read with Python's json (logs written before kept NaN as NaN)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text

LOCK = "runner.lock"
EVENTS = "events.jsonl"
EVENTS_OLD = "events.1.jsonl"
CONTROL = "control.jsonl"
RUNNER_LOG = "runner.log"
BUS_FILES = frozenset({LOCK, EVENTS, EVENTS_OLD, CONTROL, RUNNER_LOG})

HEARTBEAT_S = 2.0
STALE_HEARTBEAT_S = 60.0  # a held lock without a heartbeat this long: the runner is stuck (said, still running)
MAX_LOG_BYTES = 64 * 1024 * 1024
# the kinds a rotated log keeps in its opening snapshot (the running cell's batches are kept as well)
KEEP_KINDS = frozenset({"SweepStarted", "TelemetryMeta", "CellStarted", "CellFinished", "CellSkipped",
                        "EngineNotice", "SweepFinished"})
SNAPSHOT_BATCHES = 2000  # at most this many of the running cell's batches go into a snapshot


class SessionWriteError(ServescopeError):
    """A session file could not be written (a full or read-only disk, a folder that vanished): one line naming
    the file and the OS's reason. The file's earlier version, if any, is untouched. Exit status 1: the run
    failed, as a sweep that fails does."""

    exit_code = 1


def write_failed(path: Path, e: OSError) -> SessionWriteError:
    """The one line for a session file that could not be written, with what to do."""
    why = clean_text(e.strerror or str(e)) or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = "the disk is full: free space"
    elif e.errno == errno.EFBIG:
        todo = "a file-size limit (ulimit -f) stops it: raise the limit or free space"
    elif e.errno == errno.EROFS:
        todo = "the disk is read-only: save to a writable place (--save, --sessions-dir, or a copy of the session)"
    else:
        todo = "check the folder and its permissions"
    return SessionWriteError(f"cannot write {path} ({why}); {todo}")


# ---- the lock ------------------------------------------------------------------------------------------
class RunnerLock:
    """The one writer of a session. `acquire` raises ServescopeError (one line, saying how to attach) when
    another live process holds it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, session_dir: Path) -> RunnerLock:
        p = session_dir / LOCK
        try:
            session_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:  # a read-only or full disk, a path that cannot be made: one line
            raise write_failed(p if session_dir.is_dir() else session_dir, e) from None
        for attempt in range(10):  # a viewer checking the lock holds it shared for a moment
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 9:
                    os.close(fd)
                    raise ServescopeError(second_writer(session_dir, runner_state(session_dir))) from None
                time.sleep(0.05)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        return cls(p, fd)

    def heartbeat(self) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.path)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def second_writer(session_dir: Path, state: RunnerState) -> str:
    """The one line refusing a second writer of a session whose runner is alive (`state`)."""
    return (f"{session_dir} is being written by a running sweep (pid {state.pid or '?'}); watch it with "
            f"`servescope attach {session_dir}` or `servescope watch {session_dir}`")


def refuse_second_writer(session_dir: Path) -> None:
    """Raise the one line of `second_writer` when a live runner writes `session_dir`: what a command that would
    write there checks before it starts anything (RunnerLock.acquire finds it only once a sweep starts)."""
    if (Path(session_dir) / LOCK).exists():
        state = runner_state(Path(session_dir))
        if state.running:
            raise ServescopeError(second_writer(Path(session_dir), state))


@dataclass(frozen=True)
class RunnerState:
    """Whether a live runner writes the session now. `reason` says why a session that reads `running` in
    its session.toml is not (or why a running one looks stuck)."""

    running: bool
    pid: int | None = None
    host: str = ""
    heartbeat_age_s: float | None = None
    reason: str = ""


def _lock_info(p: Path) -> dict[str, object]:
    try:
        data = json.loads(p.read_text(encoding="utf-8") or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def runner_state(session_dir: Path) -> RunnerState:
    """Is a runner alive on this session? The flock says it (a dead process holds none), the lock's mtime
    is its heartbeat."""
    p = Path(session_dir) / LOCK
    if not p.exists():
        return RunnerState(False, reason="its runner left no lock: it ended before it started, or an older "
                           "servescope wrote the session")
    info = _lock_info(p)
    pid = info.get("pid")
    pid = pid if isinstance(pid, int) else None
    host = str(info.get("host", ""))
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        return RunnerState(False, pid, host, reason=f"cannot read {p.name}: {e.strerror}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held = True
    finally:
        os.close(fd)
    try:
        age = max(0.0, time.time() - p.stat().st_mtime)
    except OSError:
        age = None
    if held:
        stuck = age is not None and age > STALE_HEARTBEAT_S
        return RunnerState(True, pid, host, age, f"no heartbeat for {age:.0f} s: the runner may be stuck" if stuck else "")
    return RunnerState(False, pid, host, age, f"its runner (pid {pid or '?'}) is gone: it ended without finishing "
                                              "(killed, or its machine restarted)")


# ---- the event log: writing ------------------------------------------------------------------------------
class _Line(msgspec.Struct):
    """One line of events.jsonl."""

    seq: int
    t: float
    kind: str
    fields: Mapping[str, object]


_ENCODER = msgspec.json.Encoder()


class EventLogWriter:
    """Appends items to events.jsonl (one writer: the runner). Not thread-safe: one thread writes."""

    def __init__(self, session_dir: Path, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.dir = Path(session_dir)
        self.path = self.dir / EVENTS
        self.max_bytes = max_bytes
        self.seq = self._last_seq()
        try:
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the sweep
        except OSError as e:
            raise write_failed(self.path, e) from None
        self._keep: list[str] = []  # lines of KEEP_KINDS, for a snapshot
        self._batches: list[str] = []  # the running cell's RequestsMeasured lines
        self._last_telemetry: str | None = None

    def _last_seq(self) -> int:
        """A resumed sweep appends after the log it left (its seq numbers go on)."""
        last = 0
        for line in _tail_lines(self.path):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                last = max(last, int(json.loads(line).get("seq", 0)))
        return last

    def write(self, kind: str, fields: Mapping[str, object]) -> None:
        self.seq += 1
        line = _ENCODER.encode(_Line(self.seq, round(time.time(), 3), kind, fields)).decode() + "\n"
        self._f.write(line)
        if kind in KEEP_KINDS:
            self._keep.append(line)
            if kind == "CellStarted":
                self._batches = []
        elif kind == "RequestsMeasured":
            self._batches.append(line)
            if len(self._batches) > 2 * SNAPSHOT_BATCHES:
                del self._batches[:SNAPSHOT_BATCHES]
        elif kind == "TelemetryUpdated":
            self._last_telemetry = line

    def flush(self, sync: bool = False) -> None:
        self._f.flush()
        if sync:
            with contextlib.suppress(OSError):
                os.fsync(self._f.fileno())
        if self._f.tell() > self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        """events.jsonl -> events.1.jsonl; the new file opens with the snapshot (seq numbers kept, so a viewer
        that read the old file skips what it has)."""
        tmp = self.dir / (EVENTS + ".tmp")
        budget = self.max_bytes // 2 - sum(len(x) for x in self._keep)  # room left for new items before the next
        recent: list[str] = []
        for line in reversed(self._batches[-SNAPSHOT_BATCHES:]):
            budget -= len(line)
            if budget < 0:
                break
            recent.append(line)
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(self._keep)
            f.writelines(reversed(recent))
            if self._last_telemetry:
                f.write(self._last_telemetry)
            f.flush()
            os.fsync(f.fileno())
        self._f.close()
        os.replace(self.path, self.dir / EVENTS_OLD)
        os.replace(tmp, self.path)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.flush(sync=True)
            self._f.close()


def _tail_lines(path: Path, size: int = 65536) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read()
    except OSError:
        return []
    return [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.startswith("{")]


# ---- the event log: following ----------------------------------------------------------------------------
class EventLogReader:
    """Follows events.jsonl from its start: `poll()` returns the items written since the last call, in order,
    each once (across a rotation too). Never blocks, never writes."""

    def __init__(self, session_dir: Path) -> None:
        self.path = Path(session_dir) / EVENTS
        self._f: BinaryIO | None = None
        self._ino: int | None = None
        self._buf = b""
        self.seq = 0
        self.bad_lines = 0  # whole lines that are not an item (garbage, not a cut last line): the log is damaged

    def _open(self, path: Path) -> bool:
        try:
            f = open(path, "rb")  # noqa: SIM115 - followed across calls
        except OSError:
            return False
        self._f, self._ino, self._buf = f, os.fstat(f.fileno()).st_ino, b""
        return True

    def poll(self, max_bytes: int = 8 * 1024 * 1024) -> list[tuple[str, dict[str, object]]]:
        """The new items as (kind, fields); a SweepStarted's fields gain `started_at`, the line's time (epoch s),
        for viewers."""
        if self._f is None and not self._open(self.path):
            return []
        out = self._read(max_bytes)
        while not out:
            try:
                rotated = os.stat(self.path).st_ino != self._ino
            except OSError:
                rotated = False
            if not rotated:
                break
            # the file followed was rotated and is read to its end: go on in the next one. Rotated twice since
            # the last poll, the next one is events.1.jsonl (the snapshot's seq numbers skip what was read)
            if self._f is not None:
                self._f.close()
            old = self.path.with_name(EVENTS_OLD)
            try:
                nxt = old if os.stat(old).st_ino != self._ino else self.path
            except OSError:
                nxt = self.path
            if not self._open(nxt):
                self._f = None
                break
            out = self._read(max_bytes)
        return out

    def _read(self, max_bytes: int) -> list[tuple[str, dict[str, object]]]:
        data = self._f.read(max_bytes) if self._f is not None else b""
        if not data:
            return []
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        out: list[tuple[str, dict[str, object]]] = []
        for raw in lines:
            try:
                obj = json.loads(raw)  # not msgspec: older logs hold NaN
                seq, kind, fields, t = int(obj["seq"]), str(obj["kind"]), obj["fields"], obj.get("t")
            except (ValueError, KeyError, TypeError, AttributeError):
                self.bad_lines += bool(raw.strip())
                continue  # a line cut short by a crash, or garbage: skipped (and counted)
            if seq <= self.seq or not isinstance(fields, dict):
                continue
            self.seq = seq
            if kind == "SweepStarted" and isinstance(t, (int, float)):
                fields = {**fields, "started_at": float(t)}  # when it started (epoch s), for viewers
            out.append((kind, fields))
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# ---- control: viewers -> runner ------------------------------------------------------------------------------
def send_command(session_dir: Path, cmd: str, cell: int | None = None) -> None:
    """Ask the runner of `session_dir` to `skip` the running cell (`cell`: the index the viewer saw running,
    so a late skip never hits the next cell) or `stop` the sweep (a second stop cancels in-flight requests)."""
    if cmd not in ("skip", "stop"):
        raise ValueError(cmd)
    line = json.dumps({"cmd": cmd, "cell": cell, "t": round(time.time(), 3)}) + "\n"
    fd = os.open(Path(session_dir) / CONTROL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode())  # one write of < PIPE_BUF with O_APPEND: never interleaved
    finally:
        os.close(fd)


class Command(msgspec.Struct, frozen=True):
    """A viewer's command: `skip` the running cell (`cell`: the one the viewer saw running), or `stop`."""

    cmd: Literal["skip", "stop"]
    cell: int | None = None


class ControlReader:
    """The runner's side: new commands since the last poll (a cheap stat when there are none). Commands
    written before the runner started (a stale file) are ignored."""

    def __init__(self, session_dir: Path) -> None:
        self.path = Path(session_dir) / CONTROL
        try:
            self.offset = self.path.stat().st_size
        except OSError:
            self.offset = 0

    def poll(self) -> list[Command]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size <= self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                out.append(msgspec.json.decode(raw, type=Command))
            except msgspec.DecodeError:  # not JSON, or not a command: never obeyed
                continue
        return out


def runner_log_tail(session_dir: Path, lines: int = 3) -> str:
    """The last lines of a detached runner's log, cleaned, for a one-line error."""
    try:
        text = (Path(session_dir) / RUNNER_LOG).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [clean_text(ln).strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])
