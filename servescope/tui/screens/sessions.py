"""The Sessions screen: saved sessions in a table; open one to see its cells and charts; mark two or more
to compare (`c` opens the Compare screen on them).

Imported inside functions, to keep polars off the app's start-up: core.metrics, sessions.quality, reports.report,
sessions.store, sessions.views, tui.screens.whatif (benchmarks/import_cost.py; the README's Layout gives the
figures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from servescope.core.errors import ServescopeError
from servescope.core.results import CellResult, GpuWindow, TelemetryWindow
from servescope.core.slo import slo_terms
from servescope.core.textsafe import clean_text
from servescope.reports.tunereport import (
    is_tune_session,
    path_rows,
    progress_lines,
    tune_summary,
)
from servescope.sessions import series_name
from servescope.sessions.live import runner_state
from servescope.sessions.measurement import measure_lines
from servescope.sessions.meta import TuneMeta
from servescope.sessions.provenance import measured_by
from servescope.tui.screens.dialogs import AskScreen, ConfirmScreen
from servescope.tui.screens.export import ExportScreen
from servescope.tui.screens.tunelive import Attaches, CellProgress, running_line
from servescope.tui.widgets.curve import CurvePoint, ThroughputCurve
from servescope.tui.widgets.histogram import LatencyHistogram
from servescope.tui.widgets.panels import (
    CELL_COLS,
    CELL_COLS_MULTI,
    CellTable,
    ServerPanel,
    TelemetryPanel,
    budget_line,
    budget_short_forms,
    fnum,
    gpu_cell_line,
    short_path,
)
from servescope.tui.widgets.quality import QualityFigures, QualityPanel, QualityView, quality_view
from servescope.tui.widgets.serving import serving_lines
from servescope.tui.widgets.table import Col, FitTable
from servescope.tui.widgets.turns import TurnChart, summary_turn_rows
from servescope.tui.widgets.zoom import zoomed_elsewhere

# per-cell telemetry rows of a saved session: (label, key in the cell's `telemetry` summary, scale, format)
STORED_ROWS = (("KV peak", "kv_cache_usage_peak", 100.0, "{:.1f}%"), ("running max", "running_max", 1.0, "{:.0f}"),
               ("waiting max", "waiting_max", 1.0, "{:.0f}"), ("preemptions", "preemptions", 1.0, "{:.0f}"))


def stored_series(tele: Sequence[TelemetryWindow | None],
                  at: int = -1) -> tuple[tuple[str, str, tuple[float | None, ...]], ...]:
    """One point per finished cell from the stored `telemetry` summaries (None: a cell without one); the value
    shown is the `at`-th cell's (the highlighted one; -1, the last)."""
    rows = []
    for label, key, scale, fmt in STORED_ROWS:
        vals = [float(v) * scale if t is not None and (v := t.value(key)) is not None else None for t in tele]
        if any(v is not None for v in vals):
            shown = vals[at] if -len(vals) <= at < len(vals) else None
            rows.append((label, fmt.format(shown) if shown is not None else "-", tuple(vals)))
    return tuple(rows)

SESSION_COLUMNS = (
    Col("mark", "✓", 0), Col("date", "date", 1), Col("name", "name", 2, min_width=8, max_width=32),
    Col("status", "status", 3), Col("target", "target", 4, min_width=10, max_width=48),
    Col("model", "model", 5, min_width=8, max_width=32), Col("cells", "cells", 6, right=True),
    Col("tags", "tags", 7, min_width=8, max_width=48), Col("workloads", "workloads", 8, min_width=8, max_width=40),
)
# A saved session's cells pane: widgets/panels.py's CELL_COLS, or CELL_COLS_MULTI when the session has several
# workloads (its workload right after its output tok/s: `c=1` alone is then ambiguous).
TRASH = ".trash"  # deleted sessions are moved here, inside the sessions folder (not listed)


def session_row(path: Path) -> tuple[str, ...]:
    """One table row from session.toml alone (cheap: no Parquet is read): mark, date (MM-DD HH:MM; the
    detail line under the table has the year), name, status, target, model, cells done/planned, tags,
    workloads."""
    from servescope.sessions.store import load_session
    from servescope.sessions.views import cell_counts

    s = load_session(path)
    info = s.info
    src = measured_by(info)  # an imported session's target is its tool: the server it measured is not known
    started = (info.started_at or "")[5:16].replace("T", " ")
    model = clean_text(info.model).rstrip("/").split("/")[-1]
    tags = ",".join(f"{k}={v}" for k, v in info.tags.items())
    wls = sorted({str(w.get("name", "?")).split("/")[0] for w in info.workloads})
    done, planned = cell_counts(s)  # completed of planned (a tune: measured of its budget), as `servescope sessions`
    target = f"imported from {src.tool_name}" if src.imported else info.target.url
    return ("", started, clean_text(info.name if info.name is not None else path.name), s.status,
            clean_text(target), model, f"{done}/{planned}", clean_text(tags), ",".join(wls))


