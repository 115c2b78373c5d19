"""--repeat K: every point runs K times, interleaved across the sweep, and the run ends with each point's
median over its repeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.plan import plan_cells
from servescope.engine.spec import SweepSpec
from servescope.workloads.spec import resolve
from tests.integration.helpers import run_json


def test_repeats_are_interleaved_and_numbered() -> None:
    spec = SweepSpec(workloads=tuple(resolve("sharegpt,longin")), concurrency=(1, 4), repeat=3)
    cells = plan_cells(spec)
    assert len(cells) == 12 and [c.index for c in cells] == list(range(12))
    assert [(c.workload.name, c.load.concurrency, c.repeat) for c in cells[:5]] == [
        ("sharegpt", 1, 1), ("sharegpt", 4, 1), ("longin", 1, 1), ("longin", 4, 1), ("sharegpt", 1, 2)]
    assert cells[4].label == "sharegpt c=1 #2/3" and cells[4].row()["repeat"] == 2
    assert len({c.prompt_key for c in cells}) == 12  # each repeat its own prompts: no repeat hits another's cache
    assert SweepSpec.from_table(spec.to_table(), "t").repeat == 3


@pytest.mark.parametrize("bad", ["0", "101", "two"])
def test_a_bad_repeat_is_one_line(bad: str) -> None:
    import argparse

    from servescope.engine.spec import add_flags

    p = argparse.ArgumentParser()
    add_flags(p)
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_args(p.parse_args(["--repeat", bad]))
    assert "--repeat" in e.value.message and "\n" not in e.value.message


@pytest.mark.slow
def test_a_repeated_sweep_reports_each_points_median(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text('[workload]\nname = "f"\ninput_tokens = 64\noutput_tokens = 16\n')
    out = run_json("--url", "sim://tiny", "-w", str(tmp_path / "f.toml"), "-c", "1,2", "-n", "6", "--repeat", "3")
    assert [c["repeat"] for c in out["cells"]] == [1, 1, 2, 2, 3, 3]
    [p1, p2] = out["points"]
    assert (p1["concurrency"], p1["repeats"], p2["concurrency"]) == (1, 3, 2)
    got = sorted(c["output_tok_s"] for c in out["cells"] if c["concurrency"] == 1)
    f = p1["figures"]["output_tok_s"]
    assert f["median"] == got[1] and (f["min"], f["max"]) == (got[0], got[2])
    lo, hi = f["ci"]  # the hierarchical bootstrap's 95% interval, around the median
    assert lo < hi and lo <= f["median"] * 1.02 and hi >= f["median"] * 0.98
