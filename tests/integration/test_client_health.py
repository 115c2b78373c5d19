"""The load generator judges itself: `servescope run` against the simulator gives each cell a `client` verdict.
A moderate load leaves the client idle most of the time (`ok`); a client starved of CPU (pinned to one core
beside busy loops) cannot stamp its tokens in time (`bound`, with the figure)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from servescope.core.health import LOOP_LAG_P99_MS, ClientPart, ClientProbe
from servescope.sim.launcher import start_sim
from tests.integration.helpers import Running, metrics, wait_for

CONTRACT = {"verdict", "loop_lag_ms", "cpu_util", "workers", "reasons"}


class _IdleLoop:
    """An idle event loop in a thread of the test while a cell runs: its timers' lag is what the host alone did
    to a loop meanwhile (`part`, ClientProbe's figures)."""

    def __init__(self) -> None:
        self.part: ClientPart | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._probe()), daemon=True)

    async def _probe(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        p = ClientProbe()
        p.start()
        self._ready.set()
        await self._stop.wait()
        self.part = await p.stop()

    def __enter__(self) -> _IdleLoop:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def _priority(nice: int) -> None:
    """In a child: run at `nice` where allowed (a negative one needs the privilege; else unchanged)."""
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)


@pytest.mark.slow
def test_moderate_load_is_ok(tmp_path: Path) -> None:
    """A healthy client is not flagged. The machine is shared: the simulator and the client run at a higher
    priority where allowed, so that other programs cannot starve them (a starved client is rightly flagged: the
    other test). Where a cell is not `ok` while an idle loop beside it was late as well, the host was the cause:
    it runs again (up to 3 times), and is skipped only if the host never let a loop run on time."""
    late_hosts = []
    for _attempt in range(3):
        with start_sim("tiny") as sim:
            with contextlib.suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, sim.proc.pid, -5)
            with _IdleLoop() as idle:
                run = Running("run", "--url", sim.url, "-w", "sharegpt", "-c", "8", "-n", "40", "--warmup", "0",
                              "--sessions-dir", str(tmp_path), "--json", preexec_fn=lambda: _priority(-5))
                with run:
                    rc, stdout, stderr = run.finish(300)
        assert rc == 0, stderr[-3000:]
        (cell,) = json.loads(stdout.strip().splitlines()[-1])["cells"]
        client = cell["client"]
        assert set(client) >= CONTRACT
        assert client["workers"] == 1
        assert set(client["loop_lag_ms"]) == {"p50", "p99", "max"}
        assert 0.0 < client["cpu_util"] < 0.7  # its own CPU (not its wait for one): the host does not change it
        assert client["send_late_p99_ms"] is None  # a closed loop's sends wait for their user by design
        if client["verdict"] == "ok":
            assert client["reasons"] == []
            assert 0.0 <= client["bunched_share"] < 0.3
            assert "client: ok (" in stderr
            return
        assert idle.part is not None and idle.part.loop_lag_ms is not None
        host_lag = idle.part.loop_lag_ms.p99
        assert host_lag > LOOP_LAG_P99_MS[0] / 2, (
            f"a moderate load judged {client['verdict']} ({client['reasons']}) while an idle loop beside it ran "
            f"its timers on time (lag p99 {host_lag:.1f} ms)")
        late_hosts.append(round(host_lag, 1))
    pytest.skip(f"this host was too busy to judge a healthy client: an idle loop's lag p99 was {late_hosts} ms "
                "during each cell")


def _pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


def _renice(pid: int, nice: int) -> None:
    """Every thread of process `pid` to `nice` (raising it is always allowed; lowering it back needs the
    privilege: without it the process stays at the low priority)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def _run_queue_wait_s(pid: int) -> float:
    """How long the process's main thread (the client's event loop) has waited, ready to run, for a CPU."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@pytest.mark.slow
def test_starved_client_is_bound(tmp_path: Path) -> None:
    """c=64, n=64 (every request sent at once): once the simulator has them all, the client drops to the lowest
    priority (nice 19) beside three busy loops on its core; the simulator (on another core) generates the
    replies, which wait in the sockets for a client that gets about 1% of its core. Once the client has waited
    2 s for a CPU and the simulator has finished, the loops stop, the client gets its priority back (where
    allowed) and reads the rest at full speed. Each phase keeps it busy or waiting for a CPU: its verdict
    must be `bound`. The waits are on conditions: a slow host costs time, not the verdict (servescope starts
    and builds its prompts at its normal priority: a starved client's /tokenize connections timed out)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: one for the simulator, one for the starved client and the busy loops")
    cpu_client, cpu_sim = sorted(os.sched_getaffinity(0))[:2]
    n = 64
    wl = tmp_path / "short.toml"
    wl.write_text('[workload]\nname = "short"\napi = "completions"\n'
                  'input_tokens = { dist = "fixed", value = 32 }\noutput_tokens = { dist = "fixed", value = 128 }\n')
    busy: list[subprocess.Popen[bytes]] = []
    with start_sim("tiny") as sim:
        os.sched_setaffinity(sim.proc.pid, {cpu_sim})

        def server(*names: str) -> float:
            m = metrics(sim.url)
            return sum(m.get(k, 0.0) for k in names)

        run = Running("run", "--url", sim.url, "-w", str(wl), "-c", str(n), "-n", str(n), "--warmup", "0",
                      "--telemetry-interval", "off", "--sessions-dir", str(tmp_path), "--json",
                      preexec_fn=lambda: _pin(cpu_client))  # the child's affinity only
        with run:
            try:
                # the loops start once every request has reached the simulator: servescope's start-up and its
                # prompt building (a /tokenize call per prompt) are not what is measured
                wait_for(lambda: run.proc.poll() is not None or server(
                    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:request_success_total") >= n,
                    180, "every request at the simulator")
                assert run.proc.poll() is None, "".join(run.lines)[-3000:]
                wait0 = _run_queue_wait_s(run.proc.pid)
                _renice(run.proc.pid, 19)
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                         preexec_fn=lambda: _pin(cpu_client)) for _ in range(3)]
                wait_for(lambda: run.proc.poll() is not None or (
                    _run_queue_wait_s(run.proc.pid) - wait0 >= 2.0
                    and server("vllm:request_success_total") >= n), 300, "the client to be starved for 2 s")
            finally:
                for b in busy:
                    b.kill()
                    b.wait()
                if run.proc.poll() is None:
                    _renice(run.proc.pid, 0)
            rc, stdout, stderr = run.finish(300)
    assert rc == 0, stderr[-3000:]
    (cell,) = json.loads(stdout.strip().splitlines()[-1])["cells"]
    assert cell["requests_ok"] == n
    client = cell["client"]
    assert set(client) >= CONTRACT
    assert client["verdict"] == "bound", json.dumps(client)
    bound = [r for r in client["reasons"] if "(bound above" in r]
    assert bound and any(w in bound[0] for w in ("CPU", "event-loop lag", "tokens read together")), client
    assert "client: BOUND (" in stderr and "the client, not the server, limited this cell" in stderr
