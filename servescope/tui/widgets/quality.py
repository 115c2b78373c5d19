"""A saved session's quality results in panes: the probe's figures (perplexity, divergence from the reference),
its task table, and its cells' accuracy under load.

The words and numbers are the report's: servescope.reports.quality_doc makes the rows of the Quality section (each
figure with its unit and how it was computed) and of the table of quality under load, for the report's document
and for these panes alike, so the app and `servescope report` cannot disagree and no formula or format is written
twice. Everything in them is data (model names, task names, notes): shown verbatim.

Imported inside functions, to keep polars off the app's start-up: reports.quality_doc, sessions.quality,
sessions.views (benchmarks/import_cost.py; docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from servescope.core.errors import ServescopeError
from servescope.core.quality import QualityResult
from servescope.core.textsafe import clean_text
from servescope.tui.safe import plain
from servescope.tui.widgets.panels import short_path
from servescope.tui.widgets.table import Col, FitTable
from servescope.tui.widgets.zoom import Zoomable, unzoom, zoom_to

Row = tuple[str, ...]

TASK_COLUMNS = (Col("task", "task", 0, min_width=8, max_width=32), Col("context", "context", 2),
                Col("accuracy", "accuracy", 1, right=True), Col("n", "n", 1, right=True),
                Col("interval", "95% interval (Wilson)", 1, right=True))
LOAD_COLUMNS = (Col("workload", "workload", 3, min_width=8, max_width=24), Col("load", "load", 0),
                Col("accuracy", "accuracy (correct/n)", 0, right=True), Col("interval", "95% interval", 1, right=True),
                Col("kl", "KL vs idle, mean (nats)", 2, min_width=8, max_width=36, right=True),
                Col("top1", "top-1 vs idle", 2, right=True), Col("failed", "failed probes", 4, right=True),
                Col("tasks", "per task", 5, min_width=8, max_width=60))
WIDE = 110  # from this width (or zoomed) the figures show how each was computed beside them


# ---- what the panes show ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QualityView:
    """A session's quality, as the panes show it; `error` (one line) when its quality.json cannot be read."""

    settings: str = ""  # the probe's settings in one line
    figures: tuple[tuple[str, str, str], ...] = ()  # (figure, value with its unit, how it was computed)
    tasks: tuple[Row, ...] = ()  # (task, context, accuracy, n, 95% interval)
    notes: tuple[str, ...] = ()  # what the accuracy is, no reference given, the probe's notes
    load: tuple[Row, ...] = ()  # per cell with probe requests: (workload, load, accuracy, interval, KL, top-1, ...)
    error: str = ""
    synthetic: str = ""  # the simulator answered (sim://): the line that says its figures are made up

    @property
    def has_probe(self) -> bool:
        return bool(self.figures or self.tasks)


def probe_view(session: Any, result: QualityResult) -> QualityView:
    """The probe's results (quality.json) as the report's Quality section shows them
    (reports.quality_doc.probe_table)."""
    from servescope.reports.quality_doc import probe_table

    p = probe_table(session, result)
    return QualityView(settings=p.settings, figures=p.figures, tasks=p.tasks, notes=p.notes)


def load_rows(session: Any) -> tuple[Row, ...]:
    """Each cell's accuracy under load (`--quality-share`), as the report's table of it shows it
    (reports.quality_doc.load_table), per workload: (workload, load, accuracy, interval, KL, top-1, failed,
    per task)."""
    from servescope.reports.quality_doc import load_table
    from servescope.sessions.views import cell_views

    if not session.cells.height:
        return ()
    by: dict[str, list[Any]] = {}
    for v in cell_views(session):
        by.setdefault(v.workload, []).append(v)
    out: list[Row] = []
    for workload, views in by.items():
        for load, acc, interval, per, kl, top1, failed in load_table(views):
            out.append((clean_text(workload), load, acc, interval, kl, top1, failed, per))
    return tuple(out)


def synthetic_note(url: str) -> str:
    """For a simulator target (`sim://`): the line that says its quality figures are synthetic (the report's and
    Compare's wording, servescope.sessions.quality); else ""."""
    from servescope.sessions.quality import synthetic_note as note

    text = note(url)
    return f"! {text}" if text else ""


def quality_view(session: Any) -> QualityView:
    """All the quality a session holds: its probe (quality.json) and its cells' quality under load; a damaged
    quality.json is the store's one-line message in `error` (the cells' quality is still shown). A simulator's
    (sim://) figures carry the line that says they are synthetic."""
    synthetic = synthetic_note(str(session.info.target.url or ""))
    try:
        load = load_rows(session)
    except (ServescopeError, ValueError, TypeError):  # a damaged cell summary: the cells pane says so
        load = ()
    try:
        result = session.quality()
    except ServescopeError as e:  # the path as the user would type it (the sessions list does the same)
        msg = clean_text(e.message).replace(str(session.path), short_path(session.path))
        return QualityView(error=msg, load=load, synthetic=synthetic)
    if result is None:
        return QualityView(load=load, synthetic=synthetic)
    v = probe_view(session, result)
    return QualityView(v.settings, v.figures, v.tasks, v.notes, load, synthetic=synthetic)


