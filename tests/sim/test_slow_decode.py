"""The `--slow-decode F` fault: decode-only steps take (1 + F) times as long, prefill does not change (a known
regression for gates to catch)."""

from __future__ import annotations

import pytest

from servescope.sim.cli import build_parser
from servescope.sim.profile import CostModel, load_profile


def test_decode_steps_slow_down_by_the_fraction_and_prefill_does_not() -> None:
    p = load_profile("tiny")
    base, slow = CostModel(p), CostModel(p.with_overrides(decode_slowdown=1.08))
    assert slow.decode_step_time(8, 1024) == pytest.approx(1.08 * base.decode_step_time(8, 1024))
    assert slow.prefill_time(2048) == pytest.approx(base.prefill_time(2048))


def test_the_flag_is_a_fraction() -> None:
    assert build_parser().parse_args(["--slow-decode", "0.08"]).slow_decode == 0.08
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--slow-decode", "8"])
