"""Through `run_sweep` against the simulator: a count above the prompt pool's cap cycles the pool and says so in
one warning (a repeat may be served from the prefix cache), and builds no more prompts than the pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.engine import plan
from servescope.engine.events import CellFinished, Notice, SweepFinished
from servescope.engine.runner import run_sweep
from servescope.engine.spec import RunContext, SweepSpec
from servescope.sim.launcher import start_sim
from servescope.workloads import prompts as prompts_mod
from servescope.workloads.spec import Workload, fixed

# the --fast lane leaves this module out: 1 tests, ~3 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

WL = Workload("tiny", "completions", fixed(32), fixed(3), source="inline")


async def test_a_count_above_the_cap_cycles_the_pool_and_says_so(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "POOL_MAX", 4)
    built: list[int] = []
    real = prompts_mod.build_prompts

    async def counting(w: Workload, n: int, *a: object, **kw: object) -> list[prompts_mod.Prompt]:
        built.append(n)
        return await real(w, n, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("servescope.engine.runner.build_prompts", counting)
    h = start_sim("tiny")
    try:
        spec = SweepSpec(url="sim://tiny", workloads=(WL,), concurrency=(1,), requests=10, warmup=0,
                         telemetry_interval_s=None)
        ctx = RunContext(url=h.url, target_label="sim://tiny", save_dir=tmp_path / "s")
        events = [ev async for ev in run_sweep(spec, ctx)]
    finally:
        h.stop()
    assert isinstance(events[-1], SweepFinished) and events[-1].status == "completed"
    [done] = [e for e in events if isinstance(e, CellFinished)]
    assert done.summary.requests_ok == 10
    assert built == [4]
    said = [e.text for e in events if isinstance(e, Notice) and e.level == "warning"]
    assert said == ["cell 1 (tiny c=1): 10 requests cycled 4 distinct prompts (at most 4 are built for a cell); a "
                    "repeat may be served from the server's prefix cache"]
