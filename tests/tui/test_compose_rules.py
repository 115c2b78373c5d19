"""Compose shows a bad combination of fields with the message `servescope run` gives for the same flags
(SweepSpec.check's rule, tests/engine/test_cross_field_rules.py), under the field to change, as it is typed;
and ctrl+s asks where to save, offering the sweeps folder (or the file last used), never the working
directory unasked."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input, Static

from servescope.__main__ import main
from servescope.tui.app import make_app
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.dialogs import AskScreen

from .helpers import set_input, text_of, wait_until

# the --fast lane leaves this module out: 5 tests, ~19 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)


def err(app: object, fid: str) -> str:
    return text_of(app.screen.query_one(f"#{fid}-error", Static))  # type: ignore[attr-defined]


def preview(app: object) -> str:
    return text_of(app.screen.query_one("#preview", Static))  # type: ignore[attr-defined]


def cli_rule(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """The rule `servescope run FLAGS` refuses them with (its line without `servescope run: error: flags: `)."""
    assert main(["run", "-n", "1", *flags]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("servescope run: error: flags: "), line
    return line.removeprefix("servescope run: error: flags: ")


async def test_concurrency_with_rates_reads_as_the_cli_says_it(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rule = cli_rule(capsys, "-c", "1,4", "--rate", "2")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#concurrency", "1,4")
        await set_input(pilot, "#rates", "2")
        assert err(app, "rates") == rule  # as it is typed, under the field
        assert err(app, "concurrency") == ""
        assert "fix: rates" in preview(app)
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.sweep_worker is None and isinstance(app.screen, ComposeScreen)
        await set_input(pilot, "#concurrency", "")  # rates alone: an open loop
        assert err(app, "rates") == ""
        assert "1 load level" in preview(app)


async def test_server_variants_read_as_the_cli_says_them(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    no_launch = cli_rule(capsys, "--server-variant", "--max-num-seqs 4")
    bad_variant = cli_rule(capsys, "--launch", "vllm serve m", "--server-variant", "--port x")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await set_input(pilot, "#variants", "--max-num-seqs 4")
        assert err(app, "variants") == no_launch
        await set_input(pilot, "#launch", "vllm serve m")
        assert err(app, "variants") == ""  # the rule holds again: its message goes
        await set_input(pilot, "#variants", "--port x")
        assert err(app, "variants") == bad_variant and err(app, "launch") == ""
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ComposeScreen)  # nothing to save: no dialog
        assert err(app, "variants") == bad_variant


async def test_a_loaded_pattern_without_rates_reads_as_the_cli_says_it(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pattern is not on the form (it comes from the loaded file); the rule it breaks is shown under rates."""
    path = home / "spike.toml"
    path.write_text('workloads = ["sharegpt"]\n[load]\nrates = [2.0]\npattern = "1x for 5s, 4x"\n')
    rule = cli_rule(capsys, "--sweep", str(path), "-c", "4")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        app.screen.query_one("#sweep-file", Input).value = str(path)  # (typing a long path is not under test)
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert app.screen.query_one("#rates", Input).value == "2"
        await set_input(pilot, "#rates", "")
        await set_input(pilot, "#concurrency", "4")
        assert err(app, "rates") == rule


async def test_empty_load_fields_mean_what_missing_flags_mean(home: Path) -> None:
    """No concurrency, no rates, no requests, no duration: the CLI's defaults (the workload's own), not an error."""
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        for fid in ("concurrency", "rates", "requests", "duration"):
            await set_input(pilot, f"#{fid}", "")
            assert err(app, fid) == ""
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        spec = screen.collect()
        assert spec is not None and (spec.concurrency, spec.rates, spec.requests, spec.duration_s) == (None,) * 4
        assert "3 load levels" in preview(app) and "300 requests" in preview(app)


async def test_ctrl_s_asks_where_and_offers_the_sweeps_folder(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#name", "fp8 run")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), 10, "the save dialog")
        offered = app.screen.query_one("#ask-input", Input).value
        assert offered == str(home / "sweeps" / "fp8-run.toml")
        await pilot.press("escape")  # nothing written
        await pilot.pause()
        assert isinstance(app.screen, ComposeScreen) and not (home / "sweeps").exists()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), 10, "the save dialog")
        await pilot.press("enter")
        await pilot.pause()
        assert (home / "sweeps" / "fp8-run.toml").is_file()
        assert not (home / "fp8-run.toml").exists() and not (home / "sweep.toml").exists()  # the working directory
        assert app.screen.query_one("#sweep-file", Input).value == offered  # the path last used...
        shown = [n.message for n in app._notifications]
        assert any(f"saved {offered}" in m for m in shown), shown  # ...and where it went, said
        await set_input(pilot, "#concurrency", "2,8")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), 10, "the save dialog")
        assert app.screen.query_one("#ask-input", Input).value == offered  # offered again
        await pilot.press("enter")
        await pilot.pause()
        assert "concurrency = [\n    2,\n    8,\n]" in (home / "sweeps" / "fp8-run.toml").read_text()
