"""The engine in its own process (multiprocessing 'spawn'), so that the app's repaints and the load never
share an interpreter lock: on a small machine a thread worker's requests waited behind the UI and measured
a higher TTFT than `servescope run`. No Textual here.

The app's sweep worker starts `main` with one end of a duplex pipe. This process runs the sweep on its own
event loop and sends lists of `(kind, fields)` items (servescope.tui.wire), one list per engine event
(the engine already batches requests a few times a second), ending with `("__end__", {})`. A sender
thread does the pipe writes so a slow reader can never block the event loop. It receives
`("skip",)`, `("stop",)` (the first lets the in-flight requests finish, a second cancels them) and
`("cancel",)`; a closed pipe (the app died) counts as cancel. Its stdout and stderr go to os.devnull: the
terminal it inherited is the app's screen."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import threading
from typing import Any

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.tui.wire import app_wording

END = "__end__"


def _finished(status: str, message: str) -> list[tuple[str, dict[str, Any]]]:
    return [("SweepFinished", {"session_dir": None, "status": status, "message": message})]


def _quiet() -> None:
    """Point fds 1 and 2 at os.devnull: a warning printed here must never draw over the app's screen."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


def main(conn: Any, spec: Any, ctx: Any) -> None:
    """Process entry point (picklable: a module-level function)."""
    _quiet()
    try:  # ctrl+c in the terminal is the app's to handle: it cancels us over the pipe
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass
    outbox: queue.SimpleQueue[list[tuple[str, dict[str, Any]]] | None] = queue.SimpleQueue()

    def sender() -> None:
        while True:
            batch = outbox.get()
            if batch is None:
                return
            try:
                conn.send(batch)
            except (OSError, EOFError, BrokenPipeError):
                return

    st = threading.Thread(target=sender, name="engine-sender", daemon=True)
    st.start()
    try:
        _sweep(conn, outbox, spec, ctx)
    except ServescopeError as e:
        outbox.put(_finished("failed", app_wording(clean_text(e.message))))
    except (asyncio.CancelledError, KeyboardInterrupt):
        outbox.put(_finished("interrupted", "the app closed during the sweep"))
    except Exception as e:  # the app shows what broke, in one line
        outbox.put(_finished("failed", f"the sweep stopped on an unexpected error: "
                                       f"{clean_text(str(e))[:300] or type(e).__name__}"))
    finally:
        outbox.put([(END, {})])
        outbox.put(None)
        st.join(timeout=10)


def _sweep(conn: Any, outbox: queue.SimpleQueue[Any], spec: Any, ctx: Any) -> None:
    """Run the sweep `spec` (a SweepSpec) in `ctx` (a RunContext), both pickled across the spawn."""
    from servescope.engine.runner import SweepControl, run_sweep
    from servescope.tui.wire import Translator, run_loop

    control = SweepControl()
    state: dict[str, Any] = {}

    def listen() -> None:
        while True:
            try:
                cmd = conn.recv()
            except (EOFError, OSError):
                cmd = ("cancel",)
            what = cmd[0] if cmd else ""
            if what == "skip":
                control.skip_cell("skipped by the user")
            elif what == "stop":
                control.stop("stopped by the user", let_in_flight_finish=True)
            elif what == "cancel":
                control.stopping = True
                loop, task = state.get("loop"), state.get("task")
                if loop is not None and task is not None and not loop.is_closed():
                    try:
                        loop.call_soon_threadsafe(task.cancel)
                    except RuntimeError:
                        pass
                else:
                    state["cancelled"] = True
                return

    async def amain() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["task"] = asyncio.current_task()
        if state.get("cancelled"):
            raise asyncio.CancelledError
        translate = Translator(ctx.target_label)
        async for ev in run_sweep(spec, ctx, control):
            items = translate(ev)
            if items:
                outbox.put(items)

    threading.Thread(target=listen, name="engine-control", daemon=True).start()
    run_loop(amain())
