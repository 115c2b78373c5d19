"""The tune section of a report: a `kind = "tune"` session's [tune] table (written by servescope tune:
servescope.engine.tunerun.tune_table) as document blocks: the recommendation, the runner-up and why it lost, the cost of
the search and its path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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
from servescope.sessions.tunes import is_partial

TUNE_TITLE = "Tune: the best server setting"  # the section's heading
TUNE_FIGURE_KEY = "(tune search)"  # the tune figure's FigureSpec.workload: the section it belongs in


def _f(v: object) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


fmt_value = _f  # a tune figure's value as the section's tables print it (3 significant digits)


def _relaunches(n: object) -> str:
    """`1 relaunch`, `2 relaunches`."""
    return f"{n} relaunch{'' if n == 1 else 'es'}"


def step_value(st: Mapping[str, object]) -> str:
    """A path row's value as the tables print it: `skipped` for a cell the user skipped (it has none)."""
    return "skipped" if st.get("skipped") else _f(st.get("objective"))


def tune_blocks(table: object, level: int, figures: Sequence[str] = ()) -> list[Block]:
    """The tune section, or [] when the table is missing (a search that did not finish); `figures` (the keys of
    the search's figures) follow its answer, before the search path."""
    if not isinstance(table, Mapping):
        return []
    unit = str(table.get("unit", ""))
    objective = str(table.get("objective", ""))
    if is_partial(table):  # written while the search ran: what it measured before it ended
        out: list[Block] = [heading(level, TUNE_TITLE), bullets([progress_lines(table, "interrupted")[0]])]
        return out + [Figure(k) for k in figures] + _path_blocks(table, level, unit, objective)
    what = ("goodput: requests/s meeting every SLO" if objective == "goodput" else
            "capacity: the most concurrent users whose cell meets the SLOs (90% of requests within them)")
    out = [heading(level, TUNE_TITLE), para(f"Objective: {what}.")]
    items: list[Content] = []
    best = table.get("best")
    if isinstance(best, Mapping):
        ci = best.get("ci")
        ci_text = (f" (95% interval {_f(ci[0])}-{_f(ci[1])} {unit})" if isinstance(ci, list) and len(ci) == 2
                   else "")
        items.append(content("Best: ", Code(str(best.get("server_args") or "as launched")),
                             f" at c={best.get('concurrency')}: {objective} {_f(best.get('objective'))} {unit}{ci_text}"))
        if best.get("serve"):
            items.append(content("Serve it: ", Code(str(best["serve"]))))
    else:
        items.append(content("Best: none (the search measured no cell)"))
    ru = table.get("runner_up")
    if isinstance(ru, Mapping):
        items.append(content("Runner-up: ", Code(str(ru.get("server_args") or "as launched")),
                             f": {ru.get('why', '')}"))
    items.append(content(f"Cost: {table.get('cells_measured')} cells measured of {table.get('grid_cells')} in the grid "
                         f"(budget {table.get('budget')}), {_relaunches(table.get('relaunches'))}, "
                         f"{_f(table.get('seconds'))} s; confirmed: {'yes' if table.get('confirmed') else 'no'}; "
                         f"stopped: {table.get('stop')}"))
    out.append(bullets(items))
    return out + [Figure(k) for k in figures] + _path_blocks(table, level, unit, objective)


def _path_blocks(table: Mapping[str, object], level: int, unit: str, objective: str) -> list[Block]:
    path = table.get("path")
    if not isinstance(path, list) or not path:
        return []
    heads = [h.format(objective=objective, unit=unit) for h in PATH_HEADERS]
    columns = (right(heads[0]), Column(heads[1]), right(heads[2], "users"), right(heads[3], unit),
               Column(heads[4], unit=unit, stat="the twin's band"), Column(heads[5]))
    rows = []
    for st in path:
        if not isinstance(st, Mapping):
            continue
        band = st.get("band")
        pred = f"{_f(band[0])}-{_f(band[1])}" if isinstance(band, list) and len(band) == 2 else "-"
        rows.append(row(str(st.get("step")),
                        content(Code(str(st.get("server_args") or "as launched")),
                                " (relaunched)" if st.get("relaunch") else None),
                        str(st.get("concurrency")), Num(step_value(st)), Num(pred), str(st.get("why", ""))))
    return [heading(level + 1, "Search path"), make_table(columns, rows),
            para("Each step's cell is a session of its own under ", Code("cells/"), " in this session's directory (",
                 Code("servescope report"), " on it shows its figures). Its users started one by one, over the E2E of "
                 "one request sent alone at its setting (under ", Code("probes/"), "), not together, and sent three "
                 "requests each or more (docs/tune.md, How a cell is measured).")]


