"""Why requests waited in the server's queue, named from the cell's /metrics telemetry (issue 44, item 13): the KV
cache, the batch slots or prefill, or unknown with what is missing. Each branch is a cell whose telemetry window
shows it, written and read back through the real session store and report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servescope.reports.report import build
from servescope.sessions.store import load_session
from tests.sessions.conftest import CellSpec, SessionSpec, build_session

QUEUED = {"queue_ms_mean": 900.0}  # well over half of the cell's TTFT (~100-560 ms): the note is due


def window(kv: float, running: tuple[float, float], waiting: tuple[float, float], preemptions: float = 0.0,
           samples: int = 20) -> dict[str, Any]:
    """A telemetry window as core/telemetry.py writes it: KV peak, running (mean, max), waiting (mean, max)."""
    return {"available": True, "samples": samples, "kv_cache_usage_peak": kv, "kv_cache_usage_mean": kv / 2,
            "running_mean": running[0], "running_max": running[1], "waiting_mean": waiting[0],
            "waiting_max": waiting[1], "preemptions": preemptions}


def note(tmp_path: Path, cell: CellSpec) -> str:
    s = load_session(build_session(tmp_path, SessionSpec("q", [cell])))
    (line,) = [n for n in build(s).notes if "in the server's queue" in n]
    return line


def test_a_full_kv_cache(tmp_path: Path) -> None:
    line = note(tmp_path, CellSpec("sharegpt", 16, server=QUEUED,
                                   telemetry=window(0.97, (12.0, 16.0), (3.0, 9.0), preemptions=12.0)))
    assert line.endswith("the KV cache was full (peak 97%, 12 requests preempted): requests waited for room in it")


def test_preemptions_alone_name_the_kv_cache(tmp_path: Path) -> None:
    line = note(tmp_path, CellSpec("sharegpt", 16, server={**QUEUED, "preemptions": 5.0}))
    assert "the KV cache was full (5 requests preempted)" in line


def test_batch_slots_closed_loop(tmp_path: Path) -> None:
    """16 users, at most 8 running while 8 waited, the KV cache a third used: the server's cap on running
    requests, not its memory."""
    line = note(tmp_path, CellSpec("sharegpt", 16, server=QUEUED, telemetry=window(0.31, (7.8, 8.0), (7.0, 8.0))))
    assert ("the server's batch slots were full: at most 8 requests ran at once while up to 8 waited, KV cache peak "
            "31% (its cap on running requests: vLLM's --max-num-seqs)") in line


def test_prefill_bound_as_the_issue_saw_it(tmp_path: Path) -> None:
    """KV near 12%, running climbing 1 to 16 while waiting drained: the server admitted requests as fast as it
    prefilled their prompts (the old note said `saturated (KV cache or batch slots)`)."""
    line = note(tmp_path, CellSpec("sharegpt", 16, server=QUEUED, telemetry=window(0.12, (9.5, 16.0), (5.0, 15.0))))
    assert "prefill-bound: running requests climbed to 16 while up to 15 waited, KV cache peak 12%" in line
    assert "KV cache or batch slots" not in line


@pytest.mark.parametrize(("telemetry", "why"), [
    (None, "no /metrics samples of running and waiting requests in this cell (KV cache use not reported)"),
    ({"available": False, "reason": "no /metrics"}, "no /metrics samples of running and waiting requests"),
    (window(0.2, (8.0, 16.0), (0.0, 0.0)), "no /metrics sample caught a request waiting (running up to 16, KV "
                                           "cache peak 20%; sample more often with --telemetry-interval)"),
])
def test_unknown_says_what_is_missing(tmp_path: Path, telemetry: dict[str, Any] | None, why: str) -> None:
    line = note(tmp_path, CellSpec("sharegpt", 16, server=QUEUED, telemetry=telemetry))
    assert "the cause is unknown: " + why in line


@pytest.mark.parametrize(("running", "cause"), [((7.6, 8.0), "the server's batch slots were full: at most 8"),
                                                 ((4.0, 8.0), "prefill-bound: running requests climbed to 8")])
def test_an_open_loop_cell_held_at_its_peak_is_slots_else_prefill(tmp_path: Path, running: tuple[float, float],
                                                                   cause: str) -> None:
    """An open loop has no number of users to compare with: running held at its peak while requests waited is a
    cap; running that climbed to its peak is prefill."""
    import dataclasses

    from servescope.reports.report import queue_cause
    from servescope.sessions.views import LoadPlan

    s = load_session(build_session(tmp_path, SessionSpec("q", [
        CellSpec("sharegpt", 4, server=QUEUED, telemetry=window(0.3, running, (2.0, 6.0)))])))
    (v,) = build(s).views
    assert queue_cause(dataclasses.replace(v, plan=LoadPlan(None, 5.0, "poisson"))).startswith(cause)