# ---- the panes ---------------------------------------------------------------------------------------------------
class QualityFigures(Zoomable):
    """The probe's figures, one a row: the figure and its value with its unit; how each was computed beside them
    when there is room, under each when zoomed (`z`), and otherwise only under the perplexity (cut to two lines)
    or why there is none."""

    DEFAULT_CSS = """
    QualityFigures { height: auto; }
    """
    can_focus = True  # so it can be zoomed (z)

    figures: reactive[tuple[tuple[str, str, str], ...]] = reactive(tuple, layout=True)

    def render(self) -> RenderableType:
        width = self.content_size.width or self.size.width
        wide = width >= WIDE
        room = max(10, width - max((len(f) for f, _, _ in self.figures), default=0) - 2)  # the value's column
        grid = Table.grid(padding=(0, 2), expand=wide)
        grid.add_column("figure", no_wrap=True, style="bold")
        if wide:  # the values whole (up to half the room), how they were computed in the rest
            grid.add_column("value", overflow="fold",
                            width=min(room // 2, max((len(v) for _, v, _ in self.figures), default=1)))
            grid.add_column("how", style="dim", ratio=1)
        else:
            grid.add_column("value", overflow="fold")
        for fig, value, how in self.figures:
            if wide:
                grid.add_row(Text(fig), Text(value), Text(how))
                continue
            t = Text(value)
            if value == "not measured":  # why there is none, whole
                t.append(": " + how, style="dim")
            elif self.zoomed:
                t.append("\n" + how, style="dim")
            elif fig == "perplexity":
                t.append("\n" + two_lines(how, room), style="dim")
            grid.add_row(Text(fig), t)
        return grid

    def full_text(self) -> str:
        return "\n".join(f"{f}: {v} ({h})" for f, v, h in self.figures)

    @property
    def zoomed(self) -> bool:
        return self.is_attached and self.screen.maximized in (self, self._zoom_target)

    @property
    def _zoom_target(self) -> Widget:
        """The whole quality panel zooms (it scrolls: every figure's how is longer than a screen at 80x24)."""
        return self.parent if isinstance(self.parent, QualityPanel) else self

    def action_zoom(self) -> None:
        if self.zoomed:
            unzoom(self.screen)
        else:
            zoom_to(self._zoom_target)  # the panel, focused: arrows scroll it, z or esc unzooms
        self.refresh(layout=True)  # zoomed, every figure says how it was computed

    def action_unzoom(self) -> None:
        super().action_unzoom()
        self.refresh(layout=True)


def two_lines(text: str, width: int) -> str:
    """`text` wrapped to `width`, at most two lines, the second ending in ` …` when cut (z shows it all)."""
    import textwrap

    lines = textwrap.wrap(text, width)
    if len(lines) <= 2:
        return "\n".join(lines)
    return lines[0] + "\n" + textwrap.shorten(" ".join(lines[1:]), width, placeholder=" …")


class QualityPanel(VerticalScroll, Zoomable):
    """A session's quality: the probe's settings line, its figures, its task table and notes, its cells' accuracy
    under load; or the one line that says its quality.json is damaged. Call `show(view)`. It scrolls, and zooms
    (`z`, here or on the figures) with every figure's how and the whole settings line."""

    ALLOW_MAXIMIZE = True

    DEFAULT_CSS = """
    QualityPanel { height: 1fr; padding: 0 0; }
    QualityPanel > Static { height: auto; padding: 0 1; }
    QualityPanel > FitTable { height: auto; max-height: 16; max-width: 120; }
    QualityPanel .sq-dim { color: $text-muted; }
    QualityPanel #sq-synthetic { color: $warning; text-style: bold; }
    """

    def __init__(self, view: QualityView | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view or QualityView()

    def compose(self) -> ComposeResult:
        yield Static("", id="sq-error", markup=False)
        yield Static("", id="sq-synthetic", markup=False)
        yield Static("", id="sq-settings", classes="sq-dim", markup=False)
        yield QualityFigures(id="sq-figures")
        yield FitTable(id="sq-tasks")
        yield Static("", id="sq-notes", classes="sq-dim", markup=False)
        yield FitTable(id="sq-load")

    def on_mount(self) -> None:
        tasks, load = self.query_one("#sq-tasks", FitTable), self.query_one("#sq-load", FitTable)
        tasks.set_columns(TASK_COLUMNS)
        tasks.border_title = "task accuracy"
        load.set_columns(LOAD_COLUMNS)
        load.border_title = "quality under load: probe questions in each cell's load (--quality-share)"
        self.show(self.view)

    def show(self, view: QualityView) -> None:
        self.view = view
        err = self.query_one("#sq-error", Static)
        err.update(plain(f"✗ {view.error}") if view.error else "")
        err.display = bool(view.error)
        if not view.error and not view.has_probe and not view.load:
            err.update(plain("no quality results in this session (servescope quality --save SESSION adds them)"))
            err.display = True
        synthetic = self.query_one("#sq-synthetic", Static)
        synthetic.update(plain(view.synthetic))
        synthetic.display = bool(view.synthetic) and (view.has_probe or bool(view.load))
        settings = self.query_one("#sq-settings", Static)
        settings.update(plain(f"probe settings: {view.settings}") if view.settings else "")
        settings.display = bool(view.settings)
        figs = self.query_one(QualityFigures)
        figs.figures = view.figures
        figs.display = bool(view.figures)
        tasks = self.query_one("#sq-tasks", FitTable)
        tasks.set_rows({str(i): r for i, r in enumerate(view.tasks)})
        tasks.display = bool(view.tasks)
        notes = self.query_one("#sq-notes", Static)
        notes.update(Content("\n".join(clean_text(n) for n in view.notes)))
        notes.display = bool(view.notes)
        load = self.query_one("#sq-load", FitTable)
        load.set_rows({str(i): r for i, r in enumerate(view.load)})
        load.display = bool(view.load)
