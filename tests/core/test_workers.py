"""Splitting one cell across worker processes (core.workers) and Ray actors (core.rayworkers), without a
server: the split keeps the single-process cell's users, requests, prompts and send times; the `auto` rule
keeps small loads in one process; parts merge; records survive pickling; clocks convert."""

from __future__ import annotations

import asyncio
import itertools
import pickle
import random
import sys
from array import array

import pytest

from servescope.core.arrivals import send_times
from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.health import ClientPart
from servescope.core.load import Limits, Load
from servescope.core.rayworkers import (
    RAY_INSTALL,
    clock_offset,
    node_keys,
    pick_nodes,
    run_cell_ray,
    shift_record,
)
from servescope.core.records import RequestRecord
from servescope.core.results import LoopLag
from servescope.core.workers import (
    auto_workers,
    merge_parts,
    open_schedule,
    resolve_workers,
    split_cell,
)

SPECS = [RequestSpec("completions", f"p{i}", 10 + i, 5) for i in range(30)]


def _indices(shares, n_per_share):  # type: ignore[no-untyped-def]
    """The cell indices each share's requests get, and the prompt each one sends."""
    out = []
    for s in shares:
        measured = s.specs[s.limits.warmup:]
        for i in range(n_per_share(s)):
            out.append((s.index_base + i * s.index_stride, measured[i % len(measured)].prompt))
    return out


@pytest.mark.parametrize("users,workers,requests", [(16, 2, 160), (5, 2, 100), (7, 3, 20), (3, 4, 50), (2, 2, 3)])
def test_closed_loop_splits_users_evenly_and_requests_in_proportion(users: int, workers: int, requests: int) -> None:
    shares = split_cell(SPECS, Load(concurrency=users), Limits(requests=requests), workers)
    n = min(workers, users)
    assert len(shares) == n
    per_user = [s.load.concurrency or 0 for s in shares]
    assert sum(per_user) == users and max(per_user) - min(per_user) <= 1
    reqs = [s.limits.requests or 0 for s in shares]
    assert sum(reqs) == requests
    for s in shares:  # in proportion to users, within one request
        assert abs(s.limits.requests - requests * s.load.concurrency / users) < 1  # type: ignore[operator]
    # the same requests as one process: indices 0..n-1 once each, request i sends prompt i (mod the list)
    got = sorted(_indices(shares, lambda s: s.limits.requests))
    assert got == [(i, SPECS[i % len(SPECS)].prompt) for i in range(requests)]
    # users keep the ids 0..c-1: worker k runs users k, k+n, ...
    ids = sorted(s.k + u * s.n for s in shares for u in range(s.load.concurrency))  # type: ignore[arg-type]
    assert ids == list(range(users))


def test_closed_loop_with_a_duration_only_interleaves_requests() -> None:
    shares = split_cell(SPECS[:7], Load(concurrency=4), Limits(requests=None, duration_s=5.0), 2)
    assert [s.limits.requests for s in shares] == [None, None]
    assert all(s.limits.duration_s == 5.0 for s in shares)
    # request i of worker k is request k + 2i of the cell, with that request's prompt, however long it runs
    for s in shares:
        for i in range(40):
            g = s.index_base + i * s.index_stride
            assert g % 2 == s.k and s.specs[i % len(s.specs)].prompt == SPECS[g % 7].prompt


def test_warmup_is_split_and_each_share_starts_with_its_part() -> None:
    shares = split_cell(SPECS, Load(concurrency=4), Limits(requests=20, warmup=5), 2)
    assert [s.limits.warmup for s in shares] == [3, 2]
    assert [p.prompt for s in shares for p in s.specs[: s.limits.warmup]] == ["p0", "p2", "p4", "p1", "p3"]
    assert sorted(_indices(shares, lambda s: s.limits.requests)) == [(i, f"p{5 + i}") for i in range(20)]


