"""The /metrics scrape against a live server: it reads, from the real CPU vLLM's own text, what prometheus_client's
parser of the whole text gives for every family servescope shows, and a run says what its scrapes
cost the client (the client line and the cell's client summary), the few at a cell's ends with telemetry off too."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from servescope.core.telemetry import parse_metrics
from tests.core.test_scrape import _reference
from tests.integration.helpers import servescope

# the --fast lane leaves this module out: 1 tests, ~8 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def _run(tmp_path: Path, url: str, *flags: str) -> tuple[dict[str, object], str]:
    """One cell of 2 users for 2.5 s: its JSON and its client line."""
    wl = tmp_path / "w.toml"
    wl.write_text('[workload]\nname = "short"\napi = "completions"\ninput_tokens = 32\noutput_tokens = 8\n')
    p = servescope("run", "--url", url, "-w", str(wl), "-c", "2", "--duration", "2.5s", "--sessions-dir",
                   str(tmp_path / "sessions"), "--json", *flags, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    [cell] = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip().startswith("client: ")]  # the report, on stderr
    assert len(lines) == 1, p.stderr[-3000:]
    return cell, lines[0]


def _scrapes(client: dict[str, object]) -> tuple[int, str]:
    """The scrapes in the cell, from what the client summary says of them, and the words the client line uses."""
    per_s, each, wall = client["telemetry_cpu_ms_per_s"], client["telemetry_ms_per_scrape"], client["wall_s"]
    assert isinstance(per_s, float) and isinstance(each, float) and isinstance(wall, float)
    assert per_s > 0 and each > 0
    return round(per_s * wall / each), f"/metrics scrapes {per_s:.2f} ms CPU/s ({each:.2f} ms each)"


def _says(line: str, said: str, client: dict[str, object]) -> bool:
    """The client line holds the figure, unless the cell was BOUND: that line gives the reasons alone."""
    return said in line if client["verdict"] != "bound" else "BOUND" in line


def _check(tmp_path: Path, url: str) -> None:
    """Sampled every 0.25 s, the cell's scrapes are many; with telemetry off only those at its start and end (the
    server's per-cell deltas) are made, and said the same way."""
    cell, line = _run(tmp_path, url, "--telemetry-interval", "0.25s")
    client = cell["client"]
    assert isinstance(client, dict)
    n, said = _scrapes(client)
    assert n >= 4 and _says(line, said, client), (n, line)

    cell, line = _run(tmp_path, url, "--telemetry-interval", "off")
    client = cell["client"]
    assert isinstance(client, dict)
    n, said = _scrapes(client)
    assert 1 <= n <= 2 and _says(line, said, client), (n, line)


def test_the_simulator_run_says_what_its_scrapes_cost(tmp_path: Path) -> None:
    _check(tmp_path, "sim://tiny")


@pytest.mark.vllm
def test_a_live_vllm_text_reads_as_the_whole_text_parse(vllm_server) -> None:
    with urllib.request.urlopen(vllm_server.url + "/metrics", timeout=10) as r:
        body = r.read()
    got = parse_metrics(body)
    assert got == _reference(body.decode())
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_sum",
                 "vllm:prefix_cache_queries_total", "cache_config.block_size"):
        assert name in got, name


@pytest.mark.vllm
def test_a_vllm_run_says_what_its_scrapes_cost(vllm_server, tmp_path: Path) -> None:
    _check(tmp_path, vllm_server.url)
