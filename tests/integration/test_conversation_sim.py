"""`servescope run -w chat-multiturn` end to end against servescope's own simulator: every turn resends the
history with the model's actual replies, the per-turn figures and the conversations are in the cell's summary,
and the prefix cache's hit rate is there (from the usage's cached_tokens)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from servescope.core.results import CellResult
from tests.integration.helpers import run_json

# the --fast lane leaves this module out: 1 tests, ~3 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

TEMPLATE_SLACK = 8  # tokens of the chat template around a resent reply (ChatML: `<|im_end|>\n`)


@pytest.mark.slow  # 7 s of the --fast lane on 2 cores
def test_chat_multiturn_resends_the_growing_history(tmp_path: Path) -> None:
    out = run_json("--url", "sim://tiny", "-w", "chat-multiturn", "-c", "2", "-n", "10",
                   "--sessions-dir", str(tmp_path), timeout=120)
    [cell] = out["cells"]
    assert cell["status"] == "done" and cell["requests_ok"] == 10 and cell["requests_failed"] == 0
    session = Path(out["session"])
    [summary_json] = pl.read_parquet(session / "cells.parquet")["summary_json"].to_list()
    s = CellResult.from_json(summary_json)
    assert s is not None

    # per turn: 2 conversations of 5 turns, each turn's prompt longer than the one before
    assert [t.turn for t in s.turns] == [1, 2, 3, 4, 5] and all(t.requests_ok == 2 for t in s.turns)
    means = [t.input_tokens_mean or 0.0 for t in s.turns]
    assert all(b > a + 256 for a, b in zip(means, means[1:], strict=False))  # at least the reply resent each turn
    assert all(t.ttft_ms_p50 is not None and t.ttft_ms_p90 is not None for t in s.turns)
    c = s.conversations
    assert c is not None and (c.started, c.complete, c.turns_mean) == (2, 2, 5.0)
    assert c.output_tokens.mean == 5 * 256 and c.duration_s.p50 is not None and c.input_tokens.p90 is not None

    # each turn: the previous turn's prompt + its reply (the model's actual text, resent) + the new message
    req = pl.read_parquet(session / "requests" / "cell-0000.parquet").sort("conversation", "turn")
    for conv in req.partition_by("conversation"):
        rows = conv.to_dicts()
        assert [r["turn"] for r in rows] == [1, 2, 3, 4, 5] and {r["turns"] for r in rows} == {5}
        for prev, cur in zip(rows, rows[1:], strict=False):
            new_message = cur["input_tokens_requested"] - prev["prompt_tokens"] - prev["output_tokens"]
            assert 200 <= new_message <= 500 + TEMPLATE_SLACK
            assert abs(cur["prompt_tokens"] - cur["input_tokens_requested"]) <= TEMPLATE_SLACK

    # the prefix cache, from the usage's cached tokens (the simulator sends them, as vLLM with
    # --enable-prompt-tokens-details does): each turn's resent history is a hit
    assert req["cached_tokens"].is_not_null().all()
    assert s.prefix_cache_source == "usage" and s.prefix_cache_hit_rate is not None
    assert 0 < s.prefix_cache_hit_rate < 1
    assert s.turns[-1].prefix_cache_hit_rate is not None and s.turns[-1].prefix_cache_hit_rate > 0.5
    assert s.prompt_tokens_cached is not None and s.prompt_tokens_uncached is not None
    # over the same requests: the whole cell's (a steady window's input_tokens_total counts the tokens in its span)
    w = s.whole or s
    assert w.prompt_tokens_cached is not None and w.prompt_tokens_uncached is not None
    assert w.prompt_tokens_cached + w.prompt_tokens_uncached == w.input_tokens_total


AGENT = """
[[workload]]
name = "agent3k"
kind = "agent"
context_tokens = 3000
calls = 4
tool_result_tokens = { dist = "uniform", min = 50, max = 200 }
input_tokens = 64
output_tokens = 16
think_time_s = { dist = "uniform", min = 0.01, max = 0.03 }

[[workload]]
name = "too-long"
kind = "conversation"
turns = 20
input_tokens = 300
output_tokens = 200
"""


def test_agent_sessions_at_a_rate_and_a_conversation_too_long_for_the_model(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text(AGENT)
    out = run_json("--url", "sim://tiny", "-w", str(f), "--rate", "8", "-n", "8", "--sessions-dir", str(tmp_path),
                   timeout=120)
    agent, long = out["cells"]
    assert agent["status"] == "done" and agent["requests_ok"] == 8
    assert long["status"] == "skipped" and long["reason"] == (
        "a conversation of up to 20 turns needs up to 10000 tokens (20 x (in 300 + out 200)), more than the "
        "model's max length 8192")
    req = pl.read_parquet(Path(out["session"]) / "requests" / "cell-0000.parquet").sort("conversation", "turn")
    assert req["turn"].to_list() == [1, 2, 3, 4] * 2 and set(req["user"].to_list()) == {-1}
    first = req.filter(pl.col("turn") == 1)["prompt_tokens"].to_list()
    assert all(3000 + 64 <= n <= 3000 + 64 + TEMPLATE_SLACK for n in first)  # the shared context, then the task
    later = req.filter(pl.col("turn") > 1)
    grew = (later["input_tokens_requested"] - later["prompt_tokens"]).abs().max()
    assert isinstance(grew, int) and grew <= TEMPLATE_SLACK
