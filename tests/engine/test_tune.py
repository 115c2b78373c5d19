"""`servescope tune`'s search without a server: the search-space syntax, the chance of beating the best, the
choice of the next cell, the stopping rule and the relaunch ordering, with a fake measurer (a server whose cells
follow a formula) and a fake model (the same formula, with an error)."""

from __future__ import annotations

import math

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.tune import (
    CellPred,
    Dim,
    Measured,
    Setting,
    Space,
    Tuner,
    count_relaunches,
    design,
    margins_of,
    parse_loads,
    parse_search,
    relaunch_order,
    residual,
    value_residual,
)


# ---- the search space --------------------------------------------------------------------------------
def test_range_doubles_on_a_log_scale_and_ends_at_its_top() -> None:
    d = parse_search("max-num-seqs=16..512")
    assert d.flag == "--max-num-seqs"
    assert d.values == ("16", "32", "64", "128", "256", "512")
    assert d.log_scale
    assert parse_search("--max-num-seqs=16..100").values == ("16", "32", "64", "100")
    assert parse_search("gpu-memory-utilization=0.5..0.9").values == ("0.5", "0.9")


def test_list_is_kept_as_given() -> None:
    d = parse_search("max-num-batched-tokens=8192|2048|16384")
    assert d.values == ("8192", "2048", "16384")
    assert not d.log_scale
    assert parse_search("kv-cache-dtype=auto|fp8").values == ("auto", "fp8")


@pytest.mark.parametrize("text, says", [
    ("max-num-seqs", "give FLAG=LOW..HIGH"),
    ("max-num-seqs=", "give FLAG=LOW..HIGH"),
    ("=16..32", "give FLAG=LOW..HIGH"),
    ("max-num-seqs=64..16", "0 < LOW < HIGH"),
    ("max-num-seqs=0..16", "0 < LOW < HIGH"),
    ("max-num-seqs=a..b", "0 < LOW < HIGH"),
    ("max-num-seqs=1..100000", "at most 12"),
    ("max-num-seqs=4||8", "an empty value"),
    ("max-num-seqs=4|4", "listed twice"),
    ("max num=4|8", "not a flag name"),
])
def test_bad_search_is_one_line(text: str, says: str) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_search(text)
    assert says in e.value.message
    assert "\n" not in e.value.message


def test_loads_parse_lists_and_ranges() -> None:
    assert parse_loads("16,4,8") == (4, 8, 16)
    assert parse_loads("4..64") == (4, 8, 16, 32, 64)
    for bad in ("", "0,4", "a,b", "-1..4"):
        with pytest.raises(ServescopeError):
            parse_loads(bad)


def test_settings_are_the_product_of_the_dims() -> None:
    sp = Space((Dim("--a", ("1", "2")), Dim("--b", ("x", "y", "z"))), (1, 2))
    assert len(sp.settings) == 6
    assert sp.cells == 12
    assert sp.settings[0].text == "--a 1 --b x"
    assert Space((), (1, 2)).settings == [Setting(())]


def test_design_is_small_and_grouped_by_setting() -> None:
    sp = Space((Dim("--s", ("4", "8", "16", "32", "64"), True), Dim("--t", ("1", "2"))), (2, 4, 8, 16, 32, 64))
    cells = design(sp)
    assert len(cells) == 4  # the middle setting at two loads, then each flag at its far value
    assert cells[0][0] == cells[1][0]
    assert count_relaunches([s for s, _ in relaunch_order(cells)]) == 2


# ---- the relaunch ordering ---------------------------------------------------------------------------
def test_relaunch_order_groups_settings_the_running_one_first() -> None:
    cells = [(1, 0), (0, 2), (1, 3), (2, 1), (0, 0)]
    assert relaunch_order(cells) == [(1, 0), (1, 3), (0, 0), (0, 2), (2, 1)]
    assert relaunch_order(cells, current=2) == [(2, 1), (1, 0), (1, 3), (0, 0), (0, 2)]
    assert count_relaunches([s for s, _ in relaunch_order(cells)]) == 2
    assert count_relaunches([s for s, _ in cells]) == 4