def sessions_folder(sessions_dir: Path | None) -> Path:
    """Where the sessions are: the folder given, else $SERVESCOPE_HOME/sessions or the user data dir."""
    from servescope.sessions.store import sessions_home

    return sessions_dir or sessions_home()


def series_of(row: Mapping[str, object]) -> str:
    """A cell row's workload, with its server variant in a server-config sweep (one curve per series)."""
    return series_name(str(row.get("workload")), clean_text(str(row.get("server_variant") or "")))


ENGINE_NAMES = {"vllm": "vLLM", "llamacpp": "llama.cpp", "openai": "OpenAI-compatible server"}


class SessionsScreen(Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open", priority=False),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("slash", "filter", "Filter"),
        # rarer keys: F1 lists them, the footer keeps room for the app's keys at 80 columns
        Binding("a", "attach", "Attach", show=False),
        Binding("d", "delete", "Delete", show=False),
        Binding("n", "rename", "Rename", show=False),
        Binding("r", "refresh", "Refresh", show=False),
    ]

    def __init__(self, sessions_dir: Path | None = None) -> None:
        super().__init__()
        self.sessions_dir = sessions_dir
        self.paths: list[Path] = []
        self.marked: set[str] = set()
        self.rows: dict[str, tuple[str, ...]] = {}

    @property
    def base(self) -> Path:
        return sessions_folder(self.sessions_dir)

    @property
    def table(self) -> FitTable:
        return self.query_one("#sessions", FitTable)

    def compose(self) -> ComposeResult:
        yield Static("", id="sessions-title", classes="pane-title", markup=False)
        yield Input(placeholder="filter: any text of a row (enter keeps it, esc clears)", id="sessions-filter")
        yield FitTable(id="sessions")
        yield Static("", id="session-detail", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.table.set_columns(SESSION_COLUMNS)
        self.action_refresh()
        self.table.focus()

    def on_screen_resume(self) -> None:
        self.action_refresh()

    def action_refresh(self) -> None:
        t = self.table
        base = self.base
        dirs = sorted((p for p in base.glob("*") if (p / "session.toml").is_file()), reverse=True) if base.is_dir() else []
        self.paths = []
        self.rows = {}
        for d in dirs:
            try:
                r = session_row(d)
            except (ServescopeError, OSError, ValueError) as e:  # damaged: `broken: <file>: why` (store.load_session)
                r = ("", "?", d.name, "broken", "broken: " + clean_text(str(e)).replace(f"{d}/", ""), "", "", "", "")
            self.paths.append(d)
            self.rows[str(d)] = r
        t.set_rows({k: ["✓" if k in self.marked else "", *r[1:]] for k, r in self.rows.items()})
        shown = len(t.ordered_keys())
        where = short_path(base)
        self.query_one("#sessions-title", Static).update(
            (f"{len(dirs)} saved session{'s' if len(dirs) != 1 else ''} in {where}"
             + (f", {shown} match “{t.row_filter}”" if t.row_filter else "")) if dirs else
            f"No saved sessions in {where} yet: run a sweep (F2, ctrl+r).")
        self._detail()

    def _current(self) -> Path | None:
        key = self.table.current_key
        return Path(key) if key is not None else None

    @on(DataTable.RowHighlighted, "#sessions")
    def _highlighted(self) -> None:
        self._detail()

    def _detail(self) -> None:
        """Under the table: the highlighted session in full (what the columns had no room for)."""
        p = self._current()
        det = self.query_one("#session-detail", Static)
        if p is None or str(p) not in self.rows:
            det.update("")
            return
        _, date, name, status, target, model, cells, tags, wls = self.rows[str(p)]
        det.update(f"{p.name}: {status}, {cells} cells completed, target {target}, model {model or '?'}"
                   + (f", tags {tags}" if tags else "") + (f", workloads {wls}" if wls else ""))

    def action_mark(self) -> None:
        p = self._current()
        if p is None:
            return
        key = str(p)
        if key in self.marked:
            self.marked.discard(key)
        else:
            self.marked.add(key)
        self.table.data[key][0] = "✓" if key in self.marked else ""
        self.table.update_cell(key, "mark", Text("✓" if key in self.marked else ""))

    # ---- filter ---------------------------------------------------------------------------------
    def action_filter(self) -> None:
        f = self.query_one("#sessions-filter", Input)
        f.add_class("-visible")
        f.focus()

    @on(Input.Changed, "#sessions-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.table.set_filter(event.value)
        self.action_refresh()

    @on(Input.Submitted, "#sessions-filter")
    def _filter_done(self) -> None:
        f = self.query_one("#sessions-filter", Input)
        if not f.value:
            f.remove_class("-visible")
        self.table.focus()

    def on_key(self, event: events.Key) -> None:
        f = self.query_one("#sessions-filter", Input)
        if event.key == "escape" and f.has_focus:
            f.value = ""
            f.remove_class("-visible")
            self.table.focus()
            event.stop()

    # ---- delete / rename --------------------------------------------------------------------------
    def action_delete(self) -> None:
        p = self._current()
        if p is None:
            self.notify("no session to delete", severity="warning", markup=False)
            return
        if self._sweep_running(p):
            what = ("its search is running: stop `servescope tune` (Ctrl-C where it runs) first" if is_tune_session(p)
                    else "attach (a) and stop it (x) first")
            self.notify(f"{p.name} is running: {what}", severity="warning", markup=False)
            return
        trash = self.base / TRASH

        def done(yes: bool | None) -> None:
            if not yes:
                return
            import shutil

            try:
                trash.mkdir(parents=True, exist_ok=True)
                dest = trash / p.name
                n = 1
                while dest.exists():
                    dest, n = trash / f"{p.name}-{n}", n + 1
                shutil.move(str(p), str(dest))
            except OSError as e:
                self.notify(f"cannot move {p.name} to the trash: {e.strerror or e}", severity="error", markup=False)
                return
            self.marked.discard(str(p))
            self.notify(f"moved {p.name} to {short_path(trash)}", markup=False)
            self.action_refresh()

        self.app.push_screen(ConfirmScreen(f"Delete session {p.name}?",
                                           f"It is moved to {short_path(trash)} (delete that folder to free "
                                           "the space)."), done)

    def action_rename(self) -> None:
        p = self._current()
        if p is None or str(p) not in self.rows:
            self.notify("no session to rename", severity="warning", markup=False)
            return

        def done(name: str | None) -> None:
            if name is None or not name.strip():
                return
            from servescope.sessions.store import SessionWriter

            try:
                w = SessionWriter.open(p)
                sweep = w.meta.sweep
                w.update(name=name.strip(), sweep={**sweep, "name": name.strip()} if sweep is not None else None)
            except (ServescopeError, OSError) as e:
                self.notify(f"cannot rename: {getattr(e, 'message', None) or e}", severity="error", markup=False)
                return
            self.notify(f"renamed {p.name} to “{name.strip()}” (the folder keeps its name)", markup=False)
            self.action_refresh()

        self.app.push_screen(AskScreen(f"Rename session {p.name}", self.rows[str(p)][2]), done)

    @on(DataTable.RowSelected, "#sessions")
    def _selected(self) -> None:
        self.action_open()

    def action_open(self) -> None:
        p = self._current()
        if p is None:
            self.notify("no session to open", severity="warning", markup=False)
            return
        try:
            scr = SessionScreen(p)
        except ServescopeError as e:
            self.notify(e.message, severity="error", markup=False)
            return
        self.app.push_screen(scr)

    @staticmethod
    def _sweep_running(p: Path) -> bool:
        return runner_state(p).running

    def action_attach(self) -> None:
        """Open the Run screen on the selected session's running sweep."""
        p = self._current()
        if p is None or not self._sweep_running(p):
            self.notify("a is for a running sweep: this session is not running (enter opens it)", severity="warning",
                        markup=False)
            return
        self.app.attach(p)  # type: ignore[attr-defined]

    def action_compare(self) -> None:
        paths = sorted(self.marked)
        if len(paths) < 2:
            self.notify("mark two or more sessions with space, then press c", severity="warning", markup=False)
            return
        self.app.compare_sessions([Path(p) for p in paths])  # type: ignore[attr-defined]


class SessionScreen(Screen[None]):
    """One saved session: its cells, the throughput curve and the selected cell's histograms; its quality results
    (quality.json, the cells' quality under load) behind `q`. A quality probe session (no cells) shows its quality
    alone; a tune session its answer (best, runner-up, cost) and the path of its search, followed live while the
    tune runs (session.toml re-read when it changes; `a` opens the cell being measured on the Run screen)."""

    TUNE_POLL_S = 1.0  # how often a live tune's session.toml mtime (and its running cell's event log) is checked

    DEFAULT_CSS = """
    #tune-summary { height: auto; max-height: 8; padding: 0 1; }
    #tune-running { height: auto; max-height: 2; padding: 0 1; color: $warning; }
    #tune-path { height: 1fr; border: round $primary-darken-1; }
    """

    # short words ("Back", "Panel"): the footer has room for the keys and the app's F1-F3 at 80 columns (F1 says
    # what each does in full: a binding's tooltip)
    BINDINGS = [Binding("escape,b", "back", "Back"), Binding("e", "export", "Export"),
                Binding("t", "toggle_server", "Panel", tooltip="Telemetry/cells panel"),
                Binding("q", "toggle_quality", "Quality", tooltip="Quality/cells"),
                Binding("w", "whatif", "What if"),
                Binding("h", "open_report", "Report", tooltip="Write report.html (figures inline) and report.md into "
                        "the session's folder and show their paths"),
                Binding("a", "attach_cell", "Attach cell", tooltip="A running tune: open the cell it measures now on "
                        "the Run screen (F4 comes back)"),
                Binding("ctrl+q", "app.quit", "Quit", show=False)]  # left out of this footer only (F1 lists it)

    def __init__(self, path: Path) -> None:
        super().__init__()
        from servescope.sessions.store import load_session

        self.session = load_session(path)
        self._load_session = load_session  # a live tune's session.toml is read again as it changes (_reload)
        self.info = self.session.info
        self.summaries: dict[int, CellResult] = {}
        cells = self.session.cells
        if cells.height and "summary_json" in cells.columns:
            for idx, s in zip(cells["index"].to_list(), self.session.summaries(), strict=True):
                if s is not None:
                    self.summaries[int(idx)] = s
        # a probe session (`servescope quality`): its quality is all it has; a sweep may hold quality beside its cells
        self.probe_only = self.info.kind == "quality" and not cells.height
        # a tune session (`servescope tune`): its answer and search path; its cells are sessions of their own
        self.tune: TuneMeta | None = self.info.tune if self.info.kind == "tune" else None
        self.tune_live = self.info.kind == "tune" and self.session.status == "running"  # its runner holds the lock
        self._tune_mtime = self._mtime()
        self._progress: CellProgress | None = None
        self._dead = ""  # why a tune that said running is not (its runner is gone)
        if self.info.kind == "tune" and not self.tune_live and self.info.status == "running":
            self._dead = runner_state(path).reason or "it ended without finishing"
        self.quality: QualityView | None = None
        if self.probe_only or self.session.has_quality or any(s.quality for s in self.summaries.values()):
            self.quality = quality_view(self.session)
            # the footer has no room for `h Report` beside `q Quality` and the app's F1-F3 at 80 columns: the key
            # works and F1 lists it
            keys = self._bindings.key_to_bindings
            keys["h"] = [replace(b, show=False) for b in keys.get("h", [])]

    def _quality_head(self) -> str:
        """What the head says of the session's quality: `quality probe: ppl 6.30, 4 tasks 96%, KL 0.012`."""
        from servescope.sessions.quality import quality_brief

        q = self.quality
        if q is None:
            return ""
        if q.error:
            brief = "quality.json damaged"
        else:
            try:
                res = self.session.quality()
            except ServescopeError:
                res = None
            brief = quality_brief(res) if res is not None else "under load"
        return f"  quality probe: {brief}" if self.probe_only else f"  +quality (q): {brief}"

    def _head_text(self) -> str:
        info = self.info
        tgt = info.target
        tags = ", ".join(f"{k}={v}" for k, v in info.tags.items())
        slos = ", ".join(slo_terms(info.slos, sep=""))
        name = info.name if info.name is not None else self.session.path.name
        return (clean_text(
            f"{name}  [{self.session.status}]  {(info.started_at or '')[:19]}") + self._quality_head()
            + "\n" + clean_text(
            f"target {tgt.url} ({ENGINE_NAMES.get(tgt.engine or 'vllm', 'OpenAI-compatible server')} {tgt.version or '?'}), "
            f"model {info.model}"
            + (f", tags {tags}" if tags else "") + (f", SLOs {slos}" if slos else "")))

    def compose(self) -> ComposeResult:
        yield Static(self._head_text(), id="session-head", markup=False)
        if self.info.kind == "tune":  # the search's answer and path (live while it runs), not an empty cells table
            yield Static("", id="tune-summary", markup=False)
            yield Static("", id="tune-running", markup=False)
            yield DataTable(id="tune-path", cursor_type="row", zebra_stripes=True)
            yield Footer(compact=True)
            return
        if self.probe_only:  # no cells: no cells table, curve or histograms that could only be empty
            yield QualityPanel(self.quality, id="session-quality")
            yield Footer(compact=True)
            return
        with Horizontal(id="session-top"):
            yield CellTable(id="session-cells")
            with Vertical(id="session-right"):
                yield ThroughputCurve(id="session-curve")
                yield TelemetryPanel(id="session-live")
                yield ServerPanel(id="session-server")
        with Horizontal(id="session-hists"):
            yield LatencyHistogram("TTFT", id="s-hist-ttft")
            yield LatencyHistogram("TPOT", id="s-hist-tpot")
            yield LatencyHistogram("E2E", id="s-hist-e2e")
            yield TurnChart("TTFT ms by turn: p50", saved=True, id="s-turns")
        if self.quality is not None:
            yield QualityPanel(self.quality, id="session-quality")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self.info.kind == "tune":
            self._show_tune()
            return
        if self.probe_only:
            self.query_one(QualityFigures).focus()
            return
        if self.quality is not None:
            self.query_one(QualityPanel).display = False
        table = self.query_one(CellTable)
        table.border_title = "cells (arrows: a cell's charts)"
        cells = self.session.cells
        rows = cells.sort("index").to_dicts() if cells.height else []
        several = len({series_of(r) for r in rows}) > 1
        table.set_columns(CELL_COLS_MULTI if several else CELL_COLS)
        for r in rows:
            table.set_cell(int(r["index"]), series_of(r), str(r.get("load_label")), str(r.get("status")),
                           self.summaries.get(int(r["index"])))
        if any(s.client_bound for s in self.summaries.values()):
            table.border_title = "cells (bound: client-limited)"
        self._rows = rows
        ordered = sorted(self.summaries.items())
        # the cells with a stored /metrics window, in cell order: the panels' sparklines run over them, and their
        # value column shows the highlighted cell's (show_cell)
        self._server_cells = [i for i, s in ordered if s.server is not None]
        self._tele_cells = [i for i, s in ordered if s.telemetry is not None]
        servers = [s.server for _, s in ordered if s.server is not None]
        sp = self.query_one(ServerPanel)
        sp.metrics_available = bool(self.info.target.metrics)
        sp.client_ttft = tuple(s.ttft_ms.mean for _, s in ordered if s.server is not None)
        sp.cells = tuple(servers)
        tele = [s.telemetry for _, s in ordered if s.telemetry is not None]
        live = self.query_one(TelemetryPanel)
        live.title = "server per cell (/metrics)"
        live.series = stored_series(tele)
        has_tele = bool(tele) or bool(self.info.kv_budget) or bool(self.info.gpu)
        has_tele = has_tele or any(serving_lines(s) for s in self.summaries.values())  # their lines are there
        if not tele:
            live.note = "no /metrics telemetry in this session"
        live.display, sp.display = has_tele, not has_tele
        self.query_one("#s-turns", TurnChart).display = False
        self._say_why_empty(bool(rows), bool(servers))
        if rows:
            self.show_cell(0)

    def _show_tune(self) -> None:
        """The answer (or, while the tune runs, how far it got) above the search path, one row a measured cell in
        order (`servescope report` has the same table); a live tune is followed (`_poll_tune`)."""
        table = self.query_one("#tune-path", DataTable)
        table.border_title = "search path: each measured cell, in order"
        self._render_tune()
        table.focus()
        if self.tune_live:
            self._tune_timer = self.set_interval(self.TUNE_POLL_S, self._poll_tune)

    def _tune_lines(self) -> tuple[list[str], str]:
        """The summary's lines and the running cell's line, as the tune stands."""
        t = self.tune
        if self.tune_live:
            run = t.running if t is not None else None
            if run is not None and (self._progress is None or self._progress.dir != self.session.path / run.cell):
                if self._progress is not None:
                    self._progress.close()
                self._progress = CellProgress(self.session.path / run.cell)
            if run is not None and self._progress is not None:
                self._progress.poll()
            lines = progress_lines(t, "running") or ["searching: the first cell is starting"]
            return lines, running_line(run, self._progress) if run is not None else ""
        if t is not None and not t.partial:
            return tune_summary(t), ""
        if self._dead:
            return (progress_lines(t, self._dead) if t is not None else
                    [f"no tune result: the search did not finish: {self._dead}"]), ""
        status = f"session {self.session.status}"
        return (progress_lines(t, status) if t is not None else
                [f"no tune result: the search did not finish ({status})"]), ""

    def _render_tune(self) -> None:
        lines, running = self._tune_lines()
        self.query_one("#session-head", Static).update(self._head_text())
        self.query_one("#tune-summary", Static).update("\n".join(clean_text(x) for x in lines))
        run = self.query_one("#tune-running", Static)
        run.update(clean_text(running))
        run.display = bool(running)
        table = self.query_one("#tune-path", DataTable)
        heads, rows = path_rows(self.tune)
        right = {0, 2, 3}
        if heads and not table.columns:
            table.add_columns(*(Text(h, justify="right") if i in right else h for i, h in enumerate(heads)))
        if not heads:
            return
        for row in rows[table.row_count:]:  # the path only grows: the rows not shown yet
            table.add_row(*(Text(clean_text(v), justify="right" if i in right else "left")
                            for i, v in enumerate(row)))
        self.refresh_bindings()

    def _mtime(self) -> float:
        try:
            return (self.session.path / "session.toml").stat().st_mtime
        except OSError:
            return 0.0

    def _reload(self) -> None:
        try:
            s = self._load_session(self.session.path)
        except (ServescopeError, OSError):  # caught mid-write elsewhere (the writes are atomic): the next tick
            return
        self.session, self.info = s, s.info
        self.tune = s.info.tune

    def _poll_tune(self) -> None:
        """A live tune, about once a second: session.toml re-read when its mtime moved, the running cell's requests
        counted from its event log; once the runner is gone, the final answer (or why there is none)."""
        mtime = self._mtime()
        changed = mtime != self._tune_mtime
        if changed:
            self._tune_mtime = mtime
            self._reload()
        if self.info.status == "running":
            state = runner_state(self.session.path)
            if not state.running:  # gone without finishing (kill -9): the file says running, nobody writes it
                self._reload()  # the last write may have landed between the two reads
                if self.info.status == "running":
                    self._dead = state.reason or "it ended without finishing"
                self._end_live()
        else:
            self._end_live()
        self._render_tune()

    def _end_live(self) -> None:
        self.tune_live = False
        if (timer := getattr(self, "_tune_timer", None)) is not None:
            timer.stop()
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def on_unmount(self) -> None:
        if self._progress is not None:
            self._progress.close()

    def action_attach_cell(self) -> None:
        """A running tune: open the cell it measures now on the Run screen (the app's attach)."""
        run = self.tune.running if self.tune_live and self.tune is not None else None
        if run is None:
            self.notify("no cell is being measured now", severity="warning", markup=False)
            return
        cell = self.session.path / run.cell
        if not runner_state(cell).running:
            self.notify(f"{cell.name} is starting or saving: press a again in a moment", severity="warning",
                        markup=False)
            return
        if isinstance(self.app, Attaches):
            self.app.attach(cell)

    def _say_why_empty(self, has_cells: bool, has_servers: bool) -> None:
        """A saved session is not updated on this screen: its empty charts say why they are empty, never
        `waiting for…`."""
        running = self.session.status == "running"
        if not has_cells:
            why = ("no cells: a quality probe session" if self.info.kind == "quality" else
                   "no finished cell yet: the sweep is running (F4, a attaches)" if running else
                   f"no cells (session {self.session.status})")
        else:
            why = "no completed cell of this workload"
        self.query_one(ThroughputCurve).empty = why
        for h in self.query(LatencyHistogram):
            h.empty = "no cells" if not has_cells else "no successful request in this cell"
        self.query_one(ServerPanel).empty = (why if not has_cells else
                                             "no /metrics window was stored with these cells" if not has_servers
                                             else "")

    @on(DataTable.RowHighlighted, "#session-cells")
    def _highlight(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        rows = getattr(self, "_rows", [])
        pos = next((i for i, r in enumerate(rows) if str(int(r["index"])) == key), None)
        if pos is not None:  # the table may be sorted: find the cell by its key
            self.show_cell(pos)

    def show_cell(self, row: int) -> None:
        """Show the `row`-th cell (in cell order) in the charts and panels."""
        from servescope.core.metrics import meets_slos, per_request

        if not getattr(self, "_rows", None) or row >= len(self._rows):
            return
        r = self._rows[row]
        idx, wl = int(r["index"]), series_of(r)
        slos = bool(self.info.slos)
        pts = []
        for rr in self._rows:
            s = self.summaries.get(int(rr["index"]))
            if series_of(rr) != wl or not s or (rr.get("status") or "done") != "done":  # completed cells only
                continue
            if s.client_bound:  # the load generator, not the server, limited it: not on the curve or its knee
                continue
            x = rr.get("concurrency") if rr.get("concurrency") is not None else rr.get("rate")
            pts.append(CurvePoint(float(x or 0), str(rr.get("load_label")), float(s.output_tok_s or 0),
                                  float(s.per_user_tok_s.mean or 0),
                                  meets_slos(s) if slos else None))
        curve = self.query_one(ThroughputCurve)
        curve.title = f"{wl}: output tok/s vs load"
        curve.points = tuple(pts)
        self._show_cell_telemetry(r)
        self._show_turns(self.summaries.get(idx))
        df = self.session.requests(idx)
        vals: dict[str, tuple[float, ...]] = {"ttft_ms": (), "tpot_ms": (), "e2e_ms": ()}
        if df.height:
            # the requests the cell's figures are over (its steady window where it has one), so the histograms'
            # p50 and p99 are the table's
            kept = df.filter(df["in_window"]) if "in_window" in df.columns else df.filter(~df["warmup"])
            pr = per_request(kept)
            ok = pr.filter(pr["status"] == "ok")
            vals = {k: tuple(ok[k].drop_nulls().to_list()) for k in vals}
        self.query_one("#s-hist-ttft", LatencyHistogram).values = vals["ttft_ms"]
        self.query_one("#s-hist-tpot", LatencyHistogram).values = vals["tpot_ms"]
        self.query_one("#s-hist-e2e", LatencyHistogram).values = vals["e2e_ms"]

    def _show_turns(self, s: CellResult | None) -> None:
        """A conversation or agent cell: its per-turn figures (turn, ok, TTFT p50/p90, input tokens, cached %) in
        the TPOT and E2E histograms' place; any other cell: the histograms."""
        chart = self.query_one("#s-turns", TurnChart)
        turns = s.turns if s is not None else []
        chart.rows = summary_turn_rows(turns)
        chart.note = "(in TPOT/E2E's place)" if turns else ""
        hists = [self.query_one(hid, LatencyHistogram) for hid in ("#s-hist-tpot", "#s-hist-e2e")]
        moves = (chart if any(h.has_focus for h in hists) else None) if turns else \
            (self.query_one("#s-hist-ttft", LatencyHistogram) if chart.has_focus else None)
        for h in hists:
            h.display = not turns
        chart.display = bool(turns)
        if moves is not None:  # the focus stays on the histograms' row
            moves.focus()

    def _show_cell_telemetry(self, row: Mapping[str, object]) -> None:
        """The telemetry panels at a row of the session's cells table (cells.parquet's columns)."""
        index = row["index"]
        idx = int(index) if isinstance(index, (int, float)) else -1
        s = self.summaries.get(idx) or CellResult()
        info = self.info
        live = self.query_one(TelemetryPanel)
        gpu = s.gpu or (GpuWindow.from_dict(info.gpu) if info.gpu and not info.gpu.get("available") else None)
        lines = ([f"cell {idx + 1}: no GPU telemetry: {gpu.reason or 'NVML not available'}"]
                 if gpu is not None and not gpu.available else [f"cell {idx + 1} {gpu_cell_line(gpu)}"] if gpu else [])
        tele = s.telemetry
        if tele is not None and tele.ttft_ms_mean is not None:
            lines.append(f"cell {idx + 1} server TTFT {fnum(tele.ttft_ms_mean)} ms, ITL "
                         f"{fnum(tele.itl_ms_mean, 2)} ms; client TTFT {fnum(s.ttft_ms.mean)} ms")
        lines += [f"cell {idx + 1} {line}" for line in serving_lines(s)]  # speculation, adapters, energy...
        if idx in self.summaries:  # how it was measured: window, precision, saturation, probes
            lines += [f"cell {idx + 1} {line}" for _, line in measure_lines(s)]
        live.gpu_lines = tuple(lines)
        # the per-cell panels' value column: this cell's figures (its sparkline point among the others)
        name = f"cell {idx + 1}"
        tele_cells = getattr(self, "_tele_cells", [])
        if tele_cells:
            at = tele_cells.index(idx) if idx in tele_cells else len(tele_cells)  # past the end: "-" shown
            live.series = stored_series([self.summaries[i].telemetry for i in tele_cells], at)
            live.title = f"server per cell (/metrics): {name}" + ("" if idx in tele_cells else " (none stored)")
        sp = self.query_one(ServerPanel)
        server_cells = getattr(self, "_server_cells", [])
        if server_cells:
            sp.at = server_cells.index(idx) if idx in server_cells else len(server_cells)
            sp.at_label = name if idx in server_cells else f"{name} (none stored)"
        conc = row.get("concurrency")
        c = int(conc) if isinstance(conc, (int, float)) else None
        live.budget = budget_line(info.kv_budget, str(row.get("workload")), c)
        live.budget_short = budget_short_forms(info.kv_budget, str(row.get("workload")), c)

    def action_toggle_server(self) -> None:
        """Swap the stored telemetry panel and the per-cell /metrics panel."""
        live, cells = self.query_one(TelemetryPanel), self.query_one(ServerPanel)
        live.display, cells.display = not live.display, live.display

    @property
    def showing_quality(self) -> bool:
        return self.probe_only or (self.quality is not None and self.query_one(QualityPanel).display)

    def action_toggle_quality(self) -> None:
        """A sweep holding quality results: swap its cells, curve and histograms for them, and back."""
        if self.quality is None or self.probe_only:
            return
        panel = self.query_one(QualityPanel)
        show = not panel.display
        panel.display = show
        for wid in ("#session-top", "#session-hists"):
            self.query_one(wid).display = not show
        if show:
            focus = next((w for w in panel.query("QualityFigures, FitTable") if w.display and w.can_focus), None)
            (focus or panel).focus()
        else:
            self.query_one(CellTable).focus()
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "attach_cell":  # a running tune's cell being measured
            return self.tune_live and self.tune is not None and self.tune.running is not None
        if self.info.kind == "tune" and action in ("toggle_quality", "toggle_server", "whatif"):
            return False  # a tune session has its path here, not cells with panels a twin could be fitted to
        if action == "toggle_quality":  # only where there is quality to show beside cells
            return self.quality is not None and not self.probe_only
        if action == "toggle_server":  # panels of the cells' view, not behind another pane zoomed
            return not self.showing_quality and not zoomed_elsewhere(self, TelemetryPanel, ServerPanel)
        return True

    def action_export(self) -> None:
        from servescope.reports.report import render_report
        session = self.session

        def render() -> str:
            return render_report(session, fmt="md")

        default = session.path.parent / f"report-{session.path.name}.md"
        name = self.info.name if self.info.name is not None else session.path.name
        self.app.push_screen(ExportScreen(name, default, render),
                             self._exported)

    def _exported(self, path: Path | None) -> None:
        if path is not None:
            self.notify(f"wrote the report to {short_path(path)}", title="export", timeout=8, markup=False)

    def action_open_report(self) -> None:
        """Write report.html and report.md into the session's folder (in a thread: the figures take a few
        seconds) and say where they are; without matplotlib, report.md alone and how to get the HTML."""
        self.notify(f"writing report.html and report.md into {short_path(self.session.path)}…", title="report",
                    timeout=4, markup=False)
        self.run_worker(self._write_reports, thread=True, group="report", exclusive=True, exit_on_error=False)

    def _write_reports(self) -> None:
        from servescope.reports.htmlreport import write_report_files

        try:
            html, md, note = write_report_files(self.session)
        except (ServescopeError, OSError) as e:
            msg = getattr(e, "message", None) or str(e)
            self.app.call_from_thread(self.notify, f"cannot write the report: {clean_text(msg)}", title="report",
                                      severity="error", timeout=10, markup=False)
            return
        lines = ([f"report.html: {short_path(html)}"] if html else []) + [f"report.md: {short_path(md)}"]
        if note:
            lines.append(f"no report.html: {note}")
        self.app.call_from_thread(self.notify, "\n".join(lines), title="report (open the HTML in any browser)",
                                  severity="information" if html else "warning", timeout=15, markup=False)

    def action_whatif(self) -> None:
        """The what-if pane: the capacity twin fitted to this session predicts cells that were not run."""
        from servescope.tui.screens.whatif import WhatIfScreen

        self.app.push_screen(WhatIfScreen(self.session))

    def action_back(self) -> None:
        self.app.pop_screen()
