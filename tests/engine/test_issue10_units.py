"""Small truths the app and the report must share (issue 10): one KV-cache figure from one source, a load level
given twice is refused in one line, engine messages in the app name the app's fields, and the answers say
which cells they left out."""

from __future__ import annotations

import pytest

from servescope.core.errors import ServescopeError
from servescope.core.kvbudget import kv_budget_from_parsed
from servescope.core.results import CellSummary
from servescope.core.telemetry import parse_metrics, server_delta
from servescope.engine.spec import SweepSpec, parse_field
from servescope.sessions.answers import capacity, derive, knee, peak
from servescope.sessions.views import CellView

METRICS = """# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="406666",kv_cache_size_tokens="6506660",cache_dtype="auto"}} 1.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{{model_name="m",finished_reason="length"}} {n}
"""


def test_the_kv_cache_size_is_the_same_figure_in_the_app_and_the_report() -> None:
    before, after = parse_metrics(METRICS.format(n=1)), parse_metrics(METRICS.format(n=5))
    budget = kv_budget_from_parsed(after)  # what session.toml's kv_budget and the app's panel show
    d = server_delta(before, after)  # what each cell's server part (the report) holds
    assert budget is not None and d is not None
    assert budget.tokens == 6_506_660
    assert d["kv_cache_tokens"] == budget.tokens  # not 406,666 x 16 = 6,506,656


@pytest.mark.parametrize(("key", "raw", "twice"), [("concurrency", "4,1,4", "4"), ("rates", "0.5,2,0.5", "0.5")])
def test_a_load_level_given_twice_is_refused_in_one_line(key: str, raw: str, twice: str) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_field(key, raw)
    msg = e.value.message
    assert "\n" not in msg and f"{twice} is given twice" in msg, msg
    with pytest.raises(ServescopeError):
        SweepSpec.from_table({"load": {key: [4, 1, 4] if key == "concurrency" else [0.5, 2, 0.5]}})


def test_engine_messages_in_the_app_name_its_fields_not_cli_flags() -> None:
    from servescope.tui.wire import app_wording

    text = "cannot connect to http://h:1 (refused); is the server running? check --url"
    assert app_wording(text) == "cannot connect to http://h:1 (refused); is the server running? check the URL field"
    assert app_wording("unknown model x; give --model one of: a, b").endswith("give the model field one of: a, b")
    assert app_wording("--no-ignore-eos stays") == "--no-ignore-eos stays"  # no field for it: left as it is
    assert app_wording("a--url b") == "a--url b"


def _view(conc: int, status: str, out: float, per_user: float, slo: float | None = 1.0, reason: str = "") -> CellView:
    s = CellSummary.from_dict({"requests_ok": 10, "requests_failed": 0, "output_tok_s": out, "slo_met_fraction": slo,
                               "per_user_tok_s": {"mean": per_user}})
    return CellView(conc, "w", f"c={conc}", conc, None, status, reason, s)


def test_answers_use_completed_cells_and_name_the_ones_left_out() -> None:
    views = [_view(1, "skipped", 0.0, 0.0, 0.0, "skipped by the user"), _view(4, "done", 400, 100),
             _view(8, "done", 600, 75), _view(16, "stopped", 900, 56, 0.0, "stopped by the user")]
    cap = capacity(views)
    assert cap.level == 8 and not cap.unknown  # the skipped c=1 (0% within the SLOs) is not judged
    assert "even the lowest load" not in cap.text()
    k = knee(views)
    assert k.concurrency == 8 and k.levels == 2
    assert peak(views) == (600, "c=8")  # the stopped c=16 measured a draining load
    [a] = derive("s", views)
    assert a.left_out == ["c=1 (skipped: skipped by the user)", "c=16 (stopped: stopped by the user)"]
    assert a.left_out_text().startswith("left out (not completed): c=1")
    only = derive("s", views[:2])[0]
    assert only.knee.text() == "needs at least two completed concurrency levels (one completed)"
    none = derive("s", [views[0]])[0]
    assert none.capacity.text() == "unknown (no completed cell)" and none.peak_output_tok_s is None
