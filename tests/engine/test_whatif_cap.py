"""What-if concurrency has a hard cap the twin knows: 2 x its server's max_num_seqs (issue 32: `whatif SESSION -c
99999999999999` grew ~143 MB/s until the kernel's OOM killer stopped it at 20 GB)."""

from __future__ import annotations

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.twin import Twin
from servescope.engine.twinpredict import Load, predict
from servescope.engine.twinshape import Knobs
from servescope.engine.whatifcap import check_whatif_loads, whatif_cap
from servescope.sim.profile import load_profile
from servescope.workloads.spec import Workload, fixed


def _twin() -> Twin:
    p = load_profile("tiny")
    return Twin(p, {}, {}, True)


def test_the_cap_is_twice_the_servers_max_num_seqs_and_follows_the_knob() -> None:
    twin = _twin()
    seqs = twin.profile.engine.max_num_seqs
    assert whatif_cap(twin) == (seqs, 2 * seqs)
    assert whatif_cap(twin, Knobs(max_num_seqs=1000)) == (1000, 2000)
    assert whatif_cap(twin, Knobs(max_num_seqs=1)) == (1, 8)  # a tiny server still gets c=1..8


def test_a_huge_concurrency_is_one_line_naming_the_number_that_fits() -> None:
    twin = _twin()
    seqs, cap = whatif_cap(twin)
    check_whatif_loads(twin, [Load(concurrency=1), Load(concurrency=cap), Load(rate=3.0)])  # fits: nothing said
    with pytest.raises(ServescopeError) as e:
        check_whatif_loads(twin, [Load(concurrency=4), Load(concurrency=99_999_999_999_999)])
    assert e.value.message == (f"--concurrency 99,999,999,999,999: the twin's server runs at most {seqs:,} requests "
                               f"at once (max_num_seqs) and queues the rest; it predicts up to c={cap:,} "
                               f"(2 x max_num_seqs): give at most {cap:,}")
    assert "\n" not in e.value.message
    with pytest.raises(ServescopeError, match="concurrency field 300:"):
        check_whatif_loads(twin, [Load(concurrency=300)], where="concurrency field")


def test_the_largest_allowed_concurrency_is_predicted() -> None:
    twin = _twin()
    _seqs, cap = whatif_cap(twin)
    [p] = predict(twin, Workload("w", input_tokens=fixed(64), output_tokens=fixed(4)), [Load(concurrency=cap)],
                  requests=cap)
    assert p.summary.requests_ok == cap