# ---- the chance of beating the best --------------------------------------------------------------------
def _pred(margin: float, n: int = 10, wall: float = 1.0, c: int = 8, mu: float = 0.0, sigma: float = 0.1) -> CellPred:
    return CellPred(0, 0, c, [margin] * n, wall, mu, sigma)


def test_goodput_value_counts_requests_within_the_slos() -> None:
    p = CellPred(0, 0, 4, [-0.2, 0.1, 0.3, 0.5], 2.0)
    assert p.value(0.0, "goodput") == pytest.approx(3 / 2.0)
    assert p.value(0.2, "goodput") == pytest.approx(2 / (2.0 * math.exp(0.2)))
    assert p.value(-0.3, "goodput") == pytest.approx(4 / (2.0 * math.exp(-0.3)))


def test_capacity_value_needs_90_percent_of_requests() -> None:
    p = CellPred(0, 0, 16, [-0.1] + [0.2] * 9, 1.0)
    assert p.value(0.0, "capacity") == 16  # 9 of 10 meet
    assert p.value(0.25, "capacity") == 0
    q = CellPred(0, 0, 16, [-0.1, -0.1] + [0.2] * 8, 1.0)
    assert q.value(0.0, "capacity") == 0


def test_chance_grows_with_the_predicted_margin_and_the_uncertainty() -> None:
    best = 9.0  # req/s
    low, high = _pred(0.05), _pred(0.5)
    assert high.chance_to_beat(best, "goodput") > low.chance_to_beat(best, "goodput")
    # a cell predicted just below the best: more uncertainty, more chance
    near = _pred(0.3, wall=1.2)
    assert near.expected("goodput") < best
    sure = CellPred(0, 0, 8, near.margins, near.wall_s, 0.0, 0.02)
    unsure = CellPred(0, 0, 8, near.margins, near.wall_s, 0.0, 0.3)
    assert unsure.chance_to_beat(best, "goodput") > sure.chance_to_beat(best, "goodput")
    # it cannot beat a best above all its requests' rate
    assert _pred(1.0).chance_to_beat(100.0, "goodput") < 1e-6


def test_capacity_chance_is_zero_at_or_below_the_best_level() -> None:
    assert _pred(0.5, c=8).chance_to_beat(8, "capacity") == 0.0
    assert _pred(0.5, c=16).chance_to_beat(8, "capacity") > 0.99
    assert _pred(-0.5, c=16).chance_to_beat(8, "capacity") < 0.01


def test_margins_and_residual() -> None:
    rows: list[dict[str, float | None]] = [{"ttft_ms": 100.0, "tpot_ms": 10.0}, {"ttft_ms": 400.0, "tpot_ms": 10.0},
                                           {"ttft_ms": None, "tpot_ms": None}]
    m = margins_of(rows, {"ttft_ms": 200.0, "tpot_ms": 20.0}, set())
    assert m[0] == -math.inf
    assert m[1] == pytest.approx(math.log(200 / 400))
    assert m[2] == pytest.approx(math.log(2))
    slower = [x - 0.3 for x in m]
    assert residual(m, slower) == pytest.approx(0.3)


def test_value_residual_finds_the_error_that_gives_the_measured_goodput() -> None:
    p = CellPred(0, 0, 4, [0.1, 0.2, 0.3, 0.4], 1.0)
    assert p.value(0.0, "goodput") == 4
    eps = value_residual(p, 2.0, "goodput")  # half the requests met: the latencies were ~exp(0.25) longer
    assert eps is not None and 0.15 < eps < 0.35
    assert p.value(eps, "goodput") == pytest.approx(2.0, rel=0.3)
    assert value_residual(p, 0.0, "goodput") is None  # a measured 0 says no eps
    assert value_residual(p, 100.0, "goodput") is None  # more than the cell can reach
    assert value_residual(p, 2.0, "capacity") is None


