"""The Compose screen's Quality pane (F9), its standalone probe: a quality probe of the Target pane's server
alone, under no load. Its fields (tasks, contexts, questions, reference) are checked next to them as they
change; the button (or enter in a field) starts the probe in a thread worker (servescope.tui.qualityworker)
and a second press stops it; its progress lines, then its result (perplexity, one row per task, divergence
from the reference, where it was saved) are shown below. The sweep's quality share above it is a sweep field,
wired by the Compose screen."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Static

from servescope.tui.qualityworker import (
    ACCURACY_HOW,
    QualityFinished,
    QualityProbe,
    QualityProgress,
    check_field,
    divergence_line,
    perplexity_line,
    probe_spec,
    task_rows,
)
from servescope.tui.screens.workloadform import field_row, show_field_error
from servescope.tui.sweepworker import SimPool
from servescope.tui.widgets.panels import short_path
from servescope.tui.widgets.table import Col, FitTable

__all__ = ["QUALITY_FIELDS", "QualityProbePane", "Target"]


class Host(Protocol):
    """What the pane asks of the app it runs in (servescope.tui.app.ServescopeApp, which imports this module)."""

    @property
    def sessions_dir(self) -> Path | None: ...

    @property
    def sweep_running(self) -> bool: ...

    @property
    def sims(self) -> SimPool: ...

QUALITY_FIELDS = ("q-tasks", "q-contexts", "q-n", "q-reference")  # the standalone probe's (not the sweep's)
QUALITY_LOG_LINES = 8  # progress lines kept on screen
QUALITY_COLS = [Col("task", "task", 0, 8, 24), Col("accuracy", "accuracy", 1, right=True),
                Col("n", "n (questions)", 2, right=True), Col("interval", "95% interval (Wilson)", 3, right=True)]

# the server to probe, from the Target pane: (URL, API-key variable, model or None), or why not (a status line;
# the Target pane's fields already marked)
Target = Callable[[], tuple[str, str, str | None] | str]


class QualityProbePane(Vertical):
    """The probe's part of the Quality pane; `target` reads the server to probe from the Target pane."""

    DEFAULT_CSS = """
    QualityProbePane { height: auto; }
    """

    def __init__(self, target: Target, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.quality: QualityProbe | None = None  # the quality probe running (or last run)
        self.quality_log: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static("Probe quality now: the Target pane's server alone, under no load",
                     classes="pane-title q-title", markup=False)
        yield field_row("tasks", "q-tasks", "arithmetic,retrieval,needle,json", "arithmetic,retrieval,needle,json")
        yield field_row("contexts", "q-contexts", "1024", "retrieval/needle prompt tokens, e.g. 1024,8k")
        yield field_row("questions", "q-n", "20", "per task and context length")
        yield field_row("reference", "q-reference", "", "optional: a quality session (directory or id)")
        with Horizontal(classes="buttons"):
            yield Button("Probe quality", id="q-probe", variant="primary")
        yield Static("Not probed yet: exact-answer tasks, perplexity and greedy traces (for divergence).",
                     id="q-status", markup=False)
        yield Static("", id="q-ppl", classes="q-result", markup=False)
        yield FitTable(id="q-table", classes="q-result")
        yield Static("", id="q-how", classes="q-result hint", markup=False)
        yield Static("", id="q-div", classes="q-result", markup=False)
        yield Static("", id="q-saved", classes="q-result", markup=False)
        yield Static("", id="q-log", classes="hint", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#q-table", FitTable)
        table.set_columns(QUALITY_COLS)
        table.border_title = "tasks"
        self._show_result(False)

    def on_unmount(self) -> None:
        if self.quality is not None:
            self.quality.cancel()

    @property
    def servescope_app(self) -> Host:
        return cast(Host, self.app)

    @property
    def quality_running(self) -> bool:
        return self.quality is not None and not self.quality.done.is_set()

    # ---- the fields -------------------------------------------------------------------------------------
    def _val(self, fid: str) -> str:
        return self.query_one(f"#{fid}", Input).value.strip()

    def _err(self, fid: str, text: str) -> None:
        show_field_error(self, fid, text)

    def _check(self, fid: str) -> tuple[object, str]:
        return check_field(fid, self._val(fid), self.servescope_app.sessions_dir)

    @on(Input.Changed, "#q-tasks, #q-contexts, #q-n, #q-reference")
    def _changed(self, event: Input.Changed) -> None:
        fid = event.input.id or ""
        self._err(fid, self._check(fid)[1])
        event.stop()  # the probe's fields are not the sweep's: the Compose screen's preview stays

    # ---- the probe --------------------------------------------------------------------------------------
    def _show_result(self, show: bool) -> None:
        for w in self.query(".q-result"):
            w.display = show

    def _status(self, text: str) -> None:
        self.query_one("#q-status", Static).update(text)

    @on(Button.Pressed, "#q-probe")
    @on(Input.Submitted, "#q-tasks, #q-contexts, #q-n, #q-reference")
    def action_probe_quality(self) -> None:
        """Probe the quality of the Target pane's server (a second press stops a running probe)."""
        if self.quality_running:
            assert self.quality is not None
            self.quality.cancel()
            self._status("stopping…")
            return
        app = self.servescope_app
        if app.sweep_running:
            self._status("✗ a sweep is running: its server would serve the probe too. Probe after it ends, "
                         "or give the sweep a quality share")
            return
        target = self.target()
        if isinstance(target, str):
            self._status(target)
            return
        url, key_env, model = target
        bad = []
        for fid in QUALITY_FIELDS:
            ferr = self._check(fid)[1]
            self._err(fid, ferr)
            if ferr:
                bad.append(fid.removeprefix("q-"))
        if bad:
            self._status(f"✗ fix: {', '.join(bad)}")
            return
        spec = probe_spec(self._val, app.sessions_dir)
        total = len(spec.tasks) * spec.n + sum(spec.n * (len(spec.contexts) - 1)
                                               for t in spec.tasks if t in ("retrieval", "needle"))
        self._show_result(False)
        self.quality_log = []
        self.query_one("#q-log", Static).update("")
        self.query_one("#q-probe", Button).label = "Stop probe"
        self._status(f"probing {url}: about {total} questions" + (
            " (starting the simulator)…" if url.startswith("sim://") else "…"))
        self.quality = QualityProbe(self.post_message)
        self.run_worker(partial(self.quality.run, app.sims, url, key_env, model, spec, app.sessions_dir),
                        thread=True, name="quality", group="quality", exit_on_error=False)

    @on(QualityProgress)
    def _progress(self, msg: QualityProgress) -> None:
        self.quality_log = [*self.quality_log, msg.text][-QUALITY_LOG_LINES:]
        self.query_one("#q-log", Static).update("\n".join(self.quality_log))

    @on(QualityFinished)
    def _finished(self, msg: QualityFinished) -> None:
        self.query_one("#q-probe", Button).label = "Probe quality"
        took = f"{msg.seconds:.0f} s"
        if msg.run is None:
            self._status(f"✗ {msg.error} ({took})")
            if "reference" in msg.error:
                self._err("q-reference", msg.error)
            if not msg.error.startswith("stopped"):
                self.notify(msg.error, title="quality probe failed", severity="error", timeout=8, markup=False)
            return
        run, res = msg.run, msg.run.result
        self._status(f"✓ quality of {run.model.id} at {msg.url}, in {took}")
        self.query_one("#q-ppl", Static).update(perplexity_line(res))
        table = self.query_one("#q-table", FitTable)
        table.set_rows(task_rows(res))
        table.display = bool(res.tasks)
        how = self.query_one("#q-how", Static)
        how.update(ACCURACY_HOW if res.tasks else "no task was asked")
        self.query_one("#q-div", Static).update(divergence_line(res, bool(self._val("q-reference"))))
        self.query_one("#q-saved", Static).update(f"saved {short_path(run.path)} (quality.json; F4 lists it)")
        for w in self.query(".q-result"):
            if w is not table:
                w.display = True
        # once the result is laid out (the table fills its rows after its first resize), show it from the top
        self.set_timer(0.2, self._scroll_to_result)

    def _scroll_to_result(self) -> None:
        self.query_one("#q-status", Static).scroll_visible(top=True, animate=False)
