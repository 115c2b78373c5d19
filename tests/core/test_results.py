"""CellResult: today's summary dict survives from_dict -> to_dict unchanged (so stored summary_json and
`--json` keep their shape), junk never raises, and the METRICS table drives labels and directions."""

from __future__ import annotations

import ast
import json
import math
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from servescope.core.metrics import FORMULAS, records_frame, summarize
from servescope.core.results import (
    DIST_KEYS,
    METRICS,
    PARTS,
    STATS,
    CellResult,
    Dist,
    GpuWindow,
    ServerWindow,
    TelemetryWindow,
    figure,
    metric_better,
    metric_label,
    summary_columns,
)
from servescope.core.slo import SLO_KEYS, lower_bound
from servescope.core.telemetry import MetricsSampler, server_delta
from tests.sessions.conftest import CellSpec, _records


def _summary(**spec: Any) -> dict[str, Any]:
    """A cell's figures as stored (summary_json)."""
    recs, wall = _records(CellSpec("w", 4, **spec))
    return summarize(records_frame(recs), wall, {"ttft_ms": 200.0}).to_dict()


def _gpu() -> dict[str, Any]:
    per = {"index": 0, "name": "NVIDIA H200", "energy_wh": 1.5, "mem_used_gib_peak": 70.0, "mem_total_gib": 141.0,
           "util_pct_mean": 97.0, "power_w_mean": 600.0, "temp_c_max": 70.0}
    return {"available": True, "reason": None, "gpus": 1, "names": ["NVIDIA H200"], "duration_s": 9.0, "samples": 9,
            "energy_wh": 1.5, "energy_coverage": 1.0, "energy_wh_counter": 1.49, "output_tokens": 5120,
            "wh_per_1m_output_tokens": 293.0, "price_usd_per_kwh": 0.2, "cost_usd_per_1m_output_tokens": 0.0586,
            "mem_used_gib_peak": 70.0, "mem_total_gib": 141.0, "util_pct_mean": 97.0, "power_w_mean": 600.0,
            "power_w_peak": 650.0, "sm_clock_mhz_mean": 1980.0, "temp_c_max": 70.0, "per_gpu": [per]}


def _full() -> dict[str, Any]:
    """A summary as the runner writes it: summarize() + server deltas + telemetry + GPU windows."""
    s = _summary(failed=2, prompt_delta=3)
    before = {"vllm:request_success_total": 10.0, "vllm:prompt_tokens_total": 100.0,
              "vllm:time_to_first_token_seconds_sum": 1.0, "vllm:time_to_first_token_seconds_count": 10.0}
    after = {"vllm:request_success_total": 30.0, "vllm:prompt_tokens_total": 900.0,
             "vllm:generation_tokens_total": 5000.0, "vllm:time_to_first_token_seconds_sum": 3.0,
             "vllm:time_to_first_token_seconds_count": 30.0, "cache_config.num_gpu_blocks": 100.0,
             "cache_config.block_size": 16.0}
    server = server_delta(before, after)
    assert server is not None
    s["server"] = server.to_dict()
    s["telemetry"] = MetricsSampler(None, 1.0).window_summary(0, 10).to_dict()  # type: ignore[arg-type]
    s["gpu"] = _gpu()
    return s


@pytest.mark.parametrize("make", [_summary, lambda: _summary(failed=20), _full])
def test_round_trip_is_exact(make: Any) -> None:
    d = make()
    cs = CellResult.from_dict(d)
    assert cs.to_dict() == d
    assert json.dumps(cs.to_dict(), default=str) == json.dumps(d, default=str)  # key order too
    assert CellResult.from_json(json.dumps(d, default=str)) == cs


def test_windows_cover_every_key_written() -> None:
    d = _full()
    assert set(ServerWindow.__struct_fields__) == set(d["server"])
    assert set(TelemetryWindow.__struct_fields__) == set(d["telemetry"])
    assert set(GpuWindow.__struct_fields__) == set(d["gpu"])


def test_typed_fields() -> None:
    cs = CellResult.from_dict(_full())
    assert cs.requests_failed == 2 and cs.requests == 20
    assert cs.errors[0].status == "error" and cs.errors[0].len == 2
    assert cs.input_tokens_mismatch is not None and cs.input_tokens_mismatch.max_abs == 3
    assert cs.server is not None and cs.server.kv_cache_tokens == 1600.0
    assert cs.gpu is not None and cs.gpu.per_gpu[0].name == "NVIDIA H200"
    assert cs.telemetry is not None and cs.telemetry.available is False
    assert cs.ttft_ms.p50 == cs.value("ttft_ms.p50")
    assert cs.value("output_tok_s") == cs.output_tok_s
    assert cs.value("server.ttft_ms_mean") == pytest.approx(100.0)
    assert cs.value("nope") is None and cs.value("ttft_ms.p42") is None and cs.value("errors") is None


def test_older_or_partial_summaries_read_with_defaults() -> None:
    cs = CellResult.from_dict({"requests_ok": 5, "output_tok_s": 12.5, "ttft_ms": {"mean": 3.0}})
    assert cs.requests_ok == 5 and cs.requests_failed == 0
    assert cs.ttft_ms == Dist(mean=3.0) and cs.ttfo_ms == Dist() and cs.server is None
    d = cs.to_dict()
    assert set(DIST_KEYS) <= set(d) and "server" not in d and "telemetry" not in d and "gpu" not in d


