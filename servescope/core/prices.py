"""The prices a sweep is given for its tokens: a hosted API's list price per 1M tokens (`--price
input=USD,output=USD`), what the GPU box costs per hour (`--gpu-hour USD`) and, beside them, the electricity
price (`--electricity-price`): their parsers (engine/spec.py declares the options with them) and how
session.toml records them. What a cell's tokens then cost is core/cost.py's.

This module imports nothing heavy (not even msgspec): `servescope --help` imports it."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from servescope.core.errors import ServescopeError

__all__ = ["META_KEYS", "ApiPrice", "Prices", "dump_price", "parse_gpu_hour", "parse_price", "prices_of_meta",
           "usd_text"]

PRICE_EXAMPLE = "input=2.50,output=10"
MAX_PRICE = 1e6  # USD: above it, a price was surely mistyped (and a product of it could overflow a report)


class ApiPrice(NamedTuple):
    """A hosted API's list price, USD per 1M tokens."""

    input: float
    output: float


@dataclass(frozen=True)
class Prices:
    """What a session was told its tokens cost: an API's list price, or a GPU's hourly price (and the
    electricity price, for the measured energy)."""

    api: ApiPrice | None = None
    gpu_usd_per_hour: float | None = None
    electricity_usd_per_kwh: float | None = None

    @property
    def any(self) -> bool:
        return self.api is not None or self.gpu_usd_per_hour is not None or self.electricity_usd_per_kwh is not None


# ---- parsers (a flag's text, a TOML value or a form field's text) -------------------------------------
def _amount(text: str, where: str, what: str) -> float:
    try:
        v = float(text.strip().removeprefix("$"))
    except ValueError:
        raise ServescopeError(f"{where}: {what} {text.strip()!r} is not a number; give USD like "
                              f"--price {PRICE_EXAMPLE}") from None
    if not math.isfinite(v) or v < 0 or v > MAX_PRICE:
        raise ServescopeError(f"{where}: {what} must be a price of 0 to {MAX_PRICE:,.0f} USD per 1M tokens, got "
                              f"{text.strip()!r}; e.g. --price {PRICE_EXAMPLE}")
    return v


def parse_price(raw: object, where: str) -> ApiPrice | None:
    """`input=2.50,output=10` (USD per 1M tokens; a TOML file may give the table {input = 2.5, output = 10})
    -> ApiPrice. An empty form field is "not set"; anything else that is not both prices is one line."""
    if isinstance(raw, str) and not raw.strip():
        if where.isidentifier():  # a form field left empty
            return None
        raise ServescopeError(f"{where}: empty; give the API's list price per 1M tokens, e.g. {PRICE_EXAMPLE}")
    if isinstance(raw, Mapping):
        items = [(str(k), v) for k, v in raw.items()]
    elif isinstance(raw, str):
        items = []
        for part in re.split(r"[,;]", raw):
            if not part.strip():
                continue
            key, eq, val = part.partition("=")
            if not eq:
                raise ServescopeError(f"{where}: {part.strip()!r} is not KEY=USD; give the API's list price per "
                                      f"1M tokens as {PRICE_EXAMPLE}")
            items.append((key, val))
    else:
        raise ServescopeError(f"{where}: must be the API's list price per 1M tokens, {PRICE_EXAMPLE} (a file: "
                              "{input = 2.5, output = 10})")
    got: dict[str, float] = {}
    for key, val in items:
        k = key.strip().lower()
        if k not in ("input", "output"):
            raise ServescopeError(f"{where}: unknown price {key.strip()!r}; give input=USD,output=USD per 1M tokens, "
                                  f"e.g. {PRICE_EXAMPLE}")
        if k in got:
            raise ServescopeError(f"{where}: {k} is given twice; give each once, e.g. {PRICE_EXAMPLE}")
        if isinstance(val, bool) or not isinstance(val, (str, int, float)):
            raise ServescopeError(f"{where}: {k} must be a number of USD per 1M tokens, e.g. {PRICE_EXAMPLE}")
        got[k] = _amount(str(val), where, k)
    missing = [k for k in ("input", "output") if k not in got]
    if missing:
        raise ServescopeError(f"{where}: no {' or '.join(missing)} price; give both, per 1M tokens, e.g. "
                              f"{PRICE_EXAMPLE}")
    return ApiPrice(got["input"], got["output"])


def dump_price(p: ApiPrice) -> dict[str, float]:
    """As a sweep file holds it: {input = 2.5, output = 10.0}."""
    return {"input": p.input, "output": p.output}


def parse_gpu_hour(raw: object, where: str) -> float | None:
    """USD per hour (`2.50`, `$2.50`): what the GPU box costs, amortised or rented."""
    if isinstance(raw, str):
        if not raw.strip():
            if where.isidentifier():
                return None
            raise ServescopeError(f"{where}: empty; give what the GPU box costs per hour in USD, e.g. 2.50")
        text = raw.strip()
        try:
            raw = float(text.removeprefix("$"))
        except ValueError:
            raise ServescopeError(f"{where}: {text!r} is not a number; give what the GPU box costs per hour "
                                  "in USD, e.g. 2.50") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or not 0 <= raw <= MAX_PRICE:
        raise ServescopeError(f"{where}: must be a price of 0 to {MAX_PRICE:,.0f} USD per hour, like 2.50")
    return float(raw)


# ---- session.toml ------------------------------------------------------------------------------------
# session.toml's top-level price keys (engine/sessionmeta.py writes them; prices are not secrets)
META_KEYS = ("price_usd_per_1m_input_tokens", "price_usd_per_1m_output_tokens", "gpu_usd_per_hour",
             "electricity_usd_per_kwh")


class PricedMeta(Protocol):
    """A session's table with its prices (servescope.sessions.meta.SessionMeta)."""

    @property
    def price_usd_per_1m_input_tokens(self) -> float | None: ...
    @property
    def price_usd_per_1m_output_tokens(self) -> float | None: ...
    @property
    def gpu_usd_per_hour(self) -> float | None: ...
    @property
    def electricity_usd_per_kwh(self) -> float | None: ...


def prices_of_meta(meta: PricedMeta) -> Prices:
    """The prices a session.toml records (a value that is not a finite number of 0 or more is not a price)."""
    v = {k: _num(getattr(meta, k)) for k in META_KEYS}
    pin, pout = v["price_usd_per_1m_input_tokens"], v["price_usd_per_1m_output_tokens"]
    api = ApiPrice(pin, pout) if pin is not None and pout is not None else None
    return Prices(api, v["gpu_usd_per_hour"], v["electricity_usd_per_kwh"])


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return float(x)


def usd_text(v: float) -> str:
    """2.5 -> '2.50', 0.15 -> '0.15', 0.0004 -> '0.0004'."""
    if v == 0 or v >= 0.01:
        return f"{v:,.2f}"
    return f"{v:.2g}"
