"""Parsers of the options that say how long and over what a cell is measured (`--ramp auto|0|DURATION`,
`--precision`, `--probe-rate`), as engine/fields.py's: each takes what a TOML file, a flag or a form field holds and
returns the value or raises one ServescopeError naming where it came from and what to write instead; and how an
older sweep table keeps the regime it was measured in (`legacy_regime`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from servescope.core.errors import ServescopeError
from servescope.core.precision import Precision, parse_precision
from servescope.engine import fields as f

__all__ = ["WINDOWS", "dump_ramp", "legacy_regime", "opt_precision", "opt_probe_rate", "opt_ramp"]

WINDOWS = ("steady", "whole")
MAX_PROBE_RATE = 100.0  # probes per second at most: more is a load of its own, not a probe of the load


def opt_ramp(raw: object, where: str) -> float | None:
    """`auto` (None: a closed loop's users start over one request's E2E), `0` (no ramp of the sweep's own: users
    start together) or a duration."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw == 0:
        return 0.0
    if isinstance(raw, str) and re.fullmatch(r"\s*[+]?0*\.?0*\s*(ms|s|m|h)?\s*", raw) and any(c == "0" for c in raw):
        return 0.0
    try:
        return f.opt_duration(raw, where)
    except ServescopeError as e:
        if "bad duration" not in e.message:
            raise
        raise ServescopeError(f"{e.message}, auto (the default) or 0 (none)") from None


def dump_ramp(v: float) -> str:
    return "0s" if v == 0 else f.fmt_duration(v)


def opt_precision(raw: object, where: str) -> Precision | None:
    if isinstance(raw, str) and not raw.strip() and where.isidentifier():
        return None
    return parse_precision(raw, where)


def opt_probe_rate(raw: object, where: str) -> float | None:
    """Interference probes per second, above 0 and at most MAX_PROBE_RATE; 0 or "off": none."""
    how = "give probes per second, e.g. 0.5 (0 for none)"
    if raw is None:
        return None
    if isinstance(raw, str):
        t = raw.strip().lower()
        if not t and where.isidentifier():
            return None
        if t in ("off", "none", "0"):
            return None
        try:
            raw = float(t.removesuffix("/s"))
        except ValueError:
            raise ServescopeError(f"{where}: {raw!r} is not a number; {how}") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
        raise ServescopeError(f"{where}: must be a rate of 0 or more; {how}")
    if raw == 0:
        return None
    if raw > MAX_PROBE_RATE:
        raise ServescopeError(f"{where}: {raw:g}/s is a load of its own, not a probe of the load; give at most "
                              f"{MAX_PROBE_RATE:g}")
    return float(raw)


def legacy_regime(sweep: Mapping[str, object]) -> dict[str, object]:
    """A session's [sweep] table written before cells were measured over a steady window (no `window` in its
    [load]): the regime it ran in, so that `resume` (and `run --sweep SESSION`) measures its remaining cells as its
    first ones were: over the whole cell, its users started together (`ramp = 0`) unless it gave a ramp."""
    load = sweep.get("load")
    table = dict(load) if isinstance(load, Mapping) else {}
    if "window" in table:
        return dict(sweep)
    table["window"] = "whole"
    table.setdefault("ramp", "0s")
    return {**sweep, "load": table}
