"""Speculative decoding as a searched setting and in the twin: `tune --search num-speculative-tokens=1|2|4` sets the
`num_speculative_tokens` of the launch command's `--speculative-config` JSON (vLLM has no flag of that name), and the
twin of a session that speculated runs the simulator's speculation with the method and tokens the server was
launched with and the acceptance its cells measured (sim/specdecode.py)."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.sim.profile import Profile
from servescope.sim.specdecode import METHODS, SpecConfigError, expected_accepted, parse_spec_config

SPEC_TOKENS_FLAG = "--num-speculative-tokens"  # tune's name for --speculative-config's num_speculative_tokens
SPEC_CONFIG_FLAG = "--speculative-config"


def _config_word(words: Sequence[str]) -> tuple[int, bool] | None:
    """Where the command's --speculative-config JSON is: (index of the word, whether it is `--flag=JSON`)."""
    for i, w in enumerate(words):
        if w == SPEC_CONFIG_FLAG and i + 1 < len(words):
            return i + 1, False
        if w.startswith(SPEC_CONFIG_FLAG + "="):
            return i, True
    return None


def spec_config_text(launch: str) -> str | None:
    """The JSON of a launch command's --speculative-config (None: it has none)."""
    words = shlex.split(launch)
    at = _config_word(words)
    if at is None:
        return None
    i, joined = at
    return words[i].split("=", 1)[1] if joined else words[i]


def check_spec_search(launch: str, values: Sequence[str]) -> None:
    """`--search num-speculative-tokens=...` needs a launch command with a --speculative-config to change, and whole
    numbers of tokens; one line saying what to give."""
    text = spec_config_text(launch)
    if text is None:
        raise ServescopeError("--search num-speculative-tokens sets the num_speculative_tokens of the launch "
                              "command's --speculative-config: add one, e.g. --speculative-config "
                              "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'")
    try:
        parse_spec_config(text)
    except SpecConfigError as e:
        raise ServescopeError(f"the launch command's {clean_text(str(e))}") from None
    for v in values:
        if not v.isdigit() or not 1 <= int(v) <= 64:
            raise ServescopeError(f"--search num-speculative-tokens: {clean_text(v)!r} is not a number of tokens from "
                                  "1 to 64")


def with_spec_tokens(words: list[str], value: str) -> list[str]:
    """The command's words with its --speculative-config's num_speculative_tokens set to `value`."""
    at = _config_word(words)
    if at is None:
        raise ServescopeError("--search num-speculative-tokens: the launch command has no --speculative-config")
    i, joined = at
    text = words[i].split("=", 1)[1] if joined else words[i]
    cfg = json.loads(text)
    cfg["num_speculative_tokens"] = int(value)
    dumped = json.dumps(cfg)
    out = list(words)
    out[i] = f"{SPEC_CONFIG_FLAG}={dumped}" if joined else dumped
    return out


def acceptance_from_rate(rate: float, k: int) -> float:
    """The per-token acceptance p whose drafts of `k` tokens have `rate` = accepted / drafted tokens (a draft's
    tokens are accepted in turn until one is rejected: rate = p (1 - p^k) / ((1 - p) k)), by bisection."""
    if rate <= 0:
        return 0.0
    if rate >= 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_accepted(mid, k) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def spec_server_config(args: object) -> str | None:
    """A session's recorded --speculative-config (its server arguments: the launched command's typed ones, or the
    words a server reported)."""
    if isinstance(args, Mapping):
        v = args.get("speculative_config")
        return v if isinstance(v, str) else None
    if isinstance(args, Sequence) and not isinstance(args, str):
        words = [str(a) for a in args]
        at = _config_word(words)
        if at is not None:
            i, joined = at
            return words[i].split("=", 1)[1] if joined else words[i]
    return None


def with_speculation(p: Profile, config: str | None, acceptance_rates: Sequence[float]) -> tuple[Profile, str]:
    """The twin's profile speculating as the session's server did: its method and tokens, and the acceptance that
    gives the cells' mean measured acceptance rate; and a few words for the twin's description ("" without)."""
    if config is None:
        return p, ""
    try:
        spec = parse_spec_config(config)
    except SpecConfigError:
        return p, ""
    rates = [r for r in acceptance_rates if math.isfinite(r)]
    acc = acceptance_from_rate(sum(rates) / len(rates), spec.num_speculative_tokens) if rates else 0.0
    engine = replace(p.engine, speculative_method=spec.method, num_speculative_tokens=spec.num_speculative_tokens,
                     spec_acceptance=round(acc, 4))
    said = (f"speculative decoding {spec.method} x{spec.num_speculative_tokens}, drafted tokens accepted at "
            f"{acc:.2f} (measured)" if rates else f"speculative decoding {spec.method} x{spec.num_speculative_tokens}, "
            "its acceptance not measured (the method's typical rate)")
    return replace(p, engine=engine), said


__all__ = ["METHODS", "SPEC_TOKENS_FLAG", "acceptance_from_rate", "check_spec_search", "spec_config_text",
           "spec_server_config", "with_spec_tokens", "with_speculation"]
