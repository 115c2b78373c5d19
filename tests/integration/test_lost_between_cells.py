"""A server lost between two cells (issue 44, item 18). `run --url`: the simulator is killed as cell 1's last answer
goes out (a proxy in front of it kills it the moment it forwards that answer's [DONE], so cell 2's prompts meet a
dead server, every time), and started again once servescope says it waits: the sweep waits --recover-timeout and
runs cell 2, as it does for a server lost mid-cell (it failed with `lost ... while building prompts`). `tune
--launch`: the launched simulator exits after each cell's requests; every next cell relaunches it, as `run --launch`
does (it said `check --url`, though no --url was given)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import Running, servescope, wait_for
from tests.support.loopthread import LoopThread
from tests.support.meta import stored
from tests.support.vllm_server import free_port

MARK = b"data: [DONE]"
END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body: the answer is whole


class KillingProxy(LoopThread):
    """A TCP proxy in a thread: forwards 127.0.0.1:`port` to `upstream`; before it forwards the `nth` [DONE] of the
    answers, it calls `at_nth()`. A connection whose upstream cannot be reached is closed at once."""

    def __init__(self, upstream: int, nth: int, at_nth: Callable[[], None]) -> None:
        self.upstream, self.nth, self.at_nth = upstream, nth, at_nth
        self.seen = 0
        self.port = 0
        super().__init__()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            cw.close()
            return

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, answers: bool) -> None:
            carry = b""
            armed = -1  # where in `buf` the nth [DONE] was seen: its response ends at the next chunked END
            try:
                while data := await r.read(65536):
                    if answers:
                        buf = carry + data
                        at = 0
                        while (at := buf.find(MARK, at)) >= 0:
                            self.seen += 1
                            at += len(MARK)
                            if self.seen == self.nth:
                                armed = at
                        if armed >= 0 and buf.find(END, armed) >= 0:
                            armed = -1
                            self.at_nth()  # blocks this loop while it kills: the answer's end passes after it
                        carry = buf[-(len(END) - 1):]
                        armed = max(-1, armed - (len(buf) - len(carry))) if armed >= 0 else -1
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        await asyncio.gather(pump(cr, uw, False), pump(ur, cw, True))


def _sim(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "servescope.sim", "--profile", "tiny", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _answers(port: int) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_server_lost_between_cells_is_waited_for_and_the_next_cell_runs(tmp_path: Path) -> None:
    port = free_port()
    sims = [_sim(port)]

    def kill() -> None:
        sims[0].kill()
        sims[0].wait()

    try:
        wait_for(lambda: _answers(port), 60, "the simulator")
        with KillingProxy(port, 3, kill) as proxy, \
                Running("run", "--url", f"http://127.0.0.1:{proxy.port}", "-w", "sharegpt", "-c", "1,2", "-n", "3",
                        "--telemetry-interval", "off", "--recover-timeout", "300s", "--save", str(tmp_path / "s"),
                        "--json") as run:
            run.line(r"stopped answering before cell 2 \(sharegpt c=2\), while building its prompts .*waiting up to "
                     r"300 s", 180)
            assert sims[0].returncode is not None  # killed between the cells, as cell 1's last answer went out
            sims.append(_sim(port))  # back: the sweep, still waiting, finds it
            rc, stdout, stderr = run.finish(300)
    finally:
        for p in sims:
            p.kill()
            p.wait()
    assert rc == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["status"] == "completed"
    assert [(c["status"], c["requests_ok"]) for c in out["cells"]] == [("done", 3), ("done", 3)]
    assert "while building prompts" not in stderr
    events = [e for e in stored(load_session(tmp_path / "s"))["events"] if e["kind"] != "ramp"]  # type: ignore[index]
    assert [e["kind"] for e in events] == ["server_lost", "server_back"]  # type: ignore[union-attr]
    assert "before cell 2" in events[0]["text"] and "re-running cell 2" in events[1]["text"]  # type: ignore[index]


@pytest.mark.slow
def test_tune_relaunches_a_launched_server_that_died_between_cells(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text('[workload]\nname = "short"\ninput_tokens = 64\noutput_tokens = 8\n')
    # each launch answers start-up's first-token probe, then each cell sends exactly 4 requests, and the server
    # exits after those 5: every cell after the first needs it back
    p = servescope("tune", "--launch", "servescope sim --profile tiny --exit-after-requests 5", "-w",
                   str(tmp_path / "w.toml"), "-c", "1", "-n", "4", "--budget", "2",
                   "--sessions-dir", str(tmp_path / "sessions"), "--json", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "check --url" not in p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cells_measured"] == 2
    session = Path(out["session"])
    tune = stored(load_session(session))["tune"]
    assert [st["objective"] > 0 for st in tune["path"]] == [True, True]  # type: ignore[index]
    # the second cell ran on a server started again: relaunched before it, or restarted when it was lost
    second = load_session(session / tune["path"][1]["cell"])  # type: ignore[index]
    launches = sorted(p.name for p in (session / "servers").iterdir())
    kinds = [e["kind"] for e in stored(second).get("events") or []]  # type: ignore[union-attr]
    assert len(launches) == 2 or "server_back" in kinds, (launches, kinds)


@pytest.mark.slow
def test_tune_whose_server_is_lost_for_good_fails_and_is_not_interrupted(tmp_path: Path) -> None:
    """A server that dies within every cell (the start-up probe plus 3 of its 4 requests) is lost for good: tune
    fails with the runner's one line (exit 2), not as if Ctrl-C had stopped it (exit 130, 'interrupted')."""
    (tmp_path / "w.toml").write_text('[workload]\nname = "short"\ninput_tokens = 64\noutput_tokens = 8\n')
    p = servescope("tune", "--launch", "servescope sim --profile tiny --exit-after-requests 4", "-w",
                   str(tmp_path / "w.toml"), "-c", "1", "-n", "4", "--budget", "2",
                   "--sessions-dir", str(tmp_path / "sessions"), timeout=240)
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("servescope tune: error: ") and "was lost 3 times" in last, p.stderr
    assert "interrupted" not in p.stderr
