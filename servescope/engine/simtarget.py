"""`sim://PROFILE` targets, read in this one place: the profile a URL names (`sim://` alone: the simulator's
default profile), the label a session stores for it (always `sim://PROFILE`, whichever way the sweep was
started: CLI, app, runner) and starting the simulator. The CLI's `open_target` and the app's `SimPool` both go
through here.

The simulator's launcher is imported where a sim:// target starts: an install may lack the simulator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servescope.core.errors import ServescopeError
from servescope.sim.profile import DEFAULT_PROFILE

if TYPE_CHECKING:
    from servescope.sim.launcher import SimHandle

SCHEME = "sim://"


def default_profile() -> str:
    """The profile `sim://` alone means."""
    return str(DEFAULT_PROFILE)


def sim_profile(url: str) -> str | None:
    """The simulator profile a `sim://` URL names, the default for `sim://` alone; None for any other URL."""
    url = url.strip()
    if not url.startswith(SCHEME):
        return None
    return url[len(SCHEME):].strip("/") or default_profile()


def sim_label(profile: str) -> str:
    """What a session stores as its target's URL for a simulator: `sim://PROFILE`."""
    return f"{SCHEME}{profile}"


def start_simulator(profile: str, args: Sequence[str] = ()) -> SimHandle:
    """Start the simulator for `profile` (a handle with `.url`, `.proc` and `.stop()`), with its flags `args` (the
    LoRA adapters a sweep's workloads name: engine/serving.py sim_serving_args); a one-line error when it does not
    come up or the simulator is not installed."""
    try:
        from servescope.sim.launcher import SimStartError, start_sim
    except ImportError:
        raise ServescopeError("the built-in simulator is not available in this install; give an http:// URL") from None
    try:
        return start_sim(profile, list(args))
    except SimStartError as e:
        raise ServescopeError(e.message) from None