@pytest.mark.parametrize("load", [Load(rate=20.0, arrival="poisson"), Load(rate=7.0, arrival="gamma", burstiness=0.5),
                                  Load(rate=10.0, arrival="constant", ramp_s=2.0)], ids=["poisson", "gamma", "ramp"])
def test_open_loop_workers_send_the_single_process_schedule(load: Load) -> None:
    limits = Limits(requests=101)
    one = list(itertools.islice(send_times(load.arrival, float(load.rate or 0), load.burstiness, load.shape,
                                           random.Random("servescope-arrivals:7")), 101))
    assert open_schedule(load, limits, 7) == one
    shares = split_cell(SPECS, load, limits, 3, seed=7)
    assert len(shares) == 3
    sent = sorted((s.index_base + i * s.index_stride, t, s.specs[i % len(s.specs)].prompt)  # the worker cycles them
                  for s in shares for i, t in enumerate(s.load.times))
    assert [(i, t) for i, t, _ in sent] == list(enumerate(one))  # every send time once, at its index
    assert [p for *_, p in sent] == [SPECS[i % len(SPECS)].prompt for i in range(101)]
    for s in shares:
        assert s.load.arrival == "trace" and s.load.rate == load.rate and s.load.ramp_s == load.ramp_s
        assert s.limits.requests == len(s.load.times)


def test_open_loop_duration_cuts_the_schedule_like_one_process() -> None:
    load = Load(rate=50.0, arrival="constant")
    times = open_schedule(load, Limits(requests=None, duration_s=2.0), 0)
    assert times is not None and len(times) == 100 and times[-1] < 2.0
    assert open_schedule(load, Limits(requests=None, duration_s=None), 0) is None  # nothing bounds it: one process


def test_open_loop_cap_is_split_and_bounds_the_workers() -> None:
    shares = split_cell(SPECS, Load(rate=20.0, max_concurrency=5), Limits(requests=50), 2)
    assert [s.load.max_concurrency for s in shares] == [3, 2]
    assert len(split_cell(SPECS, Load(rate=20.0, max_concurrency=2), Limits(requests=50), 4)) == 2


def test_a_trace_is_dealt_out_in_order() -> None:
    load = Load(rate=2.0, arrival="trace", times=(0.0, 0.1, 0.5, 0.7, 2.0))
    shares = split_cell(SPECS, load, Limits(requests=4), 2)
    assert [s.load.times for s in shares] == [(0.0, 0.5), (0.1, 0.7)]


@pytest.mark.parametrize("load,limits", [
    (Load(concurrency=1), Limits(requests=10)),  # one user
    (Load(concurrency=8), Limits(requests=1)),  # one request
    (Load(rate=5.0), Limits(requests=1)),
])
def test_what_cannot_be_split_runs_whole(load: Load, limits: Limits) -> None:
    shares = split_cell(SPECS, load, limits, 4)
    assert len(shares) == 1 and shares[0].load == load and shares[0].limits == limits


def test_a_multi_turn_cell_runs_in_one_process() -> None:
    turns = [RequestSpec("chat", "hi", 5, 5, conversation=c, turn=t) for c in range(4) for t in (1, 2)]
    assert len(split_cell(turns, Load(concurrency=4), Limits(requests=8), 2)) == 1


def test_auto_keeps_small_loads_in_one_process() -> None:
    assert auto_workers(Load(concurrency=1), cores=16) == 1
    assert auto_workers(Load(concurrency=64), cores=16) == 1
    assert auto_workers(Load(concurrency=256), cores=16) == 1
    assert auto_workers(Load(rate=20.0), cores=16, output_tokens=300) == 1  # 6k tok/s
    assert auto_workers(Load(concurrency=257), cores=16) == 2
    assert auto_workers(Load(concurrency=2000), cores=16) == 8
    assert auto_workers(Load(rate=100.0), cores=16, output_tokens=400) == 5  # 40k tok/s
    assert auto_workers(Load(rate=100.0, max_concurrency=1024), cores=16, output_tokens=10) == 4
    assert auto_workers(Load(concurrency=5000), cores=4) == 3  # the cores less one
    assert auto_workers(Load(concurrency=5000), cores=2) == 1
    assert auto_workers(Load(concurrency=5000), cores=1) == 1


