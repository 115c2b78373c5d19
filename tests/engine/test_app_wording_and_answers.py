"""What the app and the report tell a user: engine messages shown in the app name the app's fields (not CLI
flags), and the answers (capacity, knee, peak) use completed cells only and say which cells they left out."""

from __future__ import annotations

from servescope.core.results import CellResult
from servescope.sessions.answers import capacity, derive, knee, peak
from servescope.sessions.views import CellView, LoadPlan


def test_engine_messages_in_the_app_name_its_fields_not_cli_flags() -> None:
    from servescope.tui.wire import app_wording

    text = "cannot connect to http://h:1 (refused); is the server running? check --url"
    assert app_wording(text) == "cannot connect to http://h:1 (refused); is the server running? check the URL field"
    assert app_wording("unknown model x; give --model one of: a, b").endswith("give the model field one of: a, b")
    assert app_wording("--no-ignore-eos stays") == "--no-ignore-eos stays"  # no field for it: left as it is
    assert app_wording("a--url b") == "a--url b"


def _view(conc: int, status: str, out: float, per_user: float, slo: float | None = 1.0, reason: str = "") -> CellView:
    s = CellResult.from_dict({"requests_ok": 10, "requests_failed": 0, "output_tok_s": out, "slo_met_fraction": slo,
                               "per_user_tok_s": {"mean": per_user}})
    return CellView(conc, "w", f"c={conc}", LoadPlan(conc, None), status, reason, s)


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
