"""The arrival-shape options of a sweep: `--arrival gamma --burstiness 0.5`, `--ramp 10s` / `[load] ramp`, and
`--pattern` / `[load] pattern`, through the file, the flags, the form and the planned cells."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from servescope.core.arrivals import Step
from servescope.core.errors import ServescopeError
from servescope.engine.plan import plan_cells, pool_size
from servescope.engine.spec import SweepSpec, add_flags, add_workload_flag
from servescope.workloads.spec import PRESETS

SHAREGPT = (PRESETS["sharegpt"],)
PATTERN = (Step(1.0, 20.0), Step(4.0, 5.0), Step(1.0))
HOW = 'e.g. "1x for 20s, 4x for 5s, 1x" (a rate multiplier and how long it lasts; the last step holds)'


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_workload_flag(p)
    add_flags(p)
    return p.parse_args(list(argv))


def test_the_shape_survives_a_sweep_file(tmp_path: Path) -> None:
    spec = SweepSpec(workloads=SHAREGPT, rates=(2.0, 8.0), arrival="gamma", burstiness=0.5, ramp_s=10.0,
                     pattern=PATTERN, requests=50)
    path = spec.save(tmp_path / "s.toml")
    load = tomllib.loads(path.read_text())["load"]
    assert load["arrival"] == "gamma" and load["burstiness"] == 0.5 and load["ramp"] == "10s"
    assert load["pattern"] == "1x for 20s, 4x for 5s, 1x"
    assert SweepSpec.from_toml(path) == spec
    assert SweepSpec.from_table(spec.to_table(inline_workloads=True)) == spec  # a session's [sweep] table
    plain = SweepSpec(workloads=SHAREGPT).to_table()["load"]
    assert not {"burstiness", "ramp", "pattern"} & set(plain)  # unset: not written


def test_the_keys_as_written_by_hand(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(
        'workloads = ["sharegpt"]\n[load]\nrates = [4]\narrival = "gamma"\nburstiness = 2\nramp = 30\n'
        'pattern = ["1x for 20s", "4x for 5s", "1x"]\n')
    spec = SweepSpec.from_toml(tmp_path / "s.toml")
    assert (spec.burstiness, spec.ramp_s, spec.pattern) == (2.0, 30.0, PATTERN)
    (tmp_path / "c.toml").write_text('workloads = ["sharegpt"]\n[load]\nconcurrency = [16]\nramp = "10s"\n')
    assert SweepSpec.from_toml(tmp_path / "c.toml").ramp_s == 10.0


def test_the_flags() -> None:
    spec = SweepSpec.from_args(_args("--rate", "8", "--arrival", "gamma", "--burstiness", "0.5", "--ramp", "10s",
                                     "--pattern", "1x for 20s, 4x for 5s, 1x"))
    assert (spec.arrival, spec.burstiness, spec.ramp_s, spec.pattern) == ("gamma", 0.5, 10.0, PATTERN)
    again = SweepSpec.from_table(spec.to_table())
    assert again == spec.replace(workloads=again.workloads)
    assert SweepSpec.from_args(_args("-c", "16", "--ramp", "10s")).ramp_s == 10.0


def test_flags_over_a_file(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text('workloads = ["sharegpt"]\n[load]\nrates = [4]\narrival = "gamma"\n'
                                     'burstiness = 0.25\nramp = "5s"\n')
    base = SweepSpec.from_toml(tmp_path / "s.toml")
    assert SweepSpec.from_args(_args("--burstiness", "3"), base).burstiness == 3.0
    assert SweepSpec.from_args(_args("--ramp", "1m"), base).ramp_s == 60.0
    # other arrivals given as a flag take the file's gamma shape with them
    spec = SweepSpec.from_args(_args("--arrival", "poisson"), base)
    assert spec.arrival == "poisson" and spec.burstiness is None and spec.ramp_s == 5.0


def test_the_form_leaves_them_unset_when_blank() -> None:
    spec, errors = SweepSpec.from_form({"rates": "2", "burstiness": "", "ramp_s": "", "pattern": "",
                                        "workloads": list(SHAREGPT)})
    assert errors == {} and spec is not None
    assert (spec.burstiness, spec.ramp_s, spec.pattern) == (None, None, None)
    spec, errors = SweepSpec.from_form({"rates": "2", "arrival": "gamma", "burstiness": "-1", "ramp_s": "x",
                                        "pattern": "4x for 5s", "workloads": list(SHAREGPT)})
    assert spec is None and set(errors) == {"burstiness", "ramp_s", "pattern"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "2", "--burstiness", "0.5"],
         "flags: burstiness shapes gamma arrivals, but arrival is 'poisson'; add arrival = \"gamma\" "
         "(--arrival gamma) or drop burstiness"),
        (["--rate", "2", "--arrival", "gamma", "--burstiness", "0"],
         "--burstiness: must be above 0; give a number above 0 like 0.5 (1 is Poisson, below 1 burstier, above 1 "
         "more regular)"),
        (["--rate", "2", "--arrival", "gamma", "--burstiness", "-0.5"],
         "--burstiness: must be above 0; give a number above 0 like 0.5 (1 is Poisson, below 1 burstier, above 1 "
         "more regular)"),
        (["--rate", "2", "--arrival", "gamma", "--burstiness", "nan"],
         "--burstiness: must be above 0; give a number above 0 like 0.5 (1 is Poisson, below 1 burstier, above 1 "
         "more regular)"),
        (["--rate", "2", "--arrival", "gamma", "--burstiness", "lots"],
         "--burstiness: 'lots' is not a number; give a number above 0 like 0.5 (1 is Poisson, below 1 burstier, "
         "above 1 more regular)"),
        (["--rate", "2", "--arrival", "gamma", "--burstiness", "5000"],
         "--burstiness: 5000 is above 1000: that is constant arrivals; use arrival = \"constant\" instead"),
        (["--rate", "2", "--arrival", "bursty"], "--arrival: must be 'constant', 'poisson' or 'gamma', not 'bursty'"),
        (["--ramp", "-1s"], "--ramp: the duration must be above 0, not -1s (e.g. 10s)"),
        (["--ramp", "soon"], "--ramp: bad duration 'soon'; use e.g. 60s, 5m or 90, auto (the default) or 0 (none)"),
        (["--rate", "2", "--pattern", "1x for 20s, 4x for 5s"],
         f"--pattern: the last step '4x for 5s' holds until the cell ends: drop its 'for ...'; {HOW}"),
        (["--rate", "2", "--pattern", "spike"], f"--pattern: bad step 'spike'; {HOW}"),
        (["-c", "4", "--pattern", "1x for 20s, 4x"],
         "flags: a pattern multiplies an open loop's rate; give rates (--rate 2,5) or drop the pattern"),
    ],
)
def test_bad_values_say_what_to_write(argv: list[str], message: str) -> None:
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_args(_args(*argv))
    assert e.value.message == message


@pytest.mark.parametrize(
    ("load", "needle"),
    [
        ("rates = [2]\nburstiness = 0.5\n", "s.toml: burstiness shapes gamma arrivals, but arrival is 'poisson'"),
        ("rates = [2]\narrival = \"gamma\"\nburstiness = true\n", "s.toml:6: [load] burstiness: must be above 0"),
        ("rates = [2]\narrival = \"gamma\"\nburstiness = -1\n", "s.toml:6: [load] burstiness: must be above 0"),
        ("rates = [2]\nramp = \"\"\n", "s.toml:5: [load] ramp: empty"),
        ("rates = [2]\nramp = -3\n", "s.toml:5: [load] ramp: must be above 0"),
        ("rates = [2]\npattern = 4\n", "s.toml:5: [load] pattern: give the steps as a string like"),
        ("rates = [2]\npattern = []\n", f"s.toml:5: [load] pattern: empty pattern; {HOW}"),
        ("rates = [2]\npattern = \"1x for 5s, 0x\"\n", "s.toml:5: [load] pattern: the last step '0x' must be above 0x"),
        ("concurrency = [2]\npattern = \"2x\"\n", "s.toml: a pattern multiplies an open loop's rate"),
        ("rates = [2]\nramps = \"5s\"\n", "did you mean 'ramp'?"),
    ],
)
def test_bad_keys_in_a_file(tmp_path: Path, load: str, needle: str) -> None:
    (tmp_path / "s.toml").write_text(f'workloads = ["sharegpt"]\n\n[load]\n{load}')
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_toml(tmp_path / "s.toml")
    assert needle in e.value.message and "\n" not in e.value.message


def test_cells_carry_the_shape() -> None:
    spec = SweepSpec.from_args(_args("--rate", "8", "--arrival", "gamma", "--burstiness", "0.5", "--ramp", "10s",
                                     "--pattern", "1x for 20s, 4x for 5s, 1x", "--duration", "60s"))
    (cell,) = plan_cells(spec)
    assert cell.load.burstiness == 0.5 and cell.load.ramp_s == 10 and cell.load.pattern == PATTERN
    assert cell.label == "sharegpt rate 8/s gamma(0.5) ramp 10s steps 1x:20s 4x:5s 1x"
    row = cell.row()
    assert row["arrival"] == "gamma" and row["burstiness"] == 0.5 and row["ramp_s"] == 10
    assert row["pattern"] == "1x for 20s, 4x for 5s, 1x"
    (spiky,) = plan_cells(SweepSpec.from_args(_args("--rate", "1", "--pattern", "4x for 5s, 1x", "--duration", "9s")))
    (steady,) = plan_cells(SweepSpec.from_args(_args("--rate", "1", "--duration", "9s")))
    assert (pool_size(spiky), pool_size(steady)) == (256, 64)  # prompts enough for the spike's 4/s
    (gamma1,) = plan_cells(SweepSpec.from_args(_args("--rate", "8", "--arrival", "gamma")))
    assert gamma1.load.burstiness == 1.0 and gamma1.load.label == "rate 8/s gamma(1)"
    (closed,) = plan_cells(SweepSpec.from_args(_args("-c", "16", "--ramp", "10s")))
    assert closed.load.label == "c=16 ramp 10s" and closed.row()["burstiness"] is None
    (plain,) = plan_cells(SweepSpec.from_args(_args("-c", "16")))
    assert plain.load.ramp_s is None and plain.row()["ramp_s"] is None and plain.load.label == "c=16"


def test_a_workloads_own_ramp_applies_unless_the_sweep_gives_one() -> None:
    own = PRESETS["sharegpt"].__class__(**{**PRESETS["sharegpt"].__dict__})
    object.__setattr__(own, "ramp_s", 3.0)  # stands in for Workload.ramp_s (a per-workload `ramp` key)
    spec = SweepSpec(workloads=(own,), concurrency=(4,))
    assert plan_cells(spec)[0].load.ramp_s == 3.0
    assert plan_cells(spec.replace(ramp_s=7.0))[0].load.ramp_s == 7.0
