"""Prefix-cache accounting reaches reports and compare: a conversation session's report has the hit rate per
cell and a per-turn table; compare shows the hit rate beside the other figures (not judged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import run_json, servescope


@pytest.mark.slow
def test_reports_and_compare_show_the_prefix_cache(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('[workload]\nname = "chat3"\nkind = "conversation"\nturns = 3\n'
                                     'input_tokens = 120\noutput_tokens = 16\n')
    a = run_json("--url", "sim://tiny", "-w", str(tmp_path / "c.toml"), "-c", "2", "-n", "6", "--tag", "run=a")
    b = run_json("--url", "sim://tiny", "-w", str(tmp_path / "c.toml"), "-c", "2", "-n", "6", "--tag", "run=b",
                 "--seed", "1")
    [cell] = a["cells"]
    assert 0 < cell["prefix_cache_hit_rate"] < 1 and [t["turn"] for t in cell["turns"]] == [1, 2, 3]
    rep = servescope("report", a["session"], timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert "| prefix cache hit |" in rep.stdout and f"{cell['prefix_cache_hit_rate']:.1%}" in rep.stdout
    assert "c=2, per turn" in rep.stdout and "| 3 | 2 / 0 |" in rep.stdout
    cmp = servescope("compare", a["session"], b["session"], "--label", "run", "--json", timeout=120)
    assert cmp.returncode == 0, cmp.stderr
    [c] = json.loads(cmp.stdout)["cells"]
    hit = c["metrics"]["prefix_cache_hit_rate"]
    assert hit["values"][0] == cell["prefix_cache_hit_rate"] and hit["winner"] is None  # shown, not judged
