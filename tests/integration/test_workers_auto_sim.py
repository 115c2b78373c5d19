"""`--workers auto` decides per cell, before it starts, how many processes send its load, and says so: a request
rate one process cannot send (short answers: few tokens, many requests) gets more processes, or, where this
machine's cores allow no more, a warning that the client may limit the cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope.core.workercount import cores
from servescope.core.workers import REQ_S_PER_WORKER
from tests.integration.helpers import events, servescope

# the --fast lane leaves this module out: 1 tests, ~7 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def test_auto_says_what_it_decided_for_a_rate(tmp_path: Path) -> None:
    wl = tmp_path / "short.toml"
    wl.write_text('[workload]\nname = "short"\napi = "completions"\ninput_tokens = 16\noutput_tokens = 1\n')
    rate = 1.1 * REQ_S_PER_WORKER  # 2 processes by the rule
    save = tmp_path / "s"
    p = servescope("run", "--url", "sim://tiny", "--rate", f"{rate:g}", "--arrival", "constant", "--duration", "0.5s",
                   "-w", str(wl), "--telemetry-interval", "off", "--save", str(save), "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    [cell] = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    said = [ln for ln in p.stderr.splitlines() if "--workers auto:" in ln]
    assert len(said) == 1, p.stderr[-3000:]
    if cores() > 2:
        assert "2 load processes for 1,650 requests/s" in said[0] and cell["client"]["workers"] == 2
    else:  # the cores less one: 1
        assert said[0].startswith("warning: ") and "asks for 2 load processes" in said[0], said
        assert cell["client"]["workers"] == 1
    logged = [e for e in events(save) if e["kind"] == "EngineNotice" and "--workers auto:" in e["fields"]["text"]]
    assert len(logged) == 1 and logged[0]["fields"]["text"].endswith(said[0].split("): ", 1)[1]), logged