def test_auto_spreads_a_request_rate_one_process_cannot_send_and_says_so() -> None:
    """Short answers at a high rate: few tokens, but every request costs its send, head and end: 5,000 requests/s
    of 1 token is 5k tok/s (one worker by tokens) yet asks for 4 processes by requests."""
    from servescope.core.workers import REQ_S_PER_WORKER, auto_note

    one = [RequestSpec("completions", "p", 32, 1)]
    assert auto_workers(Load(rate=5000.0), cores=16, output_tokens=1) == 4
    assert auto_workers(Load(rate=REQ_S_PER_WORKER), cores=16, output_tokens=1) == 1
    text, short = auto_note(Load(rate=5000.0), one, cores=16)
    assert not short and text.startswith("--workers auto: 4 load processes for 5,000 requests/s (~5,000 streamed")
    text, short = auto_note(Load(rate=5000.0), one, cores=2)  # the cores less one: 1
    assert short and "asks for 4 load processes" in text and "2 cores allow 1" in text
    assert auto_note(Load(rate=20.0), one, cores=16) == ("", False)  # nothing to say
    assert auto_note(Load(concurrency=600), one, cores=16)[0].startswith("--workers auto: 3 load processes for 600 concurrent")


def test_workers_are_parsed_once_with_one_default_and_resolved_per_cell() -> None:
    from servescope.core.workercount import DEFAULT_WORKERS
    from servescope.engine import fields
    from servescope.engine.connection import HttpTarget
    from servescope.engine.spec import SweepSpec

    # the one reading of --workers (flag, TOML, form)
    assert fields.workers("2", "--workers") == 2 and fields.workers(3, "--workers") == 3
    assert fields.workers(" Auto ", "--workers") == "auto"
    with pytest.raises(ServescopeError, match="auto or a number of processes from 1"):
        fields.workers("many", "--workers")
    with pytest.raises(ServescopeError, match="--workers"):
        fields.workers("0", "--workers")
    # one default, for the sweep's option and for a Target built without one
    assert SweepSpec(url="sim://tiny").workers == DEFAULT_WORKERS == HttpTarget(None).workers == "auto"
    # resolved per cell from what was parsed
    assert resolve_workers(3, Load(concurrency=8), SPECS) == 3
    assert resolve_workers("auto", Load(concurrency=4), SPECS) == 1
    with pytest.raises(ServescopeError, match="at least 1"):
        resolve_workers(0, Load(concurrency=4), SPECS)


def _part(lags: list[float], cpu: float, nodes: dict[str, int] | None = None, err: float | None = None) -> ClientPart:
    return ClientPart(loop_lag_ms=LoopLag(p50=0.0, p99=max(lags), max=max(lags)), cpu_s=cpu, wall_s=2.0,
                      cpu_util=cpu / 2.0, workers=1, lag_samples=lags, nodes=nodes, clock_error_ms=err)


def test_parts_merge() -> None:
    m = merge_parts([_part([1.0, 2.0], 0.5, {"a": 10}, 0.2), _part([3.0], 1.0, {"b": 5}, 0.7), None], 3)
    assert m is not None
    assert m.workers == 2 and m.cpu_s == 1.5 and m.cpu_util == 0.5 and m.loop_lag_ms is not None
    assert m.loop_lag_ms.max == 3.0
    assert m.nodes == {"a": 10, "b": 5} and m.clock_error_ms == 0.7
    # workers that measured no lag (a client probe absent): the nodes and the clock bound alone
    assert merge_parts([ClientPart(nodes={"a": 3}, clock_error_ms=0.1), ClientPart(nodes={"a": 2, "b": 1})], 2) == \
        ClientPart(workers=2, nodes={"a": 5, "b": 1}, clock_error_ms=0.1)
    assert merge_parts([None, None], 2) is None


