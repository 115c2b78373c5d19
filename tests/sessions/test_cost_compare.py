"""Cost in compare and reports, on sessions written by the real writer (the store prices each cell from the
prices its session.toml records): a cost row only when some session has a price, the GPU's cost at its capacity
beside the API's at the same load (and why the API's cell there is left out, when it is), and a session whose
lengths were calibrated on its API's usage compares with a /tokenize one without being called not comparable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servescope.core.metrics import records_frame, summarize
from servescope.core.results import CellResult
from servescope.reports.compare_doc import comparison_markdown
from servescope.reports.report import render_report
from servescope.sessions.answers import Capacity, CostAtCapacity
from servescope.sessions.compare import COST_METRIC, compare_sessions
from servescope.sessions.store import load_session
from servescope.sessions.views import cell_views
from servescope.workloads.spec import PRESETS
from tests.sessions.conftest import CellSpec, _records
from tests.sessions.synth import plan, sweep_session

BOUND = {"verdict": "bound", "reasons": ["event-loop lag p99 80 ms (bound above 50 ms)"], "workers": 1}
SLOS = {"ttft_ms": 600.0}


def _session(base: Path, name: str, prices: dict[str, float], cells: list[CellSpec], *,
             tokenizer: str = "server /tokenize") -> Any:
    path = base / f"20261201-120000-{name}"
    planned = plan([(PRESETS[c.workload], c.concurrency, c.requests) for c in cells])
    w, ran = sweep_session(path, name, planned, model=f"model-{name}", max_model_len=32768, tokenizer=tokenizer,
                           slos=SLOS)
    w.meta.update(prices)  # as engine/sessionmeta.py records --price / --gpu-hour
    for cell, c in zip(planned, cells, strict=True):
        recs, wall = _records(c)
        df = records_frame(recs)
        summary = summarize(df, wall, SLOS).to_dict()
        if c.client is not None:
            summary["client"] = c.client
        w.write_cell({**cell.row(), **ran, "status": "done", "reason": ""}, df, CellResult.from_dict(summary))
    w.finish("completed")
    return load_session(path)


def _cells(**kw: Any) -> list[CellSpec]:
    # TTFT 100 ms at c=1, +100% per extra user (c=4: 400 ms, c=16: 1,600 ms): capacity at TTFT <= 600 ms is c=4
    return [CellSpec("sharegpt", c, ttft_growth=1.0, **kw) for c in (1, 4, 16)]


GPU = {"gpu_usd_per_hour": 3.6}
API = {"price_usd_per_1m_input_tokens": 2.5, "price_usd_per_1m_output_tokens": 10.0}


def test_gpu_against_api_at_the_gpus_capacity(tmp_path: Path) -> None:
    gpu = _session(tmp_path, "gpu", GPU, _cells())
    api = _session(tmp_path, "api", API, _cells(), tokenizer="calibrated on the server's usage (no /tokenize)")
    comp = compare_sessions([gpu, api])
    assert COST_METRIC in comp.metrics
    assert not comp.mismatches  # the calibrated session's tokenizer is not a mismatch; its lengths agree
    c4 = next(c for c in comp.cells if c.load == "c=4")
    g4 = next(v for v in cell_views(gpu) if v.concurrency == 4).summary
    want_gpu = 3.6 / 3600 / g4.output_tok_s * 1e6  # the GPU's hour over its throughput at c=4
    want_api = 10.0 + 2.5 * 300 / 256  # 300 input and 256 output tokens a request
    assert c4.values[COST_METRIC.key] == [pytest.approx(want_gpu), pytest.approx(want_api)]
    (cost,) = comp.costs
    assert (cost.workload, cost.gpu, cost.api, cost.capacity.level) == ("sharegpt", "gpu", "api", 4)
    assert cost.gpu_usd == pytest.approx(want_gpu) and cost.api_usd == pytest.approx(want_api)
    text = cost.text(comp.slos)
    assert text.startswith("at these SLOs (ttft_ms <= 600 for at least 90% of requests), 4 users cost $")
    assert f"on this GPU (gpu) vs ${want_api:,.2f} on the API (api), which meets them at this load" in text
    md = comparison_markdown(comp, level=2)
    assert "\n### Cost at capacity: GPU vs API\n" in md  # beside capacity, knee and peak
    assert "| cost $/1M out tok |" in md
    assert comp.to_dict()["cost_at_capacity"][0]["api_usd_per_1m_output_tokens"] == pytest.approx(want_api)


def test_the_apis_cell_left_out_is_named(tmp_path: Path) -> None:
    gpu = _session(tmp_path, "gpu", GPU, _cells())
    cells = _cells()
    cells[1].client = BOUND  # the API's c=4: its client was bound
    api = _session(tmp_path, "api", API, cells)
    (cost,) = compare_sessions([gpu, api]).costs
    assert not cost.api_same_load and cost.api_left_out == "client bound"
    assert "(the median of its cells: its cell at this load is left out: client bound)" in cost.text({})
    (cost,) = compare_sessions([gpu, api], include_bound=True).costs
    assert cost.api_same_load


def test_no_price_no_cost(tmp_path: Path) -> None:
    a = _session(tmp_path, "a", {}, _cells())
    b = _session(tmp_path, "b", {}, _cells())
    comp = compare_sessions([a, b])
    assert COST_METRIC not in comp.metrics and not comp.costs and "cost_at_capacity" not in comp.to_dict()
    assert all("cost" not in v.summary.to_dict() for v in cell_views(a))
    assert "Cost at capacity" not in comparison_markdown(comp, level=2) and "cost $/1M" not in render_report(a)
    # two API sessions (or two GPUs): a cost row, but no GPU-vs-API sentence
    comp = compare_sessions([_session(tmp_path, "x", API, _cells()), _session(tmp_path, "y", API, _cells())])
    assert COST_METRIC in comp.metrics and not comp.costs


def test_a_tokenizer_that_differs_is_still_a_mismatch(tmp_path: Path) -> None:
    a = _session(tmp_path, "a", {}, _cells())
    b = _session(tmp_path, "b", {}, _cells(), tokenizer="/models/other-tokenizer")
    assert any(x.startswith("tokenizer:") for x in compare_sessions([a, b]).mismatches)


def test_report_shows_the_cost_column_and_the_cost_at_capacity(tmp_path: Path) -> None:
    gpu = _session(tmp_path, "gpu", GPU, _cells())
    md = render_report(gpu)
    head = next(ln for ln in md.splitlines() if ln.startswith("| load | ok / failed |"))
    assert head.endswith("| cost $/1M out tok |")
    assert "- **Cost at capacity:** $" in md and "at c=4: gpu-hour $3.60 at " in md


def test_the_sentence_when_the_gpu_meets_no_load_and_for_open_loops() -> None:
    none = CostAtCapacity("chat", "g", "a", Capacity(None, "concurrency", False), api_usd=2.0)
    assert none.text({}) == ("at these SLOs (none): no load meets them on this GPU (g); the API (a) costs $2.00 per "
                             "1M output tokens")
    rate = CostAtCapacity("chat", "g", "a", Capacity(5.0, "req/s", False), gpu_usd=0.05, api_usd=2.0,
                          api_slo_met=0.5)
    assert rate.text({}) == ("at these SLOs (none), 5 req/s cost $0.05 per 1M output tokens on this GPU (g) vs $2.00 on "
                             "the API (a), which misses them at this load (50% of its requests within them)")
