"""The report names why requests queued in the server, from the simulator's real /metrics telemetry (issue 44, item
13): a KV cache too small for the load, a cap on running requests (--max-num-seqs), and long prompts admitted only
as fast as the server prefills them (the case the old note called `saturated (KV cache or batch slots)`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.reports.report import build
from servescope.sessions.store import load_session
from servescope.sim.launcher import start_sim

from .helpers import run_json

pytestmark = pytest.mark.slow


def _queue_note(tmp_path: Path, sim_args: list[str], inp: int, out: int) -> str:
    (tmp_path / "w.toml").write_text(f'[workload]\nname = "w"\ninput_tokens = {inp}\noutput_tokens = {out}\n')
    with start_sim("tiny", sim_args) as sim:
        run_json("--url", sim.url, "-w", str(tmp_path / "w.toml"), "-c", "16", "-n", "16", "--telemetry-interval",
                 "0.1s", "--save", str(tmp_path / "s"))
    notes = build(load_session(tmp_path / "s")).notes
    found = [n for n in notes if "in the server's queue" in n]
    assert len(found) == 1, notes
    return found[0]


def test_kv_cache(tmp_path: Path) -> None:
    assert "the KV cache was full" in _queue_note(tmp_path, ["--kv-cache-tokens", "2048"], 128, 384)


def test_batch_slots(tmp_path: Path) -> None:
    note = _queue_note(tmp_path, ["--max-num-seqs", "4"], 64, 256)
    assert "the server's batch slots were full: at most 4 requests ran at once" in note, note


def test_prefill_bound(tmp_path: Path) -> None:
    # 16 prompts of 4,096 tokens through a 2,048-token step (the tiny profile's max_num_batched_tokens)
    note = _queue_note(tmp_path, [], 4096, 16)
    assert "prefill-bound: running requests climbed to " in note, note
