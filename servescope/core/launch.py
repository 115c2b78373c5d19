"""Launch a local inference server from a command line, wait for `/health`, stop it cleanly.

`ServerProcess.start(spec, log_path)` runs a `LaunchSpec` (read by `parse_launch()`, in
`servescope.core.launchspec`, re-exported here) in its own process group with stdout and stderr going to
`log_path` through the log filter (`servescope.core.secrets.start_log_pump`: no secret it knows of reaches
the file), polls `/health` while checking the process is alive, and raises `ServerStartError` (one line,
plus `.log_tail`) when it dies or times out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from servescope.core.errors import ServescopeError
from servescope.core.kvbudget import kv_budget_from_log
from servescope.core.launchspec import LaunchSpec, free_port, parse_launch, with_variant
from servescope.core.orphanguard import start_guard, stop_guard
from servescope.core.secrets import command_secrets, env_secrets, redact_log, start_log_pump
from servescope.core.textsafe import clean_text

if TYPE_CHECKING:
    from servescope.core.kvbudget import KVBudget

__all__ = ["LaunchSpec", "ServerProcess", "ServerStartError", "free_port", "parse_launch", "with_variant"]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class ServerStartError(ServescopeError):
    """The server died or never became healthy. `.log_tail` holds its last log lines (cleaned)."""

    def __init__(self, message: str, log_tail: str = "", log_path: Path | None = None,
                 returncode: int | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode


def _health(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


class ServerProcess:
    """A server launched by servescope. Use `ServerProcess.start(spec, log_path)` (blocking until healthy;
    from async code wrap it in `asyncio.to_thread`)."""

    def __init__(self, spec: LaunchSpec, log_path: Path, env: dict[str, str] | None = None,
                 secrets: Iterable[str | None] = ()) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self._env = env
        # what the log filter removes: the command's secrets, the server's environment's, and the caller's (the
        # API key the client sends)
        self.secrets = sorted({s for s in (*command_secrets(spec.command), *env_secrets(self._child_env()), *secrets)
                               if s}, key=len, reverse=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: subprocess.Popen[bytes] | None = None  # writes the server's output to the log, redacted
        self._log_offset = 0  # where this run's output starts in log_path (restart appends)
        self._kv: KVBudget | None = None
        self.started_at = 0.0
        self.healthy_after_s: float | None = None
        self.starts = 0
        self._guard: subprocess.Popen[bytes] | None = None  # stops the server's group if servescope dies

    # --- life cycle -----------------------------------------------------------------------------------
    @classmethod
    def start(cls, spec: LaunchSpec, log_path: Path | str, env: dict[str, str] | None = None,
              health_timeout_s: float = 600, secrets: Iterable[str | None] = (),
              stopping: Callable[[], bool] | None = None) -> ServerProcess:
        """Launch and wait until healthy. `secrets`: values the log must never hold besides those of the
        command and of the environment (e.g. the API key the client sends); `stopping()` true (Ctrl-C, SIGTERM,
        `q` while a model loads) ends the wait: the server is stopped and ServerStartError says so."""
        sp = cls(spec, Path(log_path), env, secrets)
        sp._launch(health_timeout_s, stopping)
        return sp

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ if self._env is None else self._env)
        env.update(self.spec.env)
        return env

    def _launch(self, health_timeout_s: float, stopping: Callable[[], bool] | None = None) -> None:
        spec = self.spec
        check_host = "127.0.0.1" if spec.host in ("0.0.0.0", "", "::") else spec.host.strip("[]")
        if _port_in_use(check_host, spec.port):
            raise ServerStartError(f"cannot launch the server: port {spec.port} on {check_host} is already in use "
                                   "(stop what listens there or give another --port)")
        env = self._child_env()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            if self.starts:
                log.write(f"\n--- servescope: restart {self.starts} ---\n".encode())
                log.flush()
                self._log_offset = log.tell()
            try:
                self._pump, out = start_log_pump(log, self.secrets)
            except OSError as e:
                raise ServerStartError(f"cannot start the server's log filter: {clean_text(e.strerror or str(e))}",
                                       log_path=self.log_path) from None
            try:
                self.proc = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=out, env=env, start_new_session=True)
            except OSError as e:
                os.close(out)
                self._finish_log()
                raise ServerStartError(f"cannot start {clean_text(spec.argv[0])!r}: {clean_text(e.strerror or str(e))}"
                                       " (is it installed and on PATH?)", log_path=self.log_path) from None
            os.close(out)  # the server (and its children) hold it now: the pump ends when they are all gone
        self._guard = start_guard(self.proc.pid)  # the server dies with servescope, even on kill -9
        self.starts += 1
        self._kv = None
        self.started_at = time.monotonic()
        self.healthy_after_s = None
        self._wait_healthy(health_timeout_s, stopping)

    def _wait_healthy(self, timeout_s: float, stopping: Callable[[], bool] | None = None) -> None:
        assert self.proc is not None
        deadline = self.started_at + timeout_s
        delay = 0.2
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._group_kill()
                tail = self.log_tail(30)
                raise ServerStartError(
                    f"the server exited with code {rc} before /health answered "
                    f"({time.monotonic() - self.started_at:.0f} s); last log line: {self._last_line(tail)}; "
                    f"log: {self.log_path}", tail, self.log_path, rc)
            if _health(self.url, timeout=2.0):
                self.healthy_after_s = time.monotonic() - self.started_at
                return
            if stopping is not None and stopping():
                self.stop(grace_s=10)
                raise ServerStartError(
                    f"stopped while the server was starting ({time.monotonic() - self.started_at:.0f} s, before "
                    f"/health answered); log: {self.log_path}", self.log_tail(30), self.log_path, None)
            if time.monotonic() > deadline:
                self.stop(grace_s=10)
                tail = self.log_tail(30)
                raise ServerStartError(
                    f"the server did not answer /health within {timeout_s:g} s (stopped it); "
                    f"last log line: {self._last_line(tail)}; log: {self.log_path}", tail, self.log_path, None)
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    @staticmethod
    def _last_line(tail: str) -> str:
        lines = [x for x in tail.splitlines() if x.strip()]
        return (lines[-1][:300] if lines else "(empty)")

    def restart(self, health_timeout_s: float = 600) -> ServerProcess:
        """Stop (if still running) and start again with the same spec and port; the log is appended."""
        self.stop()
        deadline = time.monotonic() + 10
        check_host = "127.0.0.1" if self.spec.host in ("0.0.0.0", "", "::") else self.spec.host.strip("[]")
        while _port_in_use(check_host, self.spec.port) and time.monotonic() < deadline:
            time.sleep(0.2)
        self._launch(health_timeout_s)
        return self

    def stop(self, grace_s: float = 10) -> int | None:
        """SIGTERM to the whole process group, SIGKILL after `grace_s`; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + (grace_s if proc.returncode is not None else 0)
        while self._group_alive() and time.monotonic() < deadline:  # children (engine cores) still exiting
            time.sleep(0.1)
        self._group_kill()
        if proc.poll() is None:
            proc.wait()
        self._scrub_log()
        return proc.returncode

    def _finish_log(self, timeout_s: float = 5.0) -> None:
        """Wait for the log filter to write the server's last output (it ends once no process holds its pipe);
        stop it after `timeout_s` (a process that left the group still holds the pipe: its unfinished line
        is lost, never written unfiltered)."""
        pump, self._pump = self._pump, None
        if pump is None:
            return
        try:
            pump.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pump.kill()
            pump.wait()

    def _scrub_log(self) -> None:
        """The log through the same filter once more, once the server is stopped (the filter already kept every
        secret out of it: this rewrites nothing unless the log was written some other way)."""
        if not self.secrets:
            return
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="surrogateescape")
            if not any(s in text for s in self.secrets):
                return
            clean = redact_log(text, self.secrets)
            if clean != text:
                tmp = self.log_path.with_name(self.log_path.name + ".tmp")
                tmp.write_text(clean, encoding="utf-8", errors="surrogateescape")
                os.replace(tmp, self.log_path)
        except OSError:
            pass

    def _group_alive(self) -> bool:
        """Whether any process of the server's group still runs (zombies waiting for init do not count)."""
        if self.proc is None:
            return False
        pgid = self.proc.pid
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        proc_dir = Path("/proc")
        if not proc_dir.is_dir():
            return True
        for d in proc_dir.iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # state ppid pgrp ...
            if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
        return False

    def _group_kill(self) -> None:
        if self.proc is None:
            return
        if self._group_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait()
        deadline = time.monotonic() + 5
        while self._group_alive() and time.monotonic() < deadline:  # SIGKILL is delivered asynchronously
            time.sleep(0.02)
        stop_guard(self._guard)
        self._guard = None
        self._finish_log()

    # --- state ----------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """One GET /health (blocking): True on 200."""
        return self.alive() and _health(self.url, timeout_s)

    def log_text(self) -> str:
        """This run's log (since the last start), as text."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return redact_log(text, self.secrets)

    def log_tail(self, n: int = 30) -> str:
        """The last `n` lines of this run's log, terminal control sequences removed."""
        lines = self.log_text().splitlines()[-n:]
        return "\n".join(clean_text(x) for x in lines)

    @property
    def kv_budget(self) -> KVBudget | None:
        """The KV-cache budget from this run's startup log (None until vLLM has logged it)."""
        if self._kv is None:
            self._kv = kv_budget_from_log(self.log_text())
        return self._kv

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
