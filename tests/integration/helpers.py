from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from servescope.core.servermetrics import parse

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def servescope(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def run_json(*args: str, **kw: Any) -> dict[str, Any]:
    p = servescope("run", *args, "--json", **kw)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse(r.read().decode())


def wait_for(cond: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `cond` until it returns something true (returned); fail saying `what` after `timeout` s. Limits
    are generous: the wait ends as soon as the condition holds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(interval)


def events(session_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of a session's event log (events.jsonl), in order; [] before it exists."""
    try:
        data = (Path(session_dir) / "events.jsonl").read_bytes()
    except OSError:
        return []
    out = []
    for raw in data.split(b"\n")[:-1]:  # the last piece is a line still being written (or b"")
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def measured(evs: list[dict[str, Any]], cell: int) -> int:
    """How many requests of cell `cell` the event log says finished (its last RequestsMeasured's `done`)."""
    done = [e["fields"]["done"] for e in evs if e["kind"] == "RequestsMeasured" and e["fields"]["cell"]["index"] == cell]
    return max(done, default=0)


class Running:
    """`servescope ARGS` started as a user would, its stderr lines collected as they come (`lines`) and its
    stdout kept whole; `finish()` waits for it and returns (exit code, stdout, stderr)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, **popen: Any) -> None:
        e = dict(os.environ)
        e.update(env or {})
        self.lines: list[str] = []
        self._out: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "servescope", *args], cwd=ROOT, env=e, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stderr, self.lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stdout, self._out), daemon=True)]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def line(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        """The first stderr line matching `pattern` (a regex), waiting for it while the process runs."""
        def found() -> re.Match[str] | None:
            ended = not self._readers[0].is_alive()  # read to its end: the process closed its stderr
            for x in list(self.lines):
                m = re.search(pattern, x)
                if m:
                    return m
            assert not ended, f"servescope ended before saying {pattern!r}:\n{''.join(self.lines)[-3000:]}"
            return None

        return wait_for(found, timeout, f"servescope to say {pattern!r}")

    def sim_url(self, timeout: float = 120) -> str:
        """The URL of the simulator `--url sim://NAME` started (from its stderr line)."""
        return self.line(r"started the simulator \(sim://[^)]*\) at (\S+)", timeout).group(1)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        """Killed if still running (a failed wait): the test fails at once, not after the process's timeout."""
        self.finish(0 if self.proc.poll() is None else 10)

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        try:
            rc = self.proc.wait(timeout) if timeout > 0 else -9
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for t in self._readers:
                t.join(10)
        return rc, "".join(self._out), "".join(self.lines)
