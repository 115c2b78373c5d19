"""The event log's items (servescope.engine.wire): written by the runner's bus, read back by every viewer into the
same typed items; the event logs of sessions written by servescope 0.1.0 (tests/sessions/old/v2) replay whole,
and each line keeps the JSON shape those logs have."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servescope.core.results import CellResult, Dist, ServerWindow
from servescope.engine import wire as w
from servescope.sessions.live import EVENTS, EventLogReader, EventLogWriter

OLD = Path(__file__).parents[1] / "sessions" / "old" / "v2"
CELL = w.CellInfo(1, "sharegpt", "c=4", 4, None, 60, None, "in 200-512 (uniform) / out 256 (chat)", "--max-num-seqs 8")


def items(tmp: Path) -> list[w.Item]:
    summary = CellResult(requests_ok=3, ttft_ms=Dist(mean=12.5, p50=11.0, n=3), server=ServerWindow(preemptions=0.0))
    return [
        w.SweepStarted(tmp / "s", [CELL], "sim://tiny", "tiny", "0.32.0-sim", "server /tokenize", True,
                       engine_pid=4242, engine="vLLM 0.32.0-sim"),
        w.TelemetryMeta({"kv_cache_tokens": 12752, "source": "metrics", "max_concurrency_by_workload": {"sharegpt": 16.6}},
                        {"available": False, "reason": "NVML is not available"}),
        w.CellStarted(CELL, 2),
        w.RequestsMeasured(CELL, [10.0, 12.5], [2.0], [100.0, 120.0], [50.0], 64, 2, 1, 1.5,
                           [("error", "HTTP 500: overload")], [1, 2], [[0, 100], [None, 120]]),
        w.TelemetryUpdated({"kv_cache_usage": 0.5, "running": 4.0}, [{"gpu": 0, "mem_used_gib": 61.2, "util_pct": 97.0}]),
        w.CellFinished(CELL, summary, "done"),
        w.CellSkipped(CELL, "skipped by the user"),
        w.EngineNotice("warning", "input tokens differ"),
        w.SweepFinished(tmp / "s", "completed", "all cells done"),
    ]


def write_and_read(tmp: Path, written: list[w.Item]) -> list[tuple[str, dict[str, object]]]:
    log = EventLogWriter(tmp)
    for it in written:
        log.write(it.kind, it.fields())
    log.close()
    return EventLogReader(tmp).poll()


def test_items_read_back_as_they_were_written(tmp_path: Path) -> None:
    written = items(tmp_path)
    got = [w.decode_item(k, f) for k, f in write_and_read(tmp_path, written)]
    started = got[0]
    assert isinstance(started, w.SweepStarted) and started.started_at is not None  # the line's time
    assert got == [w.SweepStarted(**{**_fields(written[0]), "started_at": started.started_at}), *written[1:]]
    assert isinstance(got[3], w.RequestsMeasured) and got[3].errors == [("error", "HTTP 500: overload")]
    assert isinstance(got[-1], w.SweepFinished) and got[-1].session_dir == tmp_path / "s"


def _fields(item: w.ItemBase) -> dict[str, object]:
    return {f: getattr(item, f) for f in item.__struct_fields__}


def test_each_line_keeps_the_shape_of_the_old_logs(tmp_path: Path) -> None:
    write_and_read(tmp_path, items(tmp_path))
    lines = [json.loads(ln) for ln in (tmp_path / EVENTS).read_text().splitlines()]
    assert all(set(ln) == {"seq", "t", "kind", "fields"} for ln in lines)
    old: dict[str, set[str]] = {}
    for d in sorted(OLD.iterdir()):
        for raw in (d / EVENTS).read_text().splitlines():
            ln = json.loads(raw)
            old.setdefault(ln["kind"], set(ln["fields"]))
    new = {ln["kind"]: ln["fields"] for ln in lines}
    assert set(old) >= {"SweepStarted", "TelemetryMeta", "CellStarted", "RequestsMeasured", "TelemetryUpdated",
                        "CellFinished", "EngineNotice", "SweepFinished"}
    for kind, keys in old.items():
        assert set(new[kind]) == keys, kind
    assert new["SweepStarted"]["session_dir"] == str(tmp_path / "s")
    # the summary as cells.parquet's summary_json holds it: the parts not measured are left out
    assert new["CellFinished"]["summary"] == items(tmp_path)[5].summary.to_dict()  # type: ignore[union-attr]
    assert "telemetry" not in new["CellFinished"]["summary"]  # type: ignore[operator]


@pytest.mark.parametrize("session", sorted(p.name for p in OLD.iterdir()))
def test_an_old_sessions_event_log_replays_whole(session: str) -> None:
    got = EventLogReader(OLD / session).poll()
    assert got
    decoded = [w.decode_item(k, f) for k, f in got]
    assert all(d is not None for d in decoded), [k for (k, _), d in zip(got, decoded, strict=True) if d is None]
    done = [d for d in decoded if isinstance(d, w.CellFinished)]
    assert done and all(d.summary.requests_ok > 0 for d in done)
    measured = [d for d in decoded if isinstance(d, w.RequestsMeasured)]
    assert measured and all(len(d.turns) == len(d.cached) == len(d.ttft_ms) for d in measured)
    meta = [d for d in decoded if isinstance(d, w.TelemetryMeta)]
    assert meta and all(isinstance(d.kv_budget, dict) and d.kv_budget.get("kv_cache_tokens") for d in meta)


def test_a_nan_reading_is_written_as_null_and_an_unknown_or_damaged_item_is_skipped(tmp_path: Path) -> None:
    got = write_and_read(tmp_path, [w.TelemetryUpdated(None, [{"gpu": 1, "power_w": math.nan}])])
    item = w.decode_item(*got[0])
    assert isinstance(item, w.TelemetryUpdated) and item.gpus == [{"gpu": 1, "power_w": None}]
    assert isinstance(item.gpus[0]["gpu"], int)  # the GPU's index stays an int ("GPU1", not "GPU1.0")
    assert w.decode_item("SomethingNewer", {"x": 1}) is None
    assert w.decode_item("CellStarted", {"cell": {"index": "one"}, "total": 2}) is None
