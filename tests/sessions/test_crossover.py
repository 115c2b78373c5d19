"""The crossover load of two configurations (sessions/crossover.py): where speculation stops lowering TPOT."""

from __future__ import annotations

from servescope.core.results import CellResult, Dist, SpecDecode
from servescope.sessions.crossover import crossover, crossover_sentence, speculation_crossover


def test_the_first_load_where_b_stops_being_lower() -> None:
    off = {1: 4.0, 4: 4.2, 8: 4.4, 16: 5.3, 32: 7.5}
    on = {1: 3.1, 4: 3.7, 8: 4.2, 16: 5.9, 32: 8.9}
    c = crossover(off, on)
    assert c is not None and c.crosses and (c.lower_up_to, c.higher_from) == (8, 16)
    assert crossover_sentence(c) == "speculation lowers TPOT up to c=8, raises it from c=16"
    assert [p[0] for p in c.points] == [1, 4, 8, 16, 32]


def test_no_crossing_either_way_and_no_common_load() -> None:
    always = crossover({1: 4.0, 8: 5.0}, {1: 3.0, 8: 4.0})
    assert always is not None and (always.lower_up_to, always.higher_from) == (8, None) and not always.crosses
    assert crossover_sentence(always) == "speculation lowers TPOT at every load measured (up to c=8)"
    never = crossover({1: 4.0, 8: 5.0}, {1: 4.5, 8: 6.0})
    assert never is not None and (never.lower_up_to, never.higher_from) == (None, 1)
    assert "does not lower TPOT at any load" in crossover_sentence(never)
    assert crossover({1: 1.0}, {2: 1.0}) is None


def test_a_tolerance_counts_a_near_tie_as_not_lower() -> None:
    c = crossover({1: 4.0, 2: 4.0}, {1: 3.0, 2: 3.96}, tolerance=0.02)
    assert c is not None and (c.lower_up_to, c.higher_from) == (1, 2)
    assert crossover_sentence(c, unit="req/s") == "speculation lowers TPOT up to 1 req/s, raises it from 2 req/s"


def _cell(tpot: float, spec: bool) -> CellResult:
    return CellResult(tpot_ms=Dist(p50=tpot), spec_decode=SpecDecode(acceptance_rate=0.5) if spec else None)


def test_cells_with_speculation_against_those_without_medians_of_repeats() -> None:
    cells = [(1, _cell(4.0, False)), (1, _cell(3.0, True)), (16, _cell(5.0, False)), (16, _cell(6.0, True)),
             (16, _cell(4.0, True)), (16, _cell(7.0, True))]  # c=16 with speculation: median 6.0
    c = speculation_crossover(cells)
    assert c is not None and (c.lower_up_to, c.higher_from) == (1, 16)
    assert speculation_crossover([(1, _cell(4.0, False))]) is None
