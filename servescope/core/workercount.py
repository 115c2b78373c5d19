"""`--workers`: how many processes send a cell's load. A count from 1, or "auto" (chosen per cell by
`core.workers.auto_workers` from its load). Parsed in one place (`engine.fields.workers`: the flag, the TOML, the
Compose form), with one default for the sweep's option and every Target. This module imports nothing, so the
CLI's parser can name the type without loading the client."""

from __future__ import annotations

from typing import Literal

Workers = int | Literal["auto"]
DEFAULT_WORKERS: Workers = "auto"
