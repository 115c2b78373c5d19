"""A warmup larger than the requests a cell measures is bad input (issue 44, item 16: `--warmup 100000000 -n 4` ran
the warmup for hours with no output): one line, exit 2, before any server starts, from the flags, a sweep file
and the Compose form alike (SweepSpec.check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.__main__ import main
from servescope.engine.spec import SweepConflict, SweepSpec
from servescope.workloads.spec import PRESETS

RULE = "warmup 100,000,000 is more than the 4 measured requests of a cell of 'sharegpt'"


def test_a_warmup_past_the_requests_is_one_line_before_anything_starts(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    assert main(["run", "--url", "sim://tiny", "--warmup", "100000000", "-n", "4",
                 "--sessions-dir", str(tmp_path / "s")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and RULE in lines[0] and "--warmup 4 or less" in lines[0], lines
    assert not (tmp_path / "s").exists()  # no simulator, no session
    # the default request count (100) bounds it as well
    assert main(["run", "--url", "sim://tiny", "--warmup", "101", "--sessions-dir", str(tmp_path / "s")]) == 2
    assert "warmup 101 is more than the 100 measured requests" in capsys.readouterr().err


def test_the_file_and_the_form_say_the_same(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('workloads = ["sharegpt"]\n[load]\nrequests = 4\nwarmup = 100000000\n')
    with pytest.raises(SweepConflict) as e:
        SweepSpec.from_toml(path)
    assert e.value.rule.startswith(RULE)
    spec, errors = SweepSpec.from_form({"url": "sim://", "requests": "4", "warmup": "100000000",
                                        "workloads": [PRESETS["sharegpt"]]})
    assert spec is None and list(errors) == ["warmup"] and errors["warmup"].startswith(RULE)


def test_a_warmup_within_the_requests_or_with_only_a_duration_is_fine() -> None:
    w = (PRESETS["sharegpt"],)
    assert SweepSpec(workloads=w, requests=4, warmup=4).check() is not None
    assert SweepSpec(workloads=w, duration_s=2.0, warmup=100_000_000).check() is not None  # bounded by the duration
