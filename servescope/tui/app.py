"""The servescope terminal app: compose a sweep, watch it run, browse saved sessions.

`run_app()` is what `servescope`, `servescope tui --url URL` and `servescope demo` call; `make_app()` builds
the same app for tests and snapshot tests. A sweep runs in a runner process of its own, followed from a thread
worker (`servescope.tui.sweepworker`); its results reach the widgets as messages, a few batches per second.
`servescope attach` opens the app on a sweep already running.

The Compare screen is imported when it opens, to keep polars (sessions.compare) off the app's start-up
(benchmarks/import_cost.py; docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

from textual.binding import Binding
from textual.worker import Worker, WorkerState

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine import fields
from servescope.engine.spec import SweepSpec
from servescope.reports.tunereport import is_tune_session
from servescope.tui import messages as m
from servescope.tui.keyorder import KeysInOrderApp
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.dialogs import ChoiceScreen
from servescope.tui.screens.help import HelpScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen, sessions_folder
from servescope.tui.sweepworker import CANCEL_GRACE_S, SimPool, SweepDriver, default_sim_profile
from servescope.tui.widgets.panels import short_path
from servescope.workloads.spec import resolve


class DemoSweep(TypedDict, total=False):
    """The demo's sweep as its flags would say it (make_app's `demo_sweep` overrides any of the keys)."""

    workload: str
    concurrency: str
    duration: str | None
    requests: int | None


DEMO_SWEEP: DemoSweep = {"workload": "sharegpt", "concurrency": "1,4,16", "duration": "8s", "requests": None}
QUIT_WAIT_S = 0.8  # ctrl+q during a sweep: how long the app waits for the engine to save before it leaves


class ServescopeApp(KeysInOrderApp[int]):
    CSS_PATH = "app.tcss"
    TITLE = "servescope"
    ENABLE_COMMAND_PALETTE = False
    # esc unzooms through the zoomed pane's own binding (widgets/zoom.py), which also redraws the footer; Textual's
    # own esc-to-minimize left the footer offering `esc Unzoom` after the pane was back in its place
    ESCAPE_TO_MINIMIZE = False
    BINDINGS = [
        Binding("f1,question_mark", "help", "Help"),
        Binding("f2", "switch_mode('compose')", "Compose"),
        Binding("f3", "switch_mode('run')", "Live"),
        Binding("f4", "switch_mode('sessions')", "Sessions"),
        Binding("ctrl+q", "quit", "Quit"),
        Binding("f12", "save_screen", "Screenshot", show=False,
                tooltip="Save this screen as SVG into the session's folder (the sessions folder when none)"),
    ]
    MODES = {"compose": "compose", "run": "run", "sessions": "sessions"}
    DEFAULT_MODE = "compose"

    def __init__(self, url: str | None = None, api_key_env: str = "OPENAI_API_KEY", demo: bool = False,
                 sessions_dir: str | Path | None = None, workloads_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic, demo_sweep: DemoSweep | None = None,
                 attach: str | Path | None = None) -> None:
        self.demo = demo
        self.attach_to = Path(attach) if attach else None
        self.initial_url = url or (f"sim://{default_sim_profile()}" if demo else "sim://tiny")
        self.api_key_env = api_key_env
        self.sessions_dir = Path(sessions_dir) if sessions_dir else None
        self.workloads_dir = Path(workloads_dir) if workloads_dir else None
        self.clock = clock
        self.demo_sweep: DemoSweep = {**DEMO_SWEEP, **(demo_sweep or {})}
        self.sims = SimPool()
        self.driver: SweepDriver | None = None
        self.sweep_worker: Worker[str] | None = None
        self.last_session: Path | None = None
        self.sweep_status: str | None = None  # how the last sweep shown ended (None: not ended while shown)
        self.quitting = False  # ctrl+q was pressed during a sweep: the engine is saving
        self.quit_summary = ""  # what the quit saved, one line (run_app prints it once the screen is gone)
        self.SCREENS = {  # type: ignore[misc]
            "compose": partial(ComposeScreen, self.initial_url, api_key_env, self.workloads_dir),
            "run": partial(RunScreen, clock),
            "sessions": partial(SessionsScreen, self.sessions_dir),
        }
        super().__init__()

    def on_mount(self) -> None:
        if self.demo:
            self.call_after_refresh(self._start_demo)
        elif self.attach_to is not None:
            path = self.attach_to
            self.call_after_refresh(lambda: self.attach(path))

    # ---- sweeps -----------------------------------------------------------------------------------
    @property
    def sweep_running(self) -> bool:
        w = self.sweep_worker
        return w is not None and w.state in (WorkerState.PENDING, WorkerState.RUNNING)

    def _start_demo(self) -> None:
        d = self.demo_sweep
        spec = SweepSpec(url=self.initial_url, api_key_env=self.api_key_env, workloads=tuple(resolve(d["workload"])),
                         concurrency=fields.int_list(str(d["concurrency"]), "concurrency"), requests=d.get("requests"),
                         duration_s=fields.opt_duration(d["duration"], "duration_s") if d.get("duration") else None,
                         name="demo", tags={"demo": "yes"})
        self.start_sweep(spec.check("demo"))

    def start_sweep(self, spec: Any) -> bool:
        """Start a sweep (a SweepSpec) and show the Run screen."""
        if self.sweep_running:
            self.notify("a sweep is already running: stop it first (F3, then x)", severity="warning", markup=False)
            return False
        self.call_later(self._start_sweep, spec)
        return True

    async def _start_sweep(self, spec: Any) -> None:
        await self.switch_mode("run")
        run = self.get_screen("run", RunScreen)
        run.slos = bool(spec.slos)
        nw = len(spec.workloads)
        run.reset(f"{spec.target_text}: {nw} workload{'s' if nw != 1 else ''}")
        driver = SweepDriver(run.post_message)
        self.driver = driver
        self.sweep_worker = self.run_worker(partial(driver.run, spec, self.sims, self.sessions_dir), thread=True,
                                            name="sweep", group="sweep", exit_on_error=False)

    def attach(self, path: Path) -> bool:
        """Open the Run screen on the sweep running in session `path`: what it did so far, then live. A tune
        session opens on its tune view instead (live while the tune runs)."""
        if is_tune_session(Path(path)):
            self.call_later(self._open_tune, Path(path))
            return True
        if self.sweep_running:
            self.notify("this app already shows a running sweep: leave it first (ctrl+q, then l)", severity="warning",
                        markup=False)
            return False
        self.call_later(self._open_attached, Path(path))
        return True

    async def _open_tune(self, path: Path) -> None:
        await self.switch_mode("sessions")
        try:
            scr = SessionScreen(path)
        except ServescopeError as e:
            self.notify(e.message, severity="error", markup=False)
            return
        await self.push_screen(scr)

    async def _open_attached(self, path: Path) -> None:
        await self.switch_mode("run")
        run = self.get_screen("run", RunScreen)
        run.reset(f"attached to {path.name}")
        driver = SweepDriver(run.post_message)
        self.driver = driver
        self.sweep_worker = self.run_worker(partial(driver.follow, path), thread=True, name="sweep", group="sweep",
                                            exit_on_error=False)

    def skip_cell(self) -> bool:
        if not self.sweep_running or self.driver is None:
            return False
        self.driver.skip_cell()
        return True

    def stop_sweep(self) -> bool:
        if not self.sweep_running or self.driver is None:
            return False
        self.driver.stop()
        return True

    def on_sweep_finished(self, msg: m.SweepFinished) -> None:
        self.last_session = msg.session_dir
        self.sweep_status = msg.status
        sev = {"completed": "information", "interrupted": "warning"}.get(msg.status, "error")
        text = f"sweep {msg.status}" + (f": saved {msg.session_dir.name}" if msg.session_dir else "")
        if msg.status == "failed" and msg.message:
            text += f"\n{msg.message}"
        self.notify(text, severity=sev, timeout=8, markup=False)  # type: ignore[arg-type]

    def compare_sessions(self, paths: list[Path], label_key: str | None = None) -> bool:
        """Open the Compare screen on saved sessions; a session that cannot be read, or sessions with no
        cell in common, are said in a notice (the app stays where it was)."""
        from servescope.tui.screens.compare import CompareScreen

        try:
            screen = CompareScreen(paths, label_key)
        except ServescopeError as e:
            self.notify(clean_text(e.message), title="compare", severity="error", timeout=10, markup=False)
            return False
        except Exception as e:  # a damaged session file: say so, keep the app
            self.notify(f"cannot compare: {type(e).__name__}: {clean_text(str(e))[:200]}", title="compare",
                        severity="error", timeout=10, markup=False)
            return False
        self.push_screen(screen)
        return True

    # ---- actions ------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # hide "go to this screen" while on it: the footer keeps room for the screen's own keys at 80 columns
        return not (action == "switch_mode" and bool(parameters) and parameters[0] == self.current_mode)

    def screenshot_folder(self) -> Path:
        """Where F12 saves the screen: the session shown (a saved one, or the sweep running or last run), else
        the sessions folder."""
        scr = self.screen
        if isinstance(scr, SessionScreen):
            return scr.session.path
        driver = self.driver
        if isinstance(scr, RunScreen) and driver is not None and driver.session_dir is not None:
            return Path(driver.session_dir)
        if isinstance(scr, RunScreen) and self.last_session is not None:
            return self.last_session
        return sessions_folder(self.sessions_dir)

    def action_save_screen(self) -> None:
        """Save the screen as SVG (Textual's screenshot) and say where, in a toast."""
        folder = self.screenshot_folder()
        name = f"screen-{type(self.screen).__name__.removesuffix('Screen').lower() or 'app'}-" \
               f"{time.strftime('%Y%m%d-%H%M%S')}.svg"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = self.save_screenshot(filename=name, path=str(folder))
        except OSError as e:
            self.notify(f"cannot save the screenshot in {short_path(folder)}: {e.strerror or e}", title="screenshot",
                        severity="error", timeout=10, markup=False)
            return
        self.notify(f"saved the screen as {short_path(path)}", title="screenshot", timeout=8, markup=False)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        """Quit. During a sweep in its own runner process (the default): ask whether to leave it running (it
        goes on; `servescope attach` shows it again) or stop it. During a sweep in the app's thread: the engine
        cancels the running cell's requests and saves it as interrupted (finished cells are on disk already);
        the app leaves as soon as that is done, or after QUIT_WAIT_S. A second ctrl+q leaves at once."""
        driver = self.driver
        if driver is not None and self.sweep_running and driver.detached and not self.quitting:
            where = driver.session_dir
            self.push_screen(ChoiceScreen(
                "The sweep runs in its own process: leave it running, or stop it?",
                f"Left running, it goes on without this app (pid {driver.engine_pid or '?'}); see it again with "
                f"`servescope attach {where}`. Stopped, its finished cells stay saved.",
                [("l", "leave it running", "leave"), ("s", "stop the sweep", "stop")]), self._quit_answer)
            return
        if self.quitting or driver is None or not self.sweep_running:
            if self.quitting and driver is not None and self.sweep_running:
                driver.abort()
            self._leave()
            return
        self.quitting = True
        driver.cancel()
        self.notify(f"quitting: {self._saved_text(done=False)} (ctrl+q again: quit at once)", title="quit",
                    severity="warning", timeout=10, markup=False)
        deadline = time.monotonic() + QUIT_WAIT_S

        def poll() -> None:
            if not self.sweep_running or time.monotonic() >= deadline:
                self._leave()

        self.set_interval(0.05, poll)

    def _quit_answer(self, answer: str | None) -> None:
        driver = self.driver
        if answer is None or driver is None:
            return
        where = driver.session_dir
        if answer == "leave" or not self.sweep_running:
            driver.leave()
            self.quit_summary = (f"the sweep goes on in the background (pid {driver.engine_pid or '?'}); see it with "
                                 f"`servescope attach {where}` or `servescope watch {where}`")
        else:
            driver.cancel()
            self.quit_summary = (f"stopping the sweep: its running cell is saved as stopped, finished cells are in "
                                 f"{where} (`servescope resume {where}` continues it)")
        self.quitting = True
        self.exit(0)

    def _leave(self) -> None:
        if not self.quit_summary:
            self.quit_summary = self._saved_text(done=True)
        self.exit(0)

    def _saved_text(self, done: bool) -> str:
        """What quitting keeps: the finished cells (on disk already) and the running cell (interrupted)."""
        if self.driver is None or (not self.quitting and not self.sweep_running):
            return ""
        run = self.get_screen("run", RunScreen)
        return run.quit_text(done)

    def shutdown_engine(self, wait_s: float = 0.0) -> None:
        """End a running sweep (finished cells stay saved; the running cell is saved as interrupted when
        the engine has `wait_s` to do it) and stop the simulators this app started."""
        driver = self.driver
        if driver is not None and driver.detached:
            driver.leave()  # the sweep goes on in its own process unless the user stopped it
        elif driver is not None and not driver.done.is_set():
            driver.cancel()
            if wait_s > 0:
                driver.done.wait(wait_s)
        self.sims.stop_all()

    def on_unmount(self) -> None:
        # after one ctrl+q the engine may still be saving (a second one aborted it): give it its grace
        self.shutdown_engine(wait_s=0.0 if self.driver is not None and self.driver.aborted else CANCEL_GRACE_S)


def make_app(url: str | None = None, api_key_env: str = "OPENAI_API_KEY", demo: bool = False,
             sessions_dir: str | Path | None = None, **kwargs: Any) -> ServescopeApp:
    """The app as `run_app` builds it (tests and snapshot tests use this). kwargs: workloads_dir, clock,
    demo_sweep (override the demo's workload/concurrency/duration/requests)."""
    return ServescopeApp(url=url, api_key_env=api_key_env, demo=demo, sessions_dir=sessions_dir, **kwargs)


def run_app(url: str | None = None, api_key_env: str = "OPENAI_API_KEY", demo: bool = False,
            sessions_dir: str | None = None, attach: str | Path | None = None) -> int:
    """Open the app (blocking) and return an exit code. `demo=True` opens on the simulator's default
    profile and starts a short sweep; `attach=SESSION` opens on that running sweep."""
    app = make_app(url=url, api_key_env=api_key_env, demo=demo, sessions_dir=sessions_dir, attach=attach)
    try:
        rc = app.run()
    finally:
        app.shutdown_engine()
    if app.quit_summary:
        print(f"servescope: {app.quit_summary}")
    if attach is not None and app.sweep_status == "failed":
        return 1  # `servescope attach`: 0 when the sweep ended well (or goes on), 1 when it failed
    return int(rc or 0) if app.return_code in (None, 0) else int(app.return_code or 1)


if __name__ == "__main__":  # python -m servescope.tui.app [URL]
    import sys

    sys.exit(run_app(sys.argv[1] if len(sys.argv) > 1 else None, demo=os.environ.get("SERVESCOPE_DEMO") == "1"))