# ---- plain text: the app's session screen and the HTML report share these ---------------------------------
def tune_summary(table: object) -> list[str]:
    """The answer as plain lines (no markup): the best with its interval, the serve line, the runner-up and why
    it lost, the cost; [] when the table is missing (a search that did not finish)."""
    if not isinstance(table, Mapping) or is_partial(table):
        return []
    unit = str(table.get("unit", ""))
    objective = str(table.get("objective", ""))
    out = []
    best = table.get("best")
    if isinstance(best, Mapping):
        ci = best.get("ci")
        ci_text = (f" (95% interval {_f(ci[0])}-{_f(ci[1])} {unit})" if isinstance(ci, list) and len(ci) == 2
                   else "")
        out.append(f"best: {best.get('server_args') or 'as launched'} at c={best.get('concurrency')}: "
                   f"{objective} {_f(best.get('objective'))} {unit}{ci_text}")
        if best.get("serve"):
            out.append(f"serve it: {best['serve']}")
    else:
        out.append("best: none (the search measured no cell)")
    ru = table.get("runner_up")
    if isinstance(ru, Mapping):
        out.append(f"runner-up: {ru.get('server_args') or 'as launched'}: {ru.get('why', '')}")
    out.append(f"cells: {table.get('cells_measured')} measured of {table.get('grid_cells')} in the grid (budget "
               f"{table.get('budget')}), {_relaunches(table.get('relaunches'))}, {_f(table.get('seconds'))} s; "
               f"confirmed: {'yes' if table.get('confirmed') else 'no'}; stopped: {table.get('stop')}")
    return out




def running_of(table: object) -> Mapping[str, object] | None:
    """The cell being measured ({step, server_args, concurrency, cell}), None when none is."""
    run = table.get("running") if isinstance(table, Mapping) else None
    return run if isinstance(run, Mapping) else None


def progress_lines(table: object, status: str = "running") -> list[str]:
    """A search not finished, as plain lines: `searching: step k of budget N` (`status` running) or how far it got
    (`the search did not finish: STATUS`), and the best measured so far with its unit."""
    if not isinstance(table, Mapping):
        return []
    unit, objective = str(table.get("unit", "")), str(table.get("objective", ""))
    path = table.get("path")
    done = len(path) if isinstance(path, list) else 0
    budget, grid = table.get("budget"), table.get("grid_cells")
    run = running_of(table)
    if status == "running":
        head = (f"searching: step {run.get('step')} of budget {budget} ({grid} cells in the grid)" if run is not None
                else f"searching: {done} of budget {budget} cells measured ({grid} in the grid), choosing the next")
    else:
        head = f"the search did not finish: {status}; {done} of budget {budget} cells measured ({grid} in the grid)"
    best = table.get("best")
    if isinstance(best, Mapping):
        head += (f"; best so far: {best.get('server_args') or 'as launched'} at c={best.get('concurrency')}: "
                 f"{objective} {_f(best.get('objective'))} {unit}")
    elif not done:
        head += "; no cell measured yet"
    return [head]


PATH_HEADERS = ("step", "server args", "users", "{objective} {unit}", "predicted before {unit}", "why")


def path_rows(table: object) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The search path as plain cells: its headers (units named) and one row a measured cell, in order."""
    if not isinstance(table, Mapping):
        return (), []
    unit, objective = str(table.get("unit", "")), str(table.get("objective", ""))
    heads = tuple(h.format(objective=objective, unit=unit) for h in PATH_HEADERS)
    rows: list[tuple[str, ...]] = []
    path = table.get("path")
    for st in path if isinstance(path, list) else []:
        if not isinstance(st, Mapping):
            continue
        band = st.get("band")
        pred = f"{_f(band[0])}-{_f(band[1])}" if isinstance(band, list) and len(band) == 2 else "-"
        args = str(st.get("server_args") or "as launched") + (" (relaunched)" if st.get("relaunch") else "")
        rows.append((str(st.get("step")), args, str(st.get("concurrency")), step_value(st), pred,
                     str(st.get("why", ""))))
    return heads, rows


def is_tune_session(path: Path) -> bool:
    """Whether the session at `path` is a `servescope tune` search (`kind = "tune"` in its session.toml): cheap, no
    Parquet read; False for anything unreadable."""
    import tomllib

    try:
        return tomllib.loads((Path(path) / "session.toml").read_text(encoding="utf-8")).get("kind") == "tune"
    except (OSError, ValueError):
        return False
