"""Comparison and derived answers on fixed sessions and hand-made cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.core.results import CellResult, Dist
from servescope.reports.compare_doc import headline
from servescope.sessions.compare import (
    COMPARE_METRICS,
    CellView,
    LoadPlan,
    capacity,
    cell_views,
    compare_sessions,
    delta_pct,
    knee,
    winner,
)
from servescope.sessions.store import load_session

from .conftest import CellSpec, SessionSpec, build_session


def cv(c: int, agg: float, per_user: float, met: float | None = 1.0) -> CellView:
    return CellView(c, "w", f"c={c}", LoadPlan(c, None), "done", "",
                    CellResult(output_tok_s=agg, per_user_tok_s=Dist(mean=per_user), slo_met_fraction=met))


# ---- direction-aware winners, hand-made ---------------------------------------------------------------
@pytest.mark.parametrize(("values", "better", "expected"), [
    ([100.0, 90.0], "lower", 1),  # lower TTFT wins
    ([100.0, 90.0], "higher", 0),  # higher tok/s wins
    ([5.0, 7.0, 6.0], "lower", 0),
    ([5.0, 7.0, 6.0], "higher", 1),
    ([None, 7.0, 6.0], "higher", 1),  # a missing value never wins
    ([None, 7.0], "higher", None),  # one value: nothing to compare
    ([100.0, 100.05], "lower", None),  # within 0.1%: a tie
    ([100.0, 90.0], "neutral", None),  # token counts are not judged
    ([0.0, 0.0], "higher", None),
])
def test_winner(values: list[float | None], better: str, expected: int | None) -> None:
    assert winner(values, better) == expected


def test_delta_is_signed_and_relative_to_first() -> None:
    assert delta_pct(113.0, 100.0) == pytest.approx(13.0)
    assert delta_pct(87.0, 100.0) == pytest.approx(-13.0)
    assert delta_pct(5.0, 0.0) is None
    assert delta_pct(None, 1.0) is None


def test_metric_directions() -> None:
    d = {m.key: m.better for m in COMPARE_METRICS}
    assert d["output_tok_s"] == d["per_user_tok_s.mean"] == d["goodput_req_s"] == "higher"
    for k in ("ttft_ms.p50", "ttft_ms.p99", "ttfo_ms.p50", "tpot_ms.p50", "itl_ms.p99", "e2e_ms.p50"):
        assert d[k] == "lower"
    assert d["input_tokens_mean"] == d["output_tokens_mean"] == "neutral"


def test_winners_on_sessions_know_direction(tmp_path: Path) -> None:
    # A: faster first token, slower decode. B: the opposite. Each must win its own metrics.
    a = build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1, ttft_ms=50.0, tpot_ms=8.0)]))
    b = build_session(tmp_path, SessionSpec("b", [CellSpec("sharegpt", 1, ttft_ms=200.0, tpot_ms=5.0)]))
    comp = compare_sessions([load_session(a), load_session(b)])
    (cell,) = comp.cells
    assert comp.labels[cell.winners["ttft_ms.p50"]] == "a"
    assert comp.labels[cell.winners["tpot_ms.p50"]] == "b"
    assert comp.labels[cell.winners["output_tok_s"]] == "b"  # 256 tokens: decode dominates
    assert cell.winners["input_tokens_mean"] is None
    assert cell.deltas["ttft_ms.p50"][1] == pytest.approx(300.0, rel=0.01)
    assert cell.deltas["ttft_ms.p50"][0] is None


# ---- alignment, labels, cells in one session only -----------------------------------------------------
def test_alignment_labels_and_only_in(fixed_pair) -> None:
    a, b = fixed_pair
    comp = compare_sessions([a, b], label_key="quant")
    assert comp.labels == ["GPTQ-Int4", "FP8"]
    assert [(c.workload, c.load) for c in comp.cells] == [("sharegpt", "c=1"), ("sharegpt", "c=4")]
    only = {(w, ld): have for w, ld, have in comp.only_in}
    assert only[("sharegpt", "c=16")] == ["GPTQ-Int4"]
    assert only[("sharegpt-think", "c=1")] == ["GPTQ-Int4"]
    assert only[("longout", "c=1")] == ["FP8"]
    for c in comp.cells:
        assert comp.labels[c.winners["tpot_ms.p50"]] == "GPTQ-Int4"
        assert c.deltas["tpot_ms.p50"][1] > 0  # FP8 slower: positive TPOT delta
        assert c.deltas["output_tok_s"][1] < 0
    assert headline(comp)[0].startswith("FP8 vs GPTQ-Int4: output tok/s (aggregate) -")


def test_the_json_is_plain_json_and_names_each_figure_as_before(fixed_pair) -> None:
    """`compare --format json`: every value is JSON's own (a figure's declaration object once reached it, and only
    `default=str` hid it), and each compared figure keeps its key, label and direction."""
    import json

    doc = compare_sessions(list(fixed_pair), label_key="quant").to_dict()
    json.dumps(doc)  # no default: raises on anything that is not JSON
    first = doc["metrics"][0]  # type: ignore[index]
    assert first == {"key": "output_tok_s", "label": "output tok/s (aggregate)", "better": "higher", "unit": "tok/s"}


def test_label_falls_back_to_name(fixed_pair) -> None:
    a, b = fixed_pair
    comp = compare_sessions([a, b], label_key="nosuchtag")
    assert comp.labels == ["gptq", "fp8"]
    assert any("nosuchtag" in n for n in comp.notes)
    same = compare_sessions([a, a])
    assert same.labels == ["gptq", "gptq #2"]


def test_tabular_form(fixed_pair) -> None:
    a, b = fixed_pair
    comp = compare_sessions([a, b], label_key="quant")
    df = comp.to_frame()
    assert df.height == len(comp.cells) * len(comp.metrics)
    # every figure but the prefix-cache hit rate, which these sessions did not measure
    assert [m.key for m in comp.metrics] == [m.key for m in COMPARE_METRICS if m.key != "prefix_cache_hit_rate"]
    assert {"GPTQ-Int4", "FP8", "delta_pct FP8", "winner"} <= set(df.columns)
    tpot = df.filter(df["metric"] == "tpot_ms.p50")
    assert tpot["winner"].to_list() == ["GPTQ-Int4", "GPTQ-Int4"]
    curves = comp.curves("output_tok_s")
    assert [x for x, _ in curves["sharegpt"]["FP8"]] == [1.0, 4.0]
    d = comp.to_dict()
    assert d["cells"][0]["metrics"]["tpot_ms.p50"]["winner"] == "GPTQ-Int4"


def test_no_common_cells(tmp_path: Path) -> None:
    a = build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1)]))
    b = build_session(tmp_path, SessionSpec("b", [CellSpec("longout", 1, out_tokens=64)]))
    with pytest.raises(ServescopeError) as e:
        compare_sessions([load_session(a), load_session(b)])
    msg = str(e.value)
    assert "share no cell" in msg and "\n" not in msg and "a: sharegpt" in msg and "b: longout" in msg
    with pytest.raises(ServescopeError, match="at least two sessions"):
        compare_sessions([load_session(a)])


# ---- capacity, knee, peak, thinking cost ---------------------------------------------------------------
def test_knee_field_report_numbers() -> None:
    # seed 000: c=1 184/184, c=10 800/80, c=50 3373/67: aggregate keeps paying for what per-user loses
    k = knee([cv(1, 184, 184), cv(10, 800, 80), cv(50, 3373, 67)])
    assert k.concurrency == 50 and k.not_reached


def test_knee_in_the_middle() -> None:
    # c=2 -> 4: +39% aggregate for -31% per user: 1.39 x 0.69 < 1, the step costs more than it gains
    k = knee([cv(1, 100, 100), cv(2, 180, 90), cv(4, 250, 62), cv(8, 260, 33)])
    assert k.concurrency == 2 and not k.not_reached
    assert knee([cv(1, 100, 100)]).concurrency is None


def test_capacity() -> None:
    assert capacity([cv(1, 1, 1, 1.0), cv(4, 1, 1, 0.95), cv(16, 1, 1, 0.5)]).level == 4
    c = capacity([cv(1, 1, 1, 1.0), cv(4, 1, 1, 1.0)])
    assert c.level == 4 and c.not_reached
    none = capacity([cv(1, 1, 1, 0.2)])
    assert none.level is None and "even the lowest" in none.text()
    assert capacity([cv(1, 1, 1, None)]).unknown


def test_derived_answers_on_fixed_session(fixed_pair) -> None:
    a, b = fixed_pair
    comp = compare_sessions([a, b], label_key="quant")
    ans = {(x.session, x.workload): x for x in comp.answers}
    share = ans[("GPTQ-Int4", "sharegpt")]
    # c=16: TTFT 100 x (1 + 0.8 x 15) = 1.3 s > the 1 s SLO -> capacity c=4
    assert share.capacity.level == 4 and not share.capacity.not_reached
    aggs = {c.load: c.summary.output_tok_s for c in cell_views(a) if c.workload == "sharegpt"}
    assert share.peak_load == max(aggs, key=lambda k: aggs[k])
    assert share.peak_output_tok_s == max(aggs.values())
    (t,) = comp.thinking
    assert (t.thinking_on, t.thinking_off) == ("sharegpt-think", "sharegpt")
    assert t.loads == ["c=1", "c=4"]
    assert all(r is not None and r > 3.5 for r in t.e2e_ratio)  # 1024 vs 256 output tokens
    assert t.reasoning_tokens_on == 768
    assert t.visible_output_on == 256 and t.visible_output_off == 256


def test_slos_override_rejudges_from_requests(fixed_pair) -> None:
    a, b = fixed_pair
    strict = compare_sessions([a, b], slos={"ttft_ms": 50.0})
    assert strict.slos == {"ttft_ms": 50.0}
    for ans in strict.answers:
        if ans.workload == "sharegpt":
            assert ans.capacity.level is None  # nobody meets 50 ms TTFT
    for c in strict.cells:
        assert c.values["goodput_req_s"] == [0.0, 0.0]


def test_cells_join_on_the_planned_load_not_its_label(tmp_path: Path) -> None:
    """Two sessions' cells are the same cell when their workload and planned load agree, whatever label each
    stored for it (labels are for people and have changed wording between releases); the same label over a
    different planned load is not a match."""
    import tomllib

    import tomli_w

    cells = [CellSpec("sharegpt", 1), CellSpec("sharegpt", 4)]
    a = load_session(build_session(tmp_path, SessionSpec("a", cells)))
    b_path = build_session(tmp_path, SessionSpec("b", cells, tags={"run": "b"}))
    toml = b_path / "session.toml"
    meta = tomllib.loads(toml.read_text())
    for c in meta["cells"]:  # the plan is where a schema-4 session keeps each cell's load and its label
        c["load_label"] = f"{c['concurrency']} users"
    toml.write_text(tomli_w.dumps(meta))
    comp = compare_sessions([a, load_session(b_path)])
    assert [(c.workload, c.load, c.concurrency) for c in comp.cells] == [("sharegpt", "c=1", 1), ("sharegpt", "c=4", 4)]

    # b's second cell planned at c=8 but still labelled "c=4": not a's c=4 cell
    for c in meta["cells"]:
        c["load_label"] = f"c={c['concurrency']}"
        if c["concurrency"] == 4:
            c["concurrency"] = 8
    toml.write_text(tomli_w.dumps(meta))
    comp = compare_sessions([a, load_session(b_path)])
    assert [(c.load, c.concurrency) for c in comp.cells] == [("c=1", 1)]
