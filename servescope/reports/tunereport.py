"""The tune section of a report: a `kind = "tune"` session's [tune] table (written by servescope tune:
servescope.engine.tunerun.tune_table) as document blocks: the recommendation, the runner-up and why it lost, the cost of
the search and its path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servescope.core.errors import ServescopeError
from servescope.reports.document import (
    Block,
    Code,
    Column,
    Content,
    Figure,
    Num,
    bullets,
    content,
    heading,
    para,
    right,
    row,
)
from servescope.reports.document import table as make_table
from servescope.sessions.meta import TuneBest, TuneMeta, TuneStep, read_meta

TUNE_TITLE = "Tune: the best server setting"  # the section's heading
TUNE_FIGURE_KEY = "(tune search)"  # the tune figure's FigureSpec.workload: the section it belongs in


def _f(v: object) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


fmt_value = _f  # a tune figure's value as the section's tables print it (3 significant digits)


def _relaunches(n: int) -> str:
    """`1 relaunch`, `2 relaunches`."""
    return f"{n} relaunch{'' if n == 1 else 'es'}"


def step_value(st: TuneStep) -> str:
    """A path row's value as the tables print it: `skipped` for a cell the user skipped (it has none)."""
    return "skipped" if st.skipped else _f(st.objective)


def _ci_text(best: TuneBest, unit: str) -> str:
    return f" (95% interval {_f(best.ci[0])}-{_f(best.ci[1])} {unit})" if len(best.ci) == 2 else ""


def _band_text(st: TuneStep) -> str:
    return f"{_f(st.band[0])}-{_f(st.band[1])}" if len(st.band) == 2 else "-"


def _cost_text(t: TuneMeta, cells: str = " cells") -> str:
    return (f"{t.cells_measured}{cells} measured of {t.grid_cells} in the grid (budget {t.budget}), "
            f"{_relaunches(t.relaunches)}, {_f(t.seconds)} s; confirmed: {'yes' if t.confirmed else 'no'}; "
            f"stopped: {t.stop}")


def tune_blocks(table: TuneMeta | None, level: int, figures: Sequence[str] = ()) -> list[Block]:
    """The tune section, or [] when the table is missing (a search that did not finish); `figures` (the keys of
    the search's figures) follow its answer, before the search path."""
    if table is None:
        return []
    if table.partial:  # written while the search ran: what it measured before it ended
        out: list[Block] = [heading(level, TUNE_TITLE), bullets([progress_lines(table, "interrupted")[0]])]
        return out + [Figure(k) for k in figures] + _path_blocks(table, level)
    what = ("goodput: requests/s meeting every SLO" if table.objective == "goodput" else
            "capacity: the most concurrent users whose cell meets the SLOs (90% of requests within them)")
    out = [heading(level, TUNE_TITLE), para(f"Objective: {what}.")]
    items: list[Content] = []
    best = table.best
    if best is not None:
        items.append(content("Best: ", Code(best.server_args or "as launched"),
                             f" at c={best.concurrency}: {table.objective} {_f(best.objective)} {table.unit}"
                             f"{_ci_text(best, table.unit)}"))
        if best.serve:
            items.append(content("Serve it: ", Code(best.serve)))
    else:
        items.append(content("Best: none (the search measured no cell)"))
    ru = table.runner_up
    if ru is not None:
        items.append(content("Runner-up: ", Code(ru.server_args or "as launched"), f": {ru.why}"))
    items.append(content(f"Cost: {_cost_text(table)}"))
    out.append(bullets(items))
    return out + [Figure(k) for k in figures] + _path_blocks(table, level)


def _path_blocks(table: TuneMeta, level: int) -> list[Block]:
    if not table.path:
        return []
    heads = [h.format(objective=table.objective, unit=table.unit) for h in PATH_HEADERS]
    columns = (right(heads[0]), Column(heads[1]), right(heads[2], "users"), right(heads[3], table.unit),
               Column(heads[4], unit=table.unit, stat="the twin's band"), Column(heads[5]))
    rows = [row(str(st.step), content(Code(st.server_args or "as launched"), " (relaunched)" if st.relaunch else None),
                str(st.concurrency), Num(step_value(st)), Num(_band_text(st)), st.why)
            for st in table.path]
    return [heading(level + 1, "Search path"), make_table(columns, rows),
            para("Each step's cell is a session of its own under ", Code("cells/"), " in this session's directory (",
                 Code("servescope report"), " on it shows its figures). Its users started one by one, over the E2E of "
                 "one request sent alone at its setting (under ", Code("probes/"), "), not together, and sent three "
                 "requests each or more (docs/tune.md, How a cell is measured).")]


# ---- plain text: the app's session screen and the HTML report share these ---------------------------------
def tune_summary(table: TuneMeta | None) -> list[str]:
    """The answer as plain lines (no markup): the best with its interval, the serve line, the runner-up and why
    it lost, the cost; [] when the table is missing (a search that did not finish)."""
    if table is None or table.partial:
        return []
    out = []
    best = table.best
    if best is not None:
        out.append(f"best: {best.server_args or 'as launched'} at c={best.concurrency}: "
                   f"{table.objective} {_f(best.objective)} {table.unit}{_ci_text(best, table.unit)}")
        if best.serve:
            out.append(f"serve it: {best.serve}")
    else:
        out.append("best: none (the search measured no cell)")
    ru = table.runner_up
    if ru is not None:
        out.append(f"runner-up: {ru.server_args or 'as launched'}: {ru.why}")
    out.append(f"cells: {_cost_text(table, '')}")
    return out


def progress_lines(table: TuneMeta | None, status: str = "running") -> list[str]:
    """A search not finished, as plain lines: `searching: step k of budget N` (`status` running) or how far it got
    (`the search did not finish: STATUS`), and the best measured so far with its unit."""
    if table is None:
        return []
    done, budget, grid = len(table.path), table.budget, table.grid_cells
    run = table.running
    if status == "running":
        head = (f"searching: step {run.step} of budget {budget} ({grid} cells in the grid)" if run is not None
                else f"searching: {done} of budget {budget} cells measured ({grid} in the grid), choosing the next")
    else:
        head = f"the search did not finish: {status}; {done} of budget {budget} cells measured ({grid} in the grid)"
    best = table.best
    if best is not None:
        head += (f"; best so far: {best.server_args or 'as launched'} at c={best.concurrency}: "
                 f"{table.objective} {_f(best.objective)} {table.unit}")
    elif not done:
        head += "; no cell measured yet"
    return [head]


PATH_HEADERS = ("step", "server args", "users", "{objective} {unit}", "predicted before {unit}", "why")


def path_rows(table: TuneMeta | None) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The search path as plain cells: its headers (units named) and one row a measured cell, in order."""
    if table is None:
        return (), []
    heads = tuple(h.format(objective=table.objective, unit=table.unit) for h in PATH_HEADERS)
    rows: list[tuple[str, ...]] = [(str(st.step), (st.server_args or "as launched") + (" (relaunched)" if st.relaunch else ""),
             str(st.concurrency), step_value(st), _band_text(st), st.why) for st in table.path]
    return heads, rows


def is_tune_session(path: Path) -> bool:
    """Whether the session at `path` is a `servescope tune` search (`kind = "tune"` in its session.toml): cheap, no
    Parquet read; False for anything unreadable."""
    try:
        return read_meta(Path(path) / "session.toml").kind == "tune"
    except ServescopeError:
        return False
