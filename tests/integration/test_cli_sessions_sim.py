"""The command line over sessions the simulator made (issue 44): `sessions` names each session, `run` prints each
cell's cost as report does, `compare` refuses what cannot be compared, `twin fit` says nothing before a refusal, and
a /metrics that answers 404 is said without a Python exception's name. The sessions are written by the real
commands (`servescope run`, `servescope quality`), in-process."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from servescope.__main__ import main

# the --fast lane leaves this module out: 8 tests, ~12 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SMALL = '[workload]\nname = "small"\ninput_tokens = 32\noutput_tokens = 8\n'


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Under one sessions directory: `api` and `gpu-box`, two runs (gpu-box priced by the hour), and `q`, a quality
    probe's session (quality results, no speed cells)."""
    d = tmp_path_factory.mktemp("cli-sessions")
    (d / "small.toml").write_text(SMALL)
    run = ["run", "--url", "sim://tiny", "-w", str(d / "small.toml"), "-n", "2", "--telemetry-interval", "off"]
    assert main([*run, "-c", "1", "--name", "api", "--save", str(d / "sessions" / "20261207-100000-api")]) == 0
    assert main([*run, "-c", "1,2", "--name", "gpu-box", "--gpu-hour", "2.5",
                 "--save", str(d / "sessions" / "20261207-100100-gpu-box")]) == 0
    assert main(["quality", "--url", "sim://tiny", "--tasks", "arithmetic", "-n", "2", "--no-perplexity",
                 "--save", str(d / "sessions" / "20261207-100200-q")]) == 0
    return d / "sessions"


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and out == "", (out, err)
    return lines[0]


def test_sessions_names_each_session(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`api` and `gpu-box` looked alike: the same model, cells, workload and target, ids that differ in a second."""
    capsys.readouterr()
    assert main(["sessions", "--sessions-dir", str(made)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["id", "name", "status"]
    names = {ln.split()[0]: ln.split()[1] for ln in lines[1:-1]}
    assert names == {"20261207-100000": "api", "20261207-100100": "gpu-box", "20261207-100200": "quality"}


def test_run_prints_each_cells_cost_as_report_does(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu-hour's cost per cell was in report and compare, never in run's own table."""
    capsys.readouterr()
    (made.parent / "again").mkdir()
    assert main(["run", "--url", "sim://tiny", "-w", str(made.parent / "small.toml"), "-n", "2", "-c", "1,2",
                 "--telemetry-interval", "off", "--gpu-hour", "2.5", "--save", str(made.parent / "again" / "s")]) == 0
    run_costs = re.findall(r"^  cost \$/1M out tok: ([\d.,]+) \(\$[\d.,]+ per 1M tokens in all; gpu-hour \$2\.50 at ",
                           capsys.readouterr().out, re.M)
    assert main(["report", str(made.parent / "again" / "s")]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("| c="))  # the results table (others follow it)
    table = list(itertools.takewhile(lambda ln: ln.startswith("| c="), lines[first:]))
    report_costs = [ln.rstrip(" |").rsplit("|", 1)[1].strip() for ln in table]
    assert len(run_costs) == 2 and run_costs == report_costs, (run_costs, report_costs)


def test_compare_refuses_one_session_twice(made: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = str(made / "20261207-100000-api")
    assert one_line(capsys, ["compare", api, api]) == (
        f"servescope compare: error: {api} is given twice; compare two different sessions (see `servescope sessions`)")
    line = one_line(capsys, ["compare", api, "20261207-100000", "--sessions-dir", str(made)])
    assert line.startswith(f"servescope compare: error: {api} and 20261207-100000 are the same session")
    assert f"{api} is given twice" in one_line(capsys, ["report", api, "--compare", api])


def test_compare_refuses_a_quality_session_against_a_sweep_without_quality(made: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """They share nothing: the comparison came out empty, exit 0. The line says what to do instead."""
    for argv in (["compare", "20261207-100000", "20261207-100200"], ["compare", "20261207-100200", "20261207-100000"]):
        line = one_line(capsys, [*argv, "--sessions-dir", str(made)])
        assert "20261207-100200-q is a quality session (quality results, no speed cells)" in line, line
        assert "20261207-100000-api holds no quality results" in line
        assert f"servescope quality --url URL --save {made / '20261207-100000-api'}" in line


def test_twin_fit_of_a_session_without_cells_says_nothing_before_its_refusal(made: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`fitting the twin to ... (a while) ...` came first, then the refusal."""
    line = one_line(capsys, ["twin", "fit", str(made / "20261207-100200-q")])
    assert line.startswith("servescope twin fit: error: ") and "no completed cell with measured requests" in line
    assert not (made / "20261207-100200-q" / "twin").exists()


@pytest.mark.parametrize(("argv", "says"), [
    (["-c", "100000"], "--concurrency 100,000: the twin's server runs at most 128 requests at once"),
    (["-c", "1", "--gpu-memory-utilization", "0.01"], "--gpu-memory-utilization 0.01 leaves no memory for the KV cache"),
])
def test_whatif_refuses_what_the_twin_cannot_answer_before_fitting_it(made: Path, argv: list[str], says: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Both were found after `fitting the twin to ... ` and its progress lines, with the fit written to SESSION/twin."""
    api = made / "20261207-100000-api"
    line = one_line(capsys, ["whatif", str(api), *argv])
    assert line.startswith(f"servescope whatif: error: {says}"), line
    assert not (api / "twin").exists()


def test_a_metrics_404_is_said_without_an_exception_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hosted API has no /metrics: its reason read `ValueError: HTTP 404`."""
    (tmp_path / "small.toml").write_text(SMALL)
    assert main(["run", "--url", "sim://tiny?hosted=1", "-w", str(tmp_path / "small.toml"), "-n", "1", "-c", "1",
                 "--save", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err
    assert "server telemetry off: no usable /metrics on the server (HTTP 404)" in err, err
    assert "Error" not in err, err
