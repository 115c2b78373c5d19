"""`run --rate 100000 --duration 2s` against the simulator under a memory limit (issue 44, item 15): one process
cannot send 100,000 requests a second, so the cell holds at most its pending cap, stops sending at its duration,
waits a bounded grace for the answers in flight, and says the rate was not reached (the client's verdict `bound`).
Before, it held every scheduled request at once (1.8 GB) and ran on for minutes."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from tests.integration.helpers import Running, events, wait_for

LIMIT_BYTES = 2 << 30  # address space for servescope and the simulator it starts, each: a run in bounds needs ~1 GB


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


@pytest.mark.slow
def test_an_open_loop_past_what_one_process_can_send_ends_near_its_duration_and_says_so(tmp_path: Path) -> None:
    save = tmp_path / "s"
    duration = 2.0
    with Running("run", "--url", "sim://tiny", "--rate", "100000", "--duration", f"{duration:g}s",
                 "--telemetry-interval", "off", "--save", str(save), "--json", preexec_fn=_limit) as run:
        # a generous multiple of the duration (the simulator's start included): it waits on the event log, and ends
        # as soon as the sweep's end is there
        wait_for(lambda: any(e["kind"] == "SweepFinished" for e in events(save)), 60 * duration,
                 "the sweep's end in its event log")
        rc, out, err = run.finish(60)
    assert rc == 0, err[-3000:]
    [cell] = json.loads(out.strip().splitlines()[-1])["cells"]
    client = cell["client"]
    assert client["verdict"] == "bound", client
    assert client["reasons"][0].startswith("the rate was not reached: "), client["reasons"]
    assert "of 100,000 asked" in client["reasons"][0]
    assert client["rate_behind_s"] > 0.5 * duration
    assert "the rate was not reached" in err  # the CLI's client line says it
