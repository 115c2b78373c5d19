"""The Run screen's live server panel: the prefix-cache hit rate from vLLM's counters."""

from __future__ import annotations

from servescope.tui.screens.run import HIT_WINDOW, live_series, prefix_hits


def test_the_hit_rate_is_hits_over_queried_tokens_in_the_window() -> None:
    queries = [0.0, 100.0, 100.0, 300.0] + [300.0 + 100 * i for i in range(1, HIT_WINDOW + 1)]
    hits = [0.0, 0.0, 0.0, 150.0] + [150.0 + 50 * i for i in range(1, HIT_WINDOW + 1)]
    shown, spark = prefix_hits(queries, hits)
    assert spark[:4] == (None, 0.0, None, 75.0)  # no prompt queried between samples 1 and 2: no value
    # the last HIT_WINDOW samples: queries 300 -> 1300 (index 3 -> 13), hits 150 -> 650
    assert shown == "50.0%"


def test_no_counters_no_row() -> None:
    rows = live_series([{"kv_cache_usage": 0.1, "running": 2.0, "waiting": 0.0, "preemptions_total": 0.0}] * 3)
    assert [r[0] for r in rows] == ["KV cache", "running", "waiting", "preemptions"]
    rows = live_series([{"prefix_queries_total": q, "prefix_hits_total": h} for q, h in ((0, 0), (200, 50))])
    assert rows == (("prefix hits", "25.0%", (None, 25.0)),)