# ---- the loop, with fakes ---------------------------------------------------------------------------------
SEQS = ("4", "8", "16", "32", "64")
LOADS = (2, 4, 8, 16, 32, 64)


def _truth(seqs: int, c: int) -> CellPred:
    """A server: running min(c, seqs) at once, each step slower with more running; TTFT grows with the queue. SLO
    margins in ln units against a TPOT and a TTFT limit; goodput is the requests within them per second."""
    running = min(c, seqs)
    tpot = 10.0 * (1 + running / 16)
    queue = max(0, c - seqs) / seqs
    ttft = 50.0 * (1 + queue * 8)
    margins = sorted(min(math.log(25.0 / (tpot * (1 + 0.02 * i))), math.log(400.0 / (ttft * (1 + 0.03 * i))))
                     for i in range(20))
    wall = 20 / (running / (tpot * 32 / 1000))  # 20 requests of 32 tokens, `running` at a time
    return CellPred(0, 0, c, margins, wall)


class FakeServer:
    def __init__(self, objective: str = "goodput") -> None:
        self.objective = objective
        self.launched: list[str] = []
        self.running: str | None = None

    def measure(self, setting: Setting, concurrency: int) -> Measured:
        if setting.text != self.running:
            self.launched.append(setting.text)
            self.running = setting.text
        p = _truth(int(setting.value("--max-num-seqs") or 0), concurrency)
        v = p.value(0.0, self.objective)  # type: ignore[arg-type]
        return Measured(v, p.margins, p.wall_s, p.value(0.0, "capacity") > 0, session="", ci=(v * 0.95, v * 1.05))

    @property
    def relaunches(self) -> int:
        return max(0, len(self.launched) - 1)


class FakeModel:
    """The server's formula with a fixed error: every cell's latencies 15% off, corrected where measured."""

    def __init__(self, space: Space, error: float = 0.15) -> None:
        self.space = space
        self.error = error
        self.seen: set[tuple[int, int]] = set()

    def update(self, observed: dict[tuple[int, int], Measured]) -> None:
        self.seen = set(observed)

    def predict(self, setting: int, load: int) -> CellPred:
        seqs = int(self.space.settings[setting].value("--max-num-seqs") or 0)
        t = _truth(seqs, self.space.loads[load])
        shifted = [m - self.error for m in t.margins]
        return CellPred(setting, load, t.concurrency, shifted, t.wall_s * math.exp(self.error), 0.0, 0.2)


def _grid_best(space: Space, objective: str = "goodput") -> float:
    return max(_truth(int(s.value("--max-num-seqs") or 0), c).value(0.0, objective)  # type: ignore[arg-type]
               for s in space.settings for c in space.loads)