@pytest.mark.parametrize("junk", [
    None, 3, "text", [1, 2],
    {"requests_ok": "many", "wall_s": "1s", "ttft_ms": [1, 2], "errors": 7, "server": "yes", "gpu": 1},
    {"requests_ok": True, "output_tok_s": True, "ttft_ms": {"p50": "fast", "mean": None}, "unknown": {"x": 1}},
    {"errors": [1, {"status": 5, "len": "x"}], "input_tokens_mismatch": {"max_abs": 1.5},
     "gpu": {"names": "gpu0", "per_gpu": [3, {"index": "a", "name": 7}]}, "telemetry": {"samples": 2.0}},
])
def test_junk_never_raises(junk: Any) -> None:
    cs = CellResult.from_dict(junk)
    d = cs.to_dict()
    json.dumps(d)
    assert cs.requests_ok == 0 and cs.output_tok_s is None
    if isinstance(junk, dict) and "errors" in junk and isinstance(junk["errors"], list):
        assert [e.len for e in cs.errors] == [0]
        assert cs.gpu is not None and cs.gpu.names == [] and cs.gpu.per_gpu[0].index is None
        assert cs.telemetry is not None and cs.telemetry.samples == 2
        assert cs.input_tokens_mismatch is not None and cs.input_tokens_mismatch.max_abs is None


def test_non_finite_values_are_none_through_value() -> None:
    cs = CellResult.from_dict({"output_tok_s": math.inf, "ttft_ms": {"p50": math.nan}})
    assert cs.value("output_tok_s") is None and cs.ttft_ms.stat("p50") is None


@pytest.mark.parametrize("text", [None, "", "{}", "not json", "[1, 2]", "null"])
def test_from_json_without_a_summary(text: str | None) -> None:
    assert CellResult.from_json(text) is None


def test_metrics_table_drives_labels_directions_formulas() -> None:
    assert metric_label("ttft_ms.p50") == "TTFT p50 ms"
    assert metric_label("per_user_tok_s.mean") == "per-user tok/s (mean)"
    assert metric_label("output_tok_s") == "output tok/s (aggregate)"
    assert metric_better("itl_ms.p99") == "lower" and metric_better("goodput_req_s") == "higher"
    assert metric_better("input_tokens_mean") is None
    assert {k for k in SLO_KEYS if lower_bound(k)} == {"per_user_tok_s"}
    assert {k: m.formula for k, m in METRICS.items() if m.formula} == FORMULAS
    assert set(DIST_KEYS) <= set(FORMULAS)


def test_a_figure_is_spelled_once() -> None:
    """Every figure the declaration names reads under one key everywhere: the column cells.parquet and the CSV hold
    (summary_columns), what compare, gate and the app read (CellResult.value), and its label and direction."""
    cs = CellResult.from_dict(_full())
    columns = summary_columns(cs.to_dict())
    keys = [k for k, m in METRICS.items() if not m.stats] + [f"{k}.{st}" for k, m in METRICS.items() for st in m.stats]
    for key in keys:
        f = figure(key)
        assert f.key == key and f.label == metric_label(key) and f.better == (metric_better(key) or "neutral")
        if key in columns and isinstance(columns[key], (int, float)) and math.isfinite(float(columns[key])):
            assert f.value(cs) == pytest.approx(columns[key]), key
    assert {"ttft_ms.p50", "itl_ms.p99", "server.preemptions", "input_tokens_mismatch.max_abs", "gpu.energy_wh"} <= set(columns)
    assert not any("_p50" in k for k in columns)  # never `ttft_ms_p50`: one spelling
    assert figure("ttft_ms.p50").label == "TTFT p50 ms" and figure("cost.usd_per_1m_output_tokens").better == "lower"


@pytest.mark.parametrize(("key", "why"), [("nope", "unknown figure 'nope'"), ("ttft_ms.p42", "ttft_ms needs one of"),
                                          ("output_tok_s.p50", "output_tok_s has no statistic")])
def test_a_figure_that_is_not_declared_says_why(key: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        figure(key)


def _part_fields() -> set[str]:
    """The field names of the parts a summary nests (`server.ttft_ms_mean` is the server's own figure: its name is
    the part's field)."""
    hints = typing.get_type_hints(CellResult)
    out: set[str] = set()
    for part in PARTS:
        for arg in typing.get_args(hints[part]) or (hints[part],):
            out |= set(getattr(arg, "__struct_fields__", ()))
    return out


def test_no_figure_is_spelled_another_way_in_the_package() -> None:
    """A grep of the package's string literals for the figures of METRICS: none spelled the old flat way
    (`ttft_ms_p50`, outside a part's own field names), and every dotted one (`ttft_ms.p50`) a figure `figure()`
    accepts, so a typo or a second spelling in a report, the app, the CLI or a JSON writer fails here."""
    dist = [k for k, m in METRICS.items() if m.stats]
    flat = re.compile(rf"^({'|'.join(dist)})_({'|'.join(STATS)})$")
    dotted = re.compile(rf"^({'|'.join(dist)})\.\w+$")
    allowed = _part_fields()
    root = Path(__file__).resolve().parents[2] / "servescope"
    found: list[str] = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            s, where = node.value, f"{p.relative_to(root)}:{node.lineno}"
            if flat.match(s) and s not in allowed:
                found.append(f"{where}: {s!r} (write {figure_key(s)!r})")
            elif dotted.match(s):
                try:
                    figure(s)
                except ValueError as e:
                    found.append(f"{where}: {s!r}: {e}")
    assert not found, found


def figure_key(flat: str) -> str:
    head, _, stat = flat.rpartition("_")
    return f"{head}.{stat}"
