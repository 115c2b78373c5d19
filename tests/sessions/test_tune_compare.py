"""`compare` on a tune session: a search is not a sweep (its cells are sessions of their own), so compare says
so in one line and gives the command that compares what a user means: the searches' best cells."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from servescope.core.errors import ServescopeError
from servescope.sessions.compare import compare_sessions
from servescope.sessions.store import load_session
from servescope.sessions.tunes import best_cell_dir, compare_refusal
from tests.sessions.tune_synth import tune_table, write_tune_session


def test_two_tune_sessions_name_their_best_cells_to_compare(tmp_path: Path) -> None:
    a = load_session(write_tune_session(tmp_path / "20261207-0100-tune-a"))
    b = load_session(write_tune_session(tmp_path / "20261207-0200-tune-b", best_seqs=16))
    with pytest.raises(ServescopeError) as e:
        compare_sessions([a, b])
    msg = e.value.message
    assert len(msg.splitlines()) == 1
    assert msg.startswith("20261207-0100-tune-a, 20261207-0200-tune-b are tune sessions: a search, whose cells are "
                          "sessions of their own; compare the searches' best cells instead: servescope compare ")
    # a's best (--max-num-seqs 32 at c=8) is its step 4; b's (--max-num-seqs 16 at c=8) its step 2
    assert msg.endswith(f"{a.path}/cells/004-c8-max-num-seqs32 {b.path}/cells/002-c8-max-num-seqs16")


def test_a_tune_beside_a_sweep_and_an_unfinished_tune(tmp_path: Path) -> None:
    tune = load_session(write_tune_session(tmp_path / "t"))
    sweep = SimpleNamespace(info=SimpleNamespace(kind="sweep", name="s"), path=tmp_path / "my sweep", meta={})
    assert compare_refusal([sweep, tune]) == (  # type: ignore[list-item]
        f"t is a tune session: a search, whose cells are sessions of their own; compare the searches' best cells "
        f"instead: servescope compare '{tmp_path}/my sweep' {tune.path}/cells/004-c8-max-num-seqs32")
    assert compare_refusal([sweep, sweep]) is None  # type: ignore[list-item]
    open_ = load_session(write_tune_session(tmp_path / "u", status="interrupted"))
    why = compare_refusal([tune, open_])
    assert why is not None and "u has no best cell (its search did not finish)" in why
    assert f"servescope report {open_.path}" in why


def test_best_cell_is_its_first_measurement() -> None:
    t = tune_table()
    assert best_cell_dir(Path("/s"), t) == Path("/s/cells/004-c8-max-num-seqs32")  # step 5 measured it again
    assert best_cell_dir(Path("/s"), {}) is None


def test_lists_count_a_tunes_cells_measured_of_its_budget(tmp_path: Path) -> None:
    # `servescope sessions`, the app's Sessions screen and compare --json all count through cell_counts: a tune
    # session has no cells of its own (they are sessions under cells/), so its count is the search's
    from servescope.sessions.views import cell_counts

    assert cell_counts(load_session(write_tune_session(tmp_path / "t"))) == (5, 6)


def test_one_relaunch_is_singular() -> None:
    from servescope.reports.render_md import render_blocks
    from servescope.reports.tunereport import tune_blocks, tune_summary

    table = tune_table()
    table["relaunches"] = 1
    assert any("1 relaunch," in x for x in tune_summary(table)), tune_summary(table)
    assert "1 relaunch," in render_blocks(tune_blocks(table, 2))
