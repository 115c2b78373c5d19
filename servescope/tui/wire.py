"""The app's wording of the engine's items: `app_wording` says an engine message with the Compose screen's
field names instead of CLI flags, `start_failure` says why the engine could not start. The items themselves
are made by servescope.engine.wire (re-exported here)."""

from __future__ import annotations

import re

from servescope.core.textsafe import clean_text
from servescope.engine.aio import run_loop
from servescope.engine.spec import form_wording
from servescope.engine.wire import (
    LIVE_SERVER_KEYS,
    CellInfo,
    Item,
    Translator,
    decode_item,
    live_server,
    reduce_batch,
    telemetry_meta,
    translate,
)

# the engine's wire, re-exported for the app (its engine runs on run_loop), and the app's own wording
__all__ = ["APP_FIELDS", "LIVE_SERVER_KEYS", "CellInfo", "Item", "Translator", "app_wording",
           "decode_item", "live_server", "reduce_batch", "run_loop", "start_failure", "telemetry_meta", "translate"]

# the CLI flags the engine's messages name, as the Compose screen's fields are labelled: inside the app a
# message says "check the URL field", not "check --url". The sweep's options say it themselves (Option.form);
# these are the run's own flags, which are not sweep options.
APP_FIELDS: dict[str, str] = {
    **form_wording(),
    "--api-key": "the API key var field", "--workload": "the workloads", "--save": "the sessions folder",
    "--sessions-dir": "the sessions folder",
}
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)(?![\w-])")


def app_wording(text: str) -> str:
    """An engine message as the app says it: each CLI flag it names becomes the Compose field it stands for
    ("check --url" -> "check the URL field"); flags without a field are left as they are."""
    return _FLAG.sub(lambda mo: APP_FIELDS.get(mo.group(1), mo.group(1)), text)


def start_failure(e: BaseException) -> str:
    """One readable line for an engine that could not start in its own process (never an exception repr)."""
    what = clean_text(str(e)).strip().rstrip(".")
    if isinstance(e, ValueError) and "fds_to_keep" in what:
        what = "the terminal's error stream could not be handed to it"
    elif isinstance(e, (OSError, PermissionError)) and getattr(e, "strerror", None):
        what = clean_text(str(e.strerror)).lower()
    elif "pickle" in what.lower() or type(e).__name__ == "PicklingError":
        what = "the sweep could not be sent to it"
    return (f"the engine could not start in its own process ({what[:120] or type(e).__name__}); running in a thread "
            "instead, where its timings share the app's CPU time")
