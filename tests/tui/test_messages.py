"""The app's sweep messages wrap the event log's items (servescope.engine.wire): one message per item, its fields
under the names the screens read, and only a message whose newer copy makes an older one obsolete merges in the
queue."""

from __future__ import annotations

from pathlib import Path

from servescope.core.results import CellResult
from servescope.engine import wire as w
from servescope.tui import messages as m

CELL = w.CellInfo(0, "sharegpt", "c=4", 4, None, 60, None, "in 200-512 (uniform) / out 256 (chat)")


def test_each_item_has_its_message_reading_its_fields() -> None:
    items: list[w.Item] = [
        w.SweepStarted(Path("/s"), [CELL], "sim://tiny", "tiny", None, "t", True, engine_pid=7),
        w.CellStarted(CELL, 1),
        w.RequestsMeasured(CELL, [1.0], [], [], [], 3, 1, 0, 0.5, turns=[1], cached=[[0, 10]]),
        w.CellFinished(CELL, CellResult(requests_ok=1), "done"),
        w.CellSkipped(CELL, "skipped"),
        w.EngineNotice("info", "hello"),
        w.SweepFinished(None, "failed", "no server"),
        w.TelemetryUpdated({"running": 1.0}, None),
        w.TelemetryMeta(None, {"available": False}),
    ]
    msgs = [m.message(it) for it in items]
    assert [type(x).__name__ for x in msgs] == [it.kind for it in items]
    assert all(x.item is it for x, it in zip(msgs, items, strict=True))
    started, _, measured, finished, *_ = msgs
    assert isinstance(started, m.SweepStarted) and started.engine_pid == 7 and started.cells == [CELL]
    assert isinstance(measured, m.RequestsMeasured) and measured.turns == [1] and measured.cached == [[0, 10]]
    assert isinstance(finished, m.CellFinished) and finished.summary.requests_ok == 1 and finished.cell.label == "sharegpt c=4"


def test_turns_that_do_not_run_parallel_to_the_ttfts_are_left_out() -> None:
    msg = m.RequestsMeasured(w.RequestsMeasured(CELL, [1.0, 2.0], [], [], [], 3, 2, 0, 0.5, turns=[1], cached=[[0, 1]]))
    assert msg.turns == [] and msg.cached == []


def test_only_the_kv_budget_replaces_an_older_one_still_queued() -> None:
    meta = m.TelemetryMeta(w.TelemetryMeta({"kv_cache_tokens": 1}, None))
    assert meta.can_replace(m.TelemetryMeta(w.TelemetryMeta({"kv_cache_tokens": 2}, None)))
    tele = m.TelemetryUpdated(w.TelemetryUpdated({"preemptions_total": 1.0}, None))
    assert not tele.can_replace(m.TelemetryUpdated(w.TelemetryUpdated({"preemptions_total": 2.0}, None)))
    batch = m.RequestsMeasured(w.RequestsMeasured(CELL, [], [], [], [], 0, 0, 0, 0.0))
    assert not batch.can_replace(m.RequestsMeasured(w.RequestsMeasured(CELL, [], [], [], [], 0, 1, 0, 0.1)))
