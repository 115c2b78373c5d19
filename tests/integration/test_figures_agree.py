"""One simulator sweep read on the three surfaces a user reads figures on: the CLI's cell table (`servescope run`'s
output), the Markdown report (`servescope report`) and the app's cell table (a saved session opened on F4).
Each figure's name is read back into a metric and a statistic (a latency or per-user figure that names no
statistic fails), its value must be the stored cell summary's value of that metric and statistic to the
precision shown, and so the three agree wherever they show the same figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.core.results import DIST_KEYS, CellResult
from servescope.sessions.store import load_session
from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.widgets import CellTable

# the --fast lane leaves this module out: 1 tests, ~10 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = '[workload]\nname = "short"\napi = "completions"\ninput_tokens = 64\noutput_tokens = 24\n'
LOADS = ("c=1", "c=2")

# the words each surface names a metric by (the app abbreviates the aggregate output rate)
NAMES = (("ttft_ms", ("ttft",)), ("tpot_ms", ("tpot",)), ("e2e_ms", ("e2e",)), ("itl_ms", ("itl ms",)),
         ("per_user_tok_s", ("per-user tok/s",)), ("output_tok_s", ("out tok/s", "output tok/s")))
STAT = re.compile(r"\b(mean|p50|p90|p95|p99|max|min)\b")
NUM = re.compile(r"^-?[\d,]+(?:\.(\d+))?$")

Figure = tuple[str, str, str | None]  # (load, metric, statistic)


def metric_of(name: str) -> str | None:
    """The metric a name names; None: not a compared figure."""
    low = name.lower()
    if "probe" in low:  # the interference probes' own figures (--probe-rate), not the cell's
        return None
    return next((key for key, words in NAMES if any(w in low for w in words)), None)


def name_to_figure(name: str) -> tuple[str, list[str | None]] | None:
    """A column name read as (metric, the statistics it names, in order); None: not a compared figure."""
    low = name.lower()
    metric = metric_of(name)
    if metric is None:
        return None
    stats: list[str | None] = list(STAT.findall(low))
    if metric in DIST_KEYS:
        assert stats, f"{name!r} shows a distribution ({metric}) without naming its statistic"
    return metric, stats or [None]


def put(out: dict[Figure, str], where: str, load: str, metric: str, stat: str | None, text: str) -> None:
    key = (load, metric, stat)
    assert key not in out, f"{where}: {key} shown twice"
    out[key] = text


def cli_figures(stdout: str) -> dict[Figure, str]:
    """`servescope run`'s cell blocks: the aggregate line and the metric x statistic table."""
    out: dict[Figure, str] = {}
    load, stats = "", []
    for line in stdout.splitlines():
        if m := re.match(r"cell \d+/\d+\s+\S+ (c=\d+)\s", line):
            load = m.group(1)
        elif m := re.match(r"\s+aggregate: output ([\d,.]+) tok/s", line):
            put(out, "CLI", load, "output_tok_s", None, m.group(1))
        elif line.strip().startswith("metric "):
            stats = line.split()[1:]
        elif load and stats and line.startswith("  ") and len(vals := line[20:].split()) == len(stats):
            metric = metric_of(line[:20])  # the metric's name, padded to 18 after two spaces; the header names stats
            if metric is not None:
                for stat, val in zip(stats, vals, strict=True):
                    put(out, "CLI", load, metric, stat, val)
    return out


def report_figures(md: str) -> dict[Figure, str]:
    """The report's results table: `TTFT ms p50 / p90 / p99` columns hold `a / b / c`."""
    out: dict[Figure, str] = {}
    head: list[str] = []
    for line in md.splitlines():
        if not line.startswith("|"):
            head = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "load":
            head = cells
            continue
        if not head or set(cells[0]) <= {"-", ":", " "}:
            continue
        for name, text in zip(head, cells, strict=True):
            fig = name_to_figure(name)
            if fig is None:
                continue
            metric, stats = fig
            vals = [v.strip() for v in text.split(" / ")]
            assert len(vals) == len(stats), (name, text)
            for stat, val in zip(stats, vals, strict=True):
                put(out, "report", cells[0], metric, stat, val)
    return out


