"""servescope's built-in vLLM simulator: an OpenAI-compatible server that behaves like vLLM under load.

A separate program inside the package (`python -m servescope.sim`); servescope's engine never imports it.
`servescope.sim.launcher.start_sim` starts one in a subprocess for tests and `sim://` targets.
"""

from __future__ import annotations

from servescope.sim.launcher import SimHandle, SimStartError, list_profiles, start_sim

__all__ = ["SimHandle", "SimStartError", "list_profiles", "start_sim"]