@pytest.mark.parametrize("objective", ["goodput", "capacity"])
def test_tuner_finds_the_grid_optimum_in_a_third_of_the_cells(objective: str) -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    server = FakeServer(objective)
    res = Tuner(space, objective, space.cells // 3, FakeModel(space), server).run()  # type: ignore[arg-type]
    assert res.best is not None
    assert res.best_value >= 0.95 * _grid_best(space, objective)
    assert res.cells_measured <= space.cells // 3
    assert res.relaunches == server.relaunches
    assert res.relaunches < res.cells_measured  # cells on one setting are measured without a relaunch
    assert res.runner_up is not None and res.runner_up[0] != res.best[0]
    assert res.runner_up_why


def test_tuner_stops_before_the_budget_when_nothing_can_beat_the_best() -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    res = Tuner(space, "goodput", space.cells, FakeModel(space, error=0.0), FakeServer()).run()
    assert res.cells_measured < space.cells // 2
    assert res.stop_reason.startswith("no unmeasured cell")


def test_budget_below_the_design_is_refused() -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    with pytest.raises(ServescopeError) as e:
        Tuner(space, "goodput", 2, FakeModel(space), FakeServer()).run()
    assert "--budget 2: the first design alone takes 3 cells" in e.value.message


def test_choice_stays_on_the_running_setting_when_nearly_as_good() -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    t = Tuner(space, "goodput", 10, FakeModel(space), FakeServer())
    a, b = CellPred(0, 1, 4, [0.0], 1.0), CellPred(3, 2, 8, [0.0], 1.0)
    t.current = 0
    assert t.choose([((3, 2), b, 0.8), ((0, 1), a, 0.6)])[0] == (0, 1)  # type: ignore[index]
    assert t.choose([((3, 2), b, 0.9), ((0, 1), a, 0.3)])[0] == (3, 2)  # type: ignore[index]
    assert t.choose([((3, 2), b, 0.04)]) is None  # below P_STOP: nothing worth measuring


def test_load_only_search_without_server_flags() -> None:
    space = Space((), LOADS)

    class Fixed(FakeServer):
        def measure(self, setting: Setting, concurrency: int) -> Measured:
            return super().measure(Setting((("--max-num-seqs", "16"),)), concurrency)

    class Model(FakeModel):
        def predict(self, setting: int, load: int) -> CellPred:
            t = _truth(16, self.space.loads[load])
            return CellPred(setting, load, t.concurrency, [m - 0.1 for m in t.margins], t.wall_s, 0.0, 0.2)

    res = Tuner(space, "capacity", 5, Model(space), Fixed("capacity")).run()
    truth = max(c for c in LOADS if _truth(16, c).value(0.0, "capacity") > 0)
    assert res.best_value == truth
    assert res.relaunches == 0


class NoisyServer(FakeServer):
    """FakeServer whose cells in `luck` measure `factor` times their value, one factor per measurement in turn
    (then exact): a short cell's run-to-run noise on a shared machine."""

    def __init__(self, luck: dict[tuple[str, int], list[float]]) -> None:
        super().__init__("goodput")
        self.luck = {k: list(v) for k, v in luck.items()}
        self.measured: list[tuple[str, int]] = []

    def measure(self, setting: Setting, concurrency: int) -> Measured:
        m = super().measure(setting, concurrency)
        key = (setting.value("--max-num-seqs") or "", concurrency)
        self.measured.append(key)
        factors = self.luck.get(key)
        if factors:
            f = factors.pop(0)
            return Measured(m.value * f, m.margins, m.wall_s, m.meets, session="", ci=(m.value * f * 0.95, m.value * f * 1.05))
        return m


def test_a_lucky_rival_within_the_noise_is_measured_again_and_loses_on_the_pooled_values() -> None:
    # --max-num-seqs 16 at 16 users is truly 16.25 req/s, below the grid's best 16.67 (c=8); its first
    # measurement is lucky (x1.25: 20.3 req/s, inside the model's band), its second unlucky (x0.75)
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    server = NoisyServer({("16", 16): [1.25, 0.75]})
    t = Tuner(space, "goodput", space.cells // 3, FakeModel(space), server)
    res = t.run()
    assert ("16", 16) in server.measured
    assert res.best is not None and space.loads[res.best[1]] == 8  # the true optimum's load, not the lucky cell
    assert res.best_value == pytest.approx(_grid_best(space))
    again = [s for s in res.steps if s.why.startswith("measure again")]
    assert {(space.settings[s.setting].value("--max-num-seqs"), s.concurrency) for s in again} >= {("16", 16)}
    assert len(again) >= 2  # the best and its rival, each once more
    assert res.cells_measured <= space.cells // 3  # within the budget
    # the budget ended with the new best level with a rival it was not measured again beside: not confirmed, and said
    assert not res.confirmed and "; the best is not confirmed: " in res.stop_reason


def test_spread_is_measured_from_cells_measured_twice() -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    t = Tuner(space, "goodput", 10, FakeModel(space), FakeServer())
    assert t.spread() == 0.25  # nothing measured twice yet: the prior
    t.values[(0, 0)] = [10.0, 7.0]
    t.values[(1, 0)] = [10.0, 9.5]
    assert t.spread() == pytest.approx(0.3)  # the largest difference seen
    t.values = {(1, 0): [10.0, 9.9]}
    assert t.spread() == 0.10  # never below CONFIRM_REL


def test_no_recheck_when_the_best_leads_by_more_than_the_spread() -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    t = Tuner(space, "goodput", 10, FakeModel(space), FakeServer())
    m = FakeServer().measure(Setting((("--max-num-seqs", "4"),)), 2)
    t.observed = {(0, 0): Measured(10.0, m.margins, 1.0, True), (1, 0): Measured(7.0, m.margins, 1.0, True)}
    assert t.rechecks() == []  # 7 is 30% below 10: outside the prior spread of 25%
    t.observed[(2, 0)] = Measured(8.0, m.margins, 1.0, True)
    assert t.rechecks() == [(0, 0), (2, 0)]  # 8 is within it: the best and that rival, best first
    t.objective = "capacity"
    assert t.rechecks() == []  # capacity is a level met or not: confirmed as before


def test_a_goodput_cell_measured_twice_is_the_mean_even_when_one_measurement_missed_the_attainment() -> None:
    from servescope.engine.tune import _merged

    a = Measured(2.0, [0.1], 1.0, True, ci=(1.8, 2.2))
    b = Measured(1.6, [0.1], 1.0, False, ci=(1.4, 1.8))
    assert _merged(a, b, [], "goodput").value == pytest.approx(1.8)
    cap_a, cap_b = Measured(16.0, [0.1], 1.0, True), Measured(0.0, [0.1], 1.0, False)
    assert _merged(cap_a, cap_b, [], "capacity").value == 0.0  # capacity: met once and missed once is not met


class SkippingServer(FakeServer):
    """FakeServer on which the user skips the cells in `skip` (the app's `s` on the running cell): no value."""

    def __init__(self, skip: set[tuple[str, int]]) -> None:
        super().__init__("goodput")
        self.skip = skip
        self.measured: list[tuple[str, int]] = []

    def measure(self, setting: Setting, concurrency: int) -> Measured:
        m = super().measure(setting, concurrency)
        key = (setting.value("--max-num-seqs") or "", concurrency)
        self.measured.append(key)
        if key in self.skip:
            return Measured(0.0, [], 0.0, False, 0.0, 0.0, "", (0.0, 0.0), skipped=True)
        return m


def test_a_skipped_cell_is_not_data_and_is_not_asked_for_again() -> None:
    # the grid's best (--max-num-seqs 16 at 8 users, 16.7 req/s) is skipped by the user when the search gets to
    # it: it must not count as 0 req/s in the model or the best, and the search must not measure it again
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    first = Tuner(space, "goodput", space.cells // 3, FakeModel(space), FakeServer()).run()
    assert first.best is not None
    top = (space.settings[first.best[0]].value("--max-num-seqs") or "", space.loads[first.best[1]])
    server = SkippingServer({top})
    t = Tuner(space, "goodput", space.cells // 3, FakeModel(space), server)
    res = t.run()
    assert server.measured.count(top) == 1  # asked for once, skipped, never again
    [skipped] = [st for st in res.steps if st.skipped]
    assert "skipped by the user" in skipped.why
    assert (skipped.setting, skipped.load) not in t.observed  # no 0 req/s in what the model learns from
    assert res.best is not None and res.best != (skipped.setting, skipped.load)
    assert res.best_value > 0


def test_a_search_whose_design_was_all_skipped_ends_without_a_best() -> None:
    space = Space((Dim("--max-num-seqs", SEQS, True),), LOADS)
    skip = {(s.value("--max-num-seqs") or "", c) for s in space.settings for c in space.loads}
    res = Tuner(space, "goodput", 10, FakeModel(space), SkippingServer(skip)).run()
    assert res.best is None and res.stop_reason == "every cell of the first design was skipped"
    assert res.cells_measured == 3