def _record() -> RequestRecord:
    return RequestRecord(index=3, user=1, warmup=False, input_tokens_requested=10, output_tokens_requested=5,
                         scheduled_ns=1_000, sent_ns=1_100, first_token_ns=1_500, first_content_ns=0, end_ns=2_000,
                         output_tokens=3, chunk_ns=array("q", [1_500, 1_700, 2_000]),
                         chunk_tokens=array("i", [1, 1, 1]), cached_tokens=4)


def test_records_pickle_whole() -> None:
    r = _record()
    back = pickle.loads(pickle.dumps([r]))[0]
    assert back == r and back.chunk_ns.typecode == "q" and back.chunk_tokens.typecode == "i"


def test_share_places_records_in_the_cell() -> None:
    closed = split_cell(SPECS, Load(concurrency=4), Limits(requests=20), 2)[1]
    r = closed.place(_record())
    assert (r.index, r.user) == (closed.index_base + 3, 1 + 1 * 2)
    opened = split_cell(SPECS, Load(rate=5.0), Limits(requests=20), 2)[1]
    r = _record()
    r.user = -1
    opened.place(r)
    assert (r.index, r.user) == (1 + 3 * 2, -1)


def test_clock_offset_takes_the_tightest_exchange() -> None:
    # the remote clock reads 5_000 more than the driver's; the second exchange has the smallest round trip
    ex = [(100, 5_200, 400), (1_000, 6_010, 1_020), (2_000, 7_100, 2_300)]
    offset, bound = clock_offset(ex)
    assert offset == 6_010 - 1_010 and bound == 10
    r = shift_record(_record(), offset)
    assert (r.scheduled_ns, r.sent_ns, r.first_content_ns, r.end_ns) == (1_000 - 5_000, 1_100 - 5_000, 0, 2_000 - 5_000)
    assert list(r.chunk_ns) == [-3_500, -3_300, -3_000] and r.chunk_ns.typecode == "q"


def test_node_names_and_pins() -> None:
    assert node_keys([("aaaaaaaaaa", "10.0.0.1"), ("bbbbbbbbbb", "10.0.0.2")]) == \
        {"aaaaaaaaaa": "10.0.0.1", "bbbbbbbbbb": "10.0.0.2"}
    assert node_keys([("aaaaaaaaaa", "10.0.0.1"), ("bbbbbbbbbb", "10.0.0.1")]) == \
        {"aaaaaaaaaa": "10.0.0.1/aaaaaaaa", "bbbbbbbbbb": "10.0.0.1/bbbbbbbb"}
    alive = [{"NodeID": "abc123def", "NodeManagerAddress": "10.0.0.1"},
             {"NodeID": "fed321cba", "NodeManagerAddress": "10.0.0.2"},
             {"NodeID": "fed321xyz", "NodeManagerAddress": "10.0.0.2"}]
    assert pick_nodes(alive, ["10.0.0.1"]) == ["abc123def"]
    assert pick_nodes(alive, ["10.0.0.2", "abc123"]) == ["fed321cba", "fed321xyz", "abc123def"]
    with pytest.raises(ServescopeError, match="no live node '10.9.9.9'"):
        pick_nodes(alive, ["10.9.9.9"])
    with pytest.raises(ServescopeError, match="several node IDs"):
        pick_nodes(alive, ["fed321"])


def test_without_ray_the_flag_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ServescopeError) as e:
        asyncio.run(run_cell_ray(ClientOptions(base_url="http://127.0.0.1:9", model="m"), SPECS, Load(concurrency=1),
                                 Limits(requests=1)))
    assert str(e.value) == RAY_INSTALL and "pip install 'servescope[ray]'" in str(e.value)
