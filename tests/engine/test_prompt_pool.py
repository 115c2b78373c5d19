"""A cell's prompts are bounded by its load, never by `--requests` or `--warmup` (issue 32: `-c 4 -n 100000000
--duration 1s` built 10**8 prompts first: 3.1 GB, 77 s, then HTTP 413 from /tokenize and a failed session), while
a cell with a small count keeps the very prompts it always had for its seed (sessions stay comparable)."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from typing import Any

import pytest

from servescope.core import load as load_mod
from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.load import WARM_POOL, Limits, Load, run_cell, warm_prompts
from servescope.core.records import RequestRecord
from servescope.core.workers import split_cell
from servescope.engine.plan import POOL_MAX, Cell, pool_cap, pool_size, prompts_to_build
from servescope.workloads.prompts import build_prompts
from servescope.workloads.spec import PRESETS, LengthDist, Workload
from tests.workloads.test_prompts import FakeTok

W = PRESETS["random"]


def _cell(requests: int | None, duration_s: float | None = None, warmup: int = 0, c: int = 4) -> Cell:
    return Cell(0, W, Load(concurrency=c), requests, duration_s, warmup)


def test_a_small_count_keeps_one_prompt_per_request() -> None:
    for n in (1, 100, 1000, POOL_MAX):
        assert pool_size(_cell(n)) == n and pool_size(_cell(n, 1.0)) == n
        assert prompts_to_build(_cell(n, warmup=5)) == n + 5
    assert pool_size(_cell(None, 1.0)) == 64  # a duration-only cell: as before
    assert pool_size(_cell(None, 1.0, c=100)) == 1024


def test_a_huge_count_or_warmup_is_bounded_by_the_load() -> None:
    assert pool_size(_cell(100_000_000, 1.0)) == 64  # with a duration: the duration-only cell's pool
    assert pool_size(_cell(100_000_000)) == POOL_MAX  # a count alone: POOL_MAX, cycled
    assert pool_cap(_cell(None, c=8000)) == 32000 and pool_size(_cell(100_000_000, c=8000)) == 32000
    assert warm_prompts(100_000_000) == WARM_POOL == 1024 and warm_prompts(7) == 7
    assert prompts_to_build(_cell(100_000_000, 1.0, warmup=100_000_000)) == WARM_POOL + 64


def _digest(prompts: list[Any]) -> str:
    return hashlib.sha256("\x00".join(f"{p.text}|{p.input_tokens}|{p.output_tokens}"
                                      for p in prompts).encode()).hexdigest()[:16]


async def test_prompts_for_a_seed_are_the_ones_they_always_were() -> None:
    """Digests of what the builder made before prompts were bounded (commit 0694e81), for counts a session uses."""
    cases = [(Workload("t", "completions", LengthDist("uniform", min=20, max=400), LengthDist("fixed", value=9),
                       seed=3), 50, "b482bafbcf0778d1"),
             (Workload("c", "chat", LengthDist("fixed", value=128), LengthDist("fixed", value=4), seed=1), 200,
              "60884eed91003936"),
             (PRESETS["chat-multiturn"], 40, "04010487dde913d3")]
    for w, n, want in cases:
        assert _digest(await build_prompts(w, n, "cell3", FakeTok())) == want, w.name


async def test_a_warmup_longer_than_its_prompts_cycles_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_mod, "WARM_POOL", 3)
    sent: list[tuple[str, bool]] = []

    async def fake_stream(http: Any, opts: Any, spec: RequestSpec, rec: RequestRecord, reply: Any = None,
                          **_: Any) -> None:
        sent.append((spec.prompt, rec.warmup))
        await asyncio.sleep(0)
        rec.status, rec.end_ns = "ok", load_mod._perf()

    monkeypatch.setattr(load_mod, "stream_request", fake_stream)
    specs = [RequestSpec("completions", f"w{i}", 4, 2) for i in range(3)] + \
            [RequestSpec("completions", f"m{i}", 4, 2) for i in range(5)]
    run = await run_cell(ClientOptions(base_url="http://127.0.0.1:9", model="m"), specs, Load(concurrency=2),
                         Limits(requests=7, warmup=10))
    warm = [p for p, w in sent if w]
    assert len(warm) == 10 and set(warm) == {"w0", "w1", "w2"}  # 10 warmup requests over its 3 prompts
    assert [r.index for r in run.records] == list(range(7))
    assert sorted(p for p, w in sent if not w) == sorted(f"m{i % 5}" for i in range(7))  # the measured pool, cycled


def test_workers_get_one_pass_of_the_pool_however_many_requests() -> None:
    specs = [RequestSpec("completions", f"p{i}", 10, 5) for i in range(30)]
    for load in (Load(concurrency=4), Load(rate=1000.0)):
        limits = Limits(requests=100_000_000, duration_s=0.5)
        shares = split_cell(specs, load, limits, 2, seed=1)
        assert len(shares) == 2
        for s in shares:
            assert len(s.specs) <= len(specs)
            measured = s.specs[s.limits.warmup:]
            for i in (0, 1, 29, 31, 10_007):  # request i of the share sends the cell's request's own prompt
                g = s.index_base + i * s.index_stride
                assert measured[i % len(measured)].prompt == f"p{g % 30}"


def test_workers_split_a_long_warmup_and_cycle_its_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_mod, "WARM_POOL", 4)
    specs = [RequestSpec("completions", f"w{i}", 10, 5) for i in range(4)] + \
            [RequestSpec("completions", f"p{i}", 10, 5) for i in range(10)]
    shares = split_cell(specs, Load(concurrency=4), Limits(requests=20, warmup=1000), 2)
    assert [s.limits.warmup for s in shares] == [500, 500]
    assert [[p.prompt for p in s.specs[:warm_prompts(s.limits.warmup)]] for s in shares] == \
        [["w0", "w2", "w0", "w2"], ["w1", "w3", "w1", "w3"]]
    assert all(s.specs[warm_prompts(s.limits.warmup)].prompt.startswith("p") for s in shares)


def test_a_cell_row_keeps_the_warmup_asked_for() -> None:
    cell = replace(_cell(10), warmup=100_000_000)
    assert cell.row()["warmup"] == 100_000_000
