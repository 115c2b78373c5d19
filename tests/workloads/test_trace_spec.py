"""`kind = "trace"` in a workload TOML: its keys, its round trip, and one line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.plan import plan_cells
from servescope.engine.spec import SweepSpec
from servescope.workloads.spec import Workload, load_toml


def _toml(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "w.toml"
    f.write_text(body)
    return f


def test_a_trace_workload_reads_its_file_relative_to_the_toml_and_round_trips(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "mc.jsonl").write_text('{"timestamp": 0, "input_length": 40, "output_length": 4}\n'
                                             '{"timestamp": 500, "input_length": 60, "output_length": 6}\n')
    [w] = load_toml(_toml(tmp_path, '[workload]\nname = "r"\nkind = "trace"\ntrace = "t/mc.jsonl"\ntime_scale = 2\n'))
    assert w.kind == "trace" and w.trace == str((tmp_path / "t" / "mc.jsonl").resolve()) and w.time_scale == 2.0
    assert w.api == "completions" and w.trace_format == "auto" and "mc.jsonl" in w.shape()
    assert Workload.from_dict(w.to_dict()) == w
    [cell] = plan_cells(SweepSpec(workloads=(w,), concurrency=(1, 4), requests=None))  # one cell: the trace's
    assert cell.load.times == (0.0, 1.0) and cell.requests == 2 and cell.warmup == 0
    assert cell.load.label.startswith("trace ")
    [cell] = plan_cells(SweepSpec(workloads=(w,), requests=1))
    assert cell.requests == 1  # -n takes the trace's first N


@pytest.mark.parametrize(("body", "message"), [
    ('kind = "trace"\n', 'kind = "trace" needs trace = "FILE"'),
    ('kind = "trace"\ntrace = "x.jsonl"\nformat = "csv"\n', "format 'csv' is not one of auto, mooncake"),
    ('kind = "trace"\ntrace = "x.jsonl"\ntime_scale = 0\n', "time_scale must be a number above 0"),
    ('kind = "trace"\ntrace = "x.jsonl"\ninput_tokens = 5\n', 'input_tokens is only for kind = "single"'),
    ('trace = "x.jsonl"\n', 'trace is only for kind = "trace" workloads'),
    ('kind = "trace"\ntrace = "x.jsonl"\ntime_scal = 2\n', "did you mean 'time_scale'"),
])
def test_each_mistake_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ServescopeError) as e:
        load_toml(_toml(tmp_path, f'[workload]\nname = "r"\n{body}'))
    assert message in e.value.message and "\n" not in e.value.message, e.value.message


def test_a_missing_trace_file_stops_the_sweep_before_anything_starts(tmp_path: Path) -> None:
    [w] = load_toml(_toml(tmp_path, '[workload]\nname = "r"\nkind = "trace"\ntrace = "nope.jsonl"\n'))
    with pytest.raises(ServescopeError) as e:
        SweepSpec(workloads=(w,)).check("flags")
    assert "nope.jsonl" in e.value.message and "workload 'r'" in e.value.message


def test_a_workload_ramp_applies_to_its_cells_unless_the_sweep_says(tmp_path: Path) -> None:
    [w] = load_toml(_toml(tmp_path, '[workload]\nname = "r"\nramp = "10s"\n'))
    assert w.ramp_s == 10.0 and Workload.from_dict(w.to_dict()) == w
    assert [c.load.ramp_s for c in plan_cells(SweepSpec(workloads=(w,), concurrency=(2, 4)))] == [10.0, 10.0]
    assert plan_cells(SweepSpec(workloads=(w,), concurrency=(2,), ramp_s=3.0))[0].load.ramp_s == 3.0
    for bad, msg in (('"abc"', "bad duration 'abc'"), ("0", "must be above 0")):
        with pytest.raises(ServescopeError) as e:
            load_toml(_toml(tmp_path, f'[workload]\nname = "r"\nramp = {bad}\n'))
        assert msg in e.value.message and "ramp" in e.value.message