async def app_figures(sessions: Path) -> dict[Figure, str]:
    """The app's cell table on the session's screen (F4, enter), wide enough (320 columns) to show every column."""
    app = make_app(sessions_dir=str(sessions))
    out: dict[Figure, str] = {}
    async with app.run_test(size=(320, 50)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen), app.screen
        table = app.screen.query_one(CellTable)
        await pilot.pause()
        names = [str(c.label) for c in table.ordered_columns]
        assert "load" in names and len(names) >= 11, names  # every column shown at this width
        for i in range(table.row_count):
            row = dict(zip(names, (str(v) for v in table.get_row_at(i)), strict=True))
            for name, text in row.items():
                fig = name_to_figure(name)
                if fig is not None:
                    (stat,) = fig[1]
                    put(out, "app", row["load"], fig[0], stat, text)
    return out


def agrees(shown: str, truth: float | None) -> bool:
    """`shown` is `truth` written to the precision shown (half a unit of its last digit)."""
    m = NUM.match(shown)
    if truth is None or m is None:
        return shown == "-" and truth is None
    places = len(m.group(1) or "")
    return abs(float(shown.replace(",", "")) - truth) <= 0.5 * 10 ** -places + 1e-9 * abs(truth)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A two-cell sweep on the simulator: its sessions folder, the CLI's output, the report's Markdown."""
    d = tmp_path_factory.mktemp("agree")
    (d / "short.toml").write_text(WORKLOAD)
    env = {**os.environ, "SERVESCOPE_HOME": str(d / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    sessions = d / "home" / "sessions"
    run = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-w", str(d / "short.toml"),
                          "-c", "1,2", "-n", "8", "--save", str(sessions / "20261206-120000-short")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=d)
    assert run.returncode == 0, run.stderr[-3000:]
    rep = subprocess.run([sys.executable, "-m", "servescope", "report", str(sessions / "20261206-120000-short")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=d)
    assert rep.returncode == 0, rep.stderr[-3000:]
    return sessions, run.stdout, rep.stdout


async def test_cli_report_and_app_show_the_same_figures(sweep: tuple[Path, str, str]) -> None:
    sessions, cli_out, md = sweep
    session = load_session(sessions / "20261206-120000-short")
    truth: dict[str, CellResult] = {}
    for label, s in zip(session.cells["load_label"].to_list(), session.summaries(), strict=True):
        assert s is not None, label
        truth[str(label)] = s
    assert sorted(truth) == sorted(LOADS)
    surfaces = {"CLI": cli_figures(cli_out), "report": report_figures(md), "app": await app_figures(sessions)}
    for where, figs in surfaces.items():
        assert {load for load, _, _ in figs} == set(LOADS), (where, sorted(figs))
        # what each surface must show of every cell
        need = {"ttft_ms", "tpot_ms", "e2e_ms", "per_user_tok_s", "output_tok_s"}
        assert need <= {metric for _, metric, _ in figs}, (where, sorted(figs))
        for (load, metric, stat), shown in figs.items():
            value = truth[load].value(f"{metric}.{stat}" if stat is not None else metric)
            assert agrees(shown, value), (f"{where} shows {metric} {stat or ''} of {load} as {shown}; the session "
                                          f"holds {value}")
    # the same figure (metric and statistic) on two surfaces: the same number, to the coarser precision
    common = set(surfaces["app"]) & set(surfaces["CLI"]) & set(surfaces["report"])
    assert {(m, s) for _, m, s in common} >= {("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"),
                                             ("e2e_ms", "p50"), ("per_user_tok_s", "mean"), ("output_tok_s", None)}


def test_a_figure_without_its_statistic_is_caught() -> None:
    """The check above can fail: a per-user column that does not say mean or p50 is refused by name."""
    with pytest.raises(AssertionError, match="without naming its statistic"):
        name_to_figure("per-user tok/s")
    assert name_to_figure("per-user tok/s (mean)") == ("per_user_tok_s", ["mean"])
    assert name_to_figure("TTFT ms p50 / p90 / p99") == ("ttft_ms", ["p50", "p90", "p99"])
    assert not agrees("228.3", 227.40)  # a p50 shown where the mean is claimed
