"""Parsers for the values of a sweep: each takes what a TOML file holds *or* what a flag or a form field
holds (a string), and returns the typed value or raises one ServescopeError that names where the value came
from and what to write instead. `where` is "file:line: [load] concurrency", "--concurrency" or a form
field's name.

Imported inside functions, to keep polars off the app's start-up: core.metrics (benchmarks/import_cost.py; the
docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TypeVar

from servescope.core.arrivals import BURSTINESS_MAX, Step, parse_pattern, pattern_text
from servescope.core.errors import ServescopeError
from servescope.core.workercount import Workers, too_many_workers

ARRIVALS = ("constant", "poisson", "gamma")
TRANSPORTS = ("raw", "aiohttp", "httpx")  # core.client.make_http_client builds each
ENGINES = ("auto", "vllm", "llamacpp", "openai")

N = TypeVar("N", int, float)  # a load level: users or a request rate


MAX_DURATION_S = 30 * 86400.0  # 30 days: the longest duration any option takes (a longer one overflowed mid-run)


def parse_duration(text: str, where: str = "duration") -> float:
    """'60s', '5m', '1.5h', '250ms' or '90' (seconds) -> seconds (also '1e-07s', as a tiny value is written).
    A negative one is read, to be refused as such; at most MAX_DURATION_S."""
    m = re.fullmatch(r"\s*([-+]?\d*\.?\d+(?:[eE][+-]?\d+)?|[-+]?\d+\.)\s*(ms|s|m|h)?\s*", text or "")
    if not m:
        raise ServescopeError(f"{where}: bad duration {text!r}; use e.g. 60s, 5m or 90")
    v = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    return _duration_in_range(v, text.strip(), where, "the duration ")


def _duration_in_range(v: float, shown: str, where: str, what: str = "") -> float:
    if not v > 0:
        said = f"{where}: {what}must be above 0"
        raise ServescopeError(said if v == 0 else f"{said}, not {shown} (e.g. 10s)")
    if not v <= MAX_DURATION_S:
        raise ServescopeError(f"{where}: {shown} is too long; give at most {fmt_num(MAX_DURATION_S)}s (30 days)")
    return v


def fmt_num(v: float) -> str:
    """An integer without a point, else up to 15 significant digits (all a float's decimal text keeps): a
    sweep file or a session writes durations with it, and must read back what it wrote (`:g`'s 6 digits
    wrote 999999.5 s as 1e+06s)."""
    return str(int(v)) if float(v).is_integer() else f"{v:.15g}"


def fmt_duration(v: float) -> str:
    return f"{fmt_num(v)}s"


def _list_items(text: str, where: str, like: str) -> list[str]:
    """The comma-separated items of a flag's list; an empty one ('1,,4', '1,4,') is a typo, never skipped."""
    parts = [p.strip() for p in text.split(",")]
    if parts == [""]:
        return []
    if "" in parts:
        raise ServescopeError(f"{where}: {text!r} has an empty item; give {like}")
    return parts


def parse_int_list(text: str, where: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; anything else says which part is wrong."""
    out = []
    for part in _list_items(text, where, "positive integers like 1,4,8"):
        if not (part.isascii() and part.isdigit()) or int(part) < 1:  # "²" is a digit, not a number
            raise ServescopeError(f"{where}: bad value {part!r}; give positive integers like 1,4,8")
        out.append(int(part))
    if not out:
        raise ServescopeError(f"{where}: empty; give positive integers like 1,4,8")
    return out


def parse_float_list(text: str, where: str) -> list[float]:
    out = []
    for part in _list_items(text, where, "request rates like 0.5,2,5"):
        try:
            v = float(part)
        except ValueError:
            raise ServescopeError(f"{where}: bad value {part!r}; give request rates like 0.5,2,5") from None
        if v <= 0 or math.isnan(v) or math.isinf(v):
            raise ServescopeError(f"{where}: bad value {part!r}; rates must be above 0")
        out.append(v)
    if not out:
        raise ServescopeError(f"{where}: empty; give request rates like 0.5,2,5")
    return out


# ---- one parser per kind of value: (raw TOML value or string, where) -> typed value ------------------------
def _blank(raw: object, where: str) -> bool:
    """Whether `raw` is an empty value that means "not set": only in a form field (`where` is the field's
    name). An empty flag (`-c ""`) or an empty string in a file is an error, never a silent default."""
    if not isinstance(raw, str) or raw.strip():
        return False
    if where.isidentifier():
        return True
    raise ServescopeError(f"{where}: empty; give a value (or leave the option out for its default)")


def text(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise ServescopeError(f"{where}: must be a string")
    return raw.strip()


def opt_text(raw: object, where: str) -> str | None:
    """A text that may be left out; an empty flag (`--launch ""`) or file value is an error, not "unset"."""
    if _blank(raw, where):
        return None
    return text(raw, where) or None


def url(raw: object, where: str) -> str:
    """A server's base URL (http:// or https://, with a host) or sim://PROFILE; a malformed one is one line
    here, before anything starts (`http://[::1` raised ValueError deep in a run)."""
    from urllib.parse import urlsplit

    v = nonempty_text(raw, where)
    if v.startswith("sim://"):
        return v
    how = "give e.g. http://127.0.0.1:8000, or sim:// for the built-in simulator"
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 (reading it checks the port)
    except ValueError as e:
        raise ServescopeError(f"{where}: {v!r} is not a URL ({e}); {how}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServescopeError(f"{where}: {v!r} is not an http(s) URL with a host; {how}")
    return v


def opt_path_or_name(raw: object, where: str) -> str | None:
    """A local path (made absolute, so a resumed sweep finds it from any directory) or a hub name."""
    from pathlib import Path

    v = opt_text(raw, where)
    if v and Path(v).expanduser().exists():
        return str(Path(v).expanduser().resolve())
    return v


def nonempty_text(raw: object, where: str) -> str:
    v = text(raw, where)
    if not v:
        raise ServescopeError(f"{where}: must not be empty")
    return v


def duration(raw: object, where: str) -> float:
    if isinstance(raw, bool):
        raise ServescopeError(f"{where}: give a duration like \"60s\" or a number of seconds")
    if isinstance(raw, (int, float)):
        return _duration_in_range(float(raw), f"{raw:g}", where)
    if isinstance(raw, str):
        return parse_duration(raw, where)
    raise ServescopeError(f"{where}: give a duration like \"60s\" or a number of seconds")


def opt_duration(raw: object, where: str) -> float | None:
    if _blank(raw, where):
        return None
    return duration(raw, where)


def interval(raw: object, where: str) -> float | None:
    """A sampling interval, or None for `off` (sample only at cell boundaries)."""
    if isinstance(raw, str) and raw.strip().lower() in ("off", "0", "none", ""):
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw == 0:
        return None
    return duration(raw, where)


def dump_interval(v: float | None) -> str:
    return "off" if v is None else fmt_duration(v)


def _distinct(values: tuple[N, ...], where: str) -> tuple[N, ...]:
    """The values, or one line naming the first one given twice (it would make two identical cells)."""
    seen: set[N] = set()
    for v in values:
        if v in seen:
            raise ServescopeError(f"{where}: {v:g} is given twice; give each load level once")
        seen.add(v)
    return values


def int_list(raw: object, where: str) -> tuple[int, ...] | None:
    if _blank(raw, where):
        return None
    if isinstance(raw, str):
        return _distinct(tuple(parse_int_list(raw, where)), where)
    if not isinstance(raw, list) or not raw:
        raise ServescopeError(f"{where}: give a list of positive integers like [1, 4, 16]")
    out = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ServescopeError(f"{where}: {x!r} is not a positive integer; give a list like [1, 4, 16]")
        out.append(x)
    return _distinct(tuple(out), where)


def float_list(raw: object, where: str) -> tuple[float, ...] | None:
    if _blank(raw, where):
        return None
    if isinstance(raw, str):
        return _distinct(tuple(parse_float_list(raw, where)), where)
    if not isinstance(raw, list) or not raw:
        raise ServescopeError(f"{where}: give a list of request rates like [0.5, 2, 5]")
    out = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 or math.isinf(x):
            raise ServescopeError(f"{where}: {x!r} is not a rate above 0; give a list like [0.5, 2, 5]")
        out.append(float(x))
    return _distinct(tuple(out), where)


def _int(raw: object, where: str, lowest: int) -> int:
    if isinstance(raw, str):
        s = raw.strip()
        if not re.fullmatch(r"-?\d+", s):
            raise ServescopeError(f"{where}: {raw!r} is not an integer; give an integer of at least {lowest}")
        raw = int(s)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < lowest:
        raise ServescopeError(f"{where}: must be an integer of at least {lowest}")
    return raw


def count0(raw: object, where: str) -> int:
    return _int(raw, where, 0)


MAX_REPEATS = 100


def repeats(raw: object, where: str) -> int:
    """How many times each cell runs: 1 to MAX_REPEATS."""
    n = _int(raw, where, 1)
    if n > MAX_REPEATS:
        raise ServescopeError(f"{where}: {n} repeats is more than {MAX_REPEATS}; 3 to 5 are usually enough")
    return n


def opt_count1(raw: object, where: str) -> int | None:
    if _blank(raw, where):
        return None
    return _int(raw, where, 1)


def any_int(raw: object, where: str) -> int:
    return _int(raw, where, -(2**63))


def workers(raw: object, where: str) -> Workers:
    """`auto` or a count of worker processes from 1: the one reading of `--workers` (flag, TOML, form)."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    if isinstance(raw, str) and not raw.strip().isdigit():
        raise ServescopeError(f"{where}: must be auto or a number of processes from 1, not {raw!r}")
    n = _int(raw, where, 1)
    if (refusal := too_many_workers(n, where)) is not None:  # cores x 4 (core/workercount.py)
        raise ServescopeError(refusal)
    return n


def names(raw: object, where: str) -> tuple[str, ...]:
    """Comma-separated names (a flag, a form field) or a TOML list of strings; empty: none."""
    if raw is None or _blank(raw, where):
        return ()
    if isinstance(raw, str):
        return tuple(_list_items(raw, where, "names separated by commas, e.g. 10.0.0.2,10.0.0.3"))
    items = raw
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        raise ServescopeError(f"{where}: must be names separated by commas, e.g. 10.0.0.2,10.0.0.3")
    return tuple(x.strip() for x in items if x.strip())


def choice(options: tuple[str, ...]) -> Callable[[object, str], str]:
    def parse(raw: object, where: str) -> str:
        if raw not in options:
            names = [repr(o) for o in options]
            listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
            raise ServescopeError(f"{where}: must be {listed}, not {raw!r}")
        return str(raw)

    return parse


def boolean(raw: object, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return raw.strip().lower() in ("true", "yes", "1", "on")
    raise ServescopeError(f"{where}: must be true or false")


def opt_price(raw: object, where: str) -> float | None:
    if _blank(raw, where):
        return None
    if isinstance(raw, str):
        try:
            raw = float(raw)
        except ValueError:
            raise ServescopeError(f"{where}: {raw!r} is not a number; give USD per kWh like 0.15") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw >= 0 or math.isinf(raw):
        raise ServescopeError(f"{where}: must be a price of 0 or more in USD per kWh, like 0.15")
    return float(raw)


def share(raw: object, where: str) -> float:
    """A share of a cell's requests: 0 (none) up to 0.5."""
    how = "give a share of the cell's requests from 0 to 0.5, like 0.05"
    if isinstance(raw, str):
        try:
            raw = float(raw.strip().rstrip("%")) / (100 if raw.strip().endswith("%") else 1)
        except ValueError:
            raise ServescopeError(f"{where}: {raw!r} is not a number; {how}") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 0.5:
        raise ServescopeError(f"{where}: must be from 0 to 0.5; {how}")
    return float(raw)


def opt_burstiness(raw: object, where: str) -> float | None:
    """The gamma shape of `arrival = "gamma"`: a number above 0 (1 is Poisson), at most BURSTINESS_MAX."""
    if _blank(raw, where):
        return None
    how = "give a number above 0 like 0.5 (1 is Poisson, below 1 burstier, above 1 more regular)"
    if isinstance(raw, str):
        try:
            raw = float(raw)
        except ValueError:
            raise ServescopeError(f"{where}: {raw!r} is not a number; {how}") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw > 0 or math.isinf(raw):
        raise ServescopeError(f"{where}: must be above 0; {how}")
    if raw > BURSTINESS_MAX:
        raise ServescopeError(f"{where}: {raw:g} is above {BURSTINESS_MAX:g}: that is constant arrivals; "
                              "use arrival = \"constant\" instead")
    return float(raw)


def opt_pattern(raw: object, where: str) -> tuple[Step, ...] | None:
    """A step pattern: "1x for 20s, 4x for 5s, 1x", or its steps as a list of strings."""
    if _blank(raw, where):
        return None
    if isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(x, str) for x in raw)):
        return parse_pattern(raw, where)
    raise ServescopeError(f"{where}: give the steps as a string like \"1x for 20s, 4x for 5s, 1x\"")


def dump_pattern(v: tuple[Step, ...]) -> str:
    return pattern_text(v)


# a sane value of each SLO, for messages (else 50)
SLO_EXAMPLES = {"ttft_ms": 3000.0, "ttfo_ms": 3000.0, "e2e_ms": 30000.0, "per_user_tok_s": 20.0}


def slos(raw: object, where: str) -> dict[str, float]:
    """A [slo] table, or 'ttft_ms=3000,tpot_ms=50'. Latency SLOs are upper bounds; per_user_tok_s a lower bound."""
    from servescope.core.metrics import SLO_KEYS

    like = "e.g. ttft_ms=3000,tpot_ms=50"
    if isinstance(raw, str):
        if _blank(raw, where):  # an empty form field: no SLOs; an empty flag: an error
            return {}
        items: list[tuple[str, object]] = []
        for part in _list_items(raw, where, f"KEY=VALUE items, {like}"):
            k, sep, v = part.partition("=")
            if not sep:
                raise ServescopeError(f"{where}: bad SLO {part!r}; use KEY=VALUE, {like}")
            try:
                items.append((k.strip(), float(v)))
            except ValueError:
                raise ServescopeError(f"{where}: bad SLO value in {part!r}: {v.strip()!r} is not a number; "
                                      f"{like}") from None
    elif isinstance(raw, dict):
        items = list(raw.items())
    else:
        raise ServescopeError(f"{where}: give a table like {{ ttft_ms = 3000 }} or ttft_ms=3000,tpot_ms=50")
    out: dict[str, float] = {}
    for key, val in items:
        if key not in SLO_KEYS:
            raise ServescopeError(f"{where}: bad SLO {key!r}: not a metric; use one of {', '.join(sorted(SLO_KEYS))}")
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0 or math.isinf(val):
            shown = f"{val:g}" if isinstance(val, (int, float)) and not isinstance(val, bool) else repr(val)
            raise ServescopeError(f"{where}: {key}={shown}: {key} must be a number above 0, e.g. {key}="
                                  f"{SLO_EXAMPLES.get(key, 50):g}")
        out[key] = float(val)
    return out


def dump_slos(v: dict[str, float]) -> dict[str, float | int]:
    return {k: (int(x) if float(x).is_integer() else x) for k, x in v.items()}


def tags(raw: object, where: str) -> dict[str, str]:
    """A [tags] table, or KEY=VALUE items (a list of flags, or 'a=1,b=2' from a form field)."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, str):
        raw = [p for p in raw.split(",") if p.strip()]
    if not isinstance(raw, list):
        raise ServescopeError(f"{where}: give a table like {{ quant = \"FP8\" }}")
    out = {}
    for t in raw:
        k, sep, v = str(t).partition("=")
        if not sep or not k.strip():
            raise ServescopeError(f"{where}: bad tag {t!r}; use KEY=VALUE, e.g. quant=FP8")
        out[k.strip()] = v.strip()
    return out


def variants(raw: object, where: str) -> tuple[str, ...]:
    """[[server.variants]] tables with args = "...", plain strings, or 'A ; B' from a form field."""
    if isinstance(raw, str):
        raw = [p for p in raw.split(";") if p.strip()]
    if not isinstance(raw, list):
        raise ServescopeError(f"{where}: give [[server.variants]] tables with args = \"--ARG VALUE ...\"")
    out: list[str] = []
    for i, v in enumerate(raw):
        if isinstance(v, dict):
            if set(v) - {"args"} or not isinstance(v.get("args"), str):
                raise ServescopeError(f"{where} {i + 1}: give only args = \"--ARG VALUE ...\"")
            v = v["args"]
        if not isinstance(v, str):
            raise ServescopeError(f"{where} {i + 1}: give args = \"--ARG VALUE ...\"")
        if not v.strip():
            raise ServescopeError(f"{where}: variant {i + 1} is empty; give the server's extra arguments, e.g. "
                                  "\"--max-num-seqs 64\" (or drop it)")
        out.append(v.strip())
    return tuple(out)


def dump_variants(v: tuple[str, ...]) -> list[dict[str, str]]:
    return [{"args": a} for a in v]
