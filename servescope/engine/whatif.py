"""Planning answers from the twin: capacity at the SLOs and the knee per workload, and the twin's track record.

`capacity_row` walks the concurrency up (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, ...) on the fitted twin until two
levels in a row miss the SLOs, then narrows the step between the last level that met them and the first that
did not: the capacity is the highest concurrency whose predicted cell meets the SLOs (at least 90% of its
requests within every SLO, as for a measured cell) and the knee is where aggregate x per-user tok/s peaks
(`servescope.sessions.answers`). `confirm_pairs` compares predicted cells with measured ones, figure by figure.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.metrics import meets_slos
from servescope.engine.twin import FIGURES, Twin, twin_dir
from servescope.engine.twinpredict import Load, Prediction, predict
from servescope.engine.twinshape import AS_MEASURED, Knobs
from servescope.sessions.answers import capacity, knee
from servescope.sessions.store import Session
from servescope.sessions.twin import CONFIRM_FILE
from servescope.sessions.views import CellView, LoadPlan
from servescope.workloads.spec import Workload, fixed, uniform

USABLE_SLOS = {"ttft_ms": 3000.0, "per_user_tok_s": 20.0}  # "usable": TTFT < 3 s and > 20 tok/s per user
LEVELS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def capacity_tasks() -> list[Workload]:
    """The task types of a capacity table, short to long context (those that do not fit are reported so)."""
    return [
        Workload("code-completion-1k", input_tokens=fixed(1024), output_tokens=fixed(128),
                 description="1K code completion"),
        Workload("chat", input_tokens=uniform(200, 512), output_tokens=fixed(256), description="short chat, Q&A"),
        Workload("rag-8k", input_tokens=fixed(8192), output_tokens=fixed(512), description="8K RAG answer"),
        Workload("document-32k", input_tokens=fixed(32768), output_tokens=fixed(512),
                 description="32K document summary"),
        Workload("coding-assistant-96k", input_tokens=fixed(98304), output_tokens=fixed(1024),
                 description="96K coding assistant"),
    ]


def view(p: Prediction, index: int = 0) -> CellView:
    """A predicted cell as the answers see a measured one."""
    return CellView(index, p.workload, p.load.label, LoadPlan(p.load.concurrency, p.load.rate), "done", "", p.summary)


# the figures of the predicted cell at the capacity that `whatif --capacity --json` writes, by their keys
AT_CAPACITY = ("output_tok_s", "ttft_ms.p50", "tpot_ms.p50", "per_user_tok_s.mean", "slo_met_fraction")
AtCapacity = dict[str, float | None]  # a figure's key (AT_CAPACITY) -> its predicted value


class ConfirmPair(TypedDict):
    """A predicted cell beside the real run's: each figure predicted, measured, and predicted / measured - 1."""

    workload: str
    concurrency: int | None
    rate: float | None
    predicted: dict[str, float | None]
    measured: dict[str, float | None]
    error: dict[str, float | None]
    status: object  # the measured cell's status as the run's --json said ("missing": not in it)


@dataclass
class CapacityRow:
    workload: str
    description: str
    capacity: int | None  # None: not even c=1 meets the SLOs, or the workload does not fit
    not_reached: bool  # still met at the highest level tried
    knee: int | None
    knee_not_reached: bool
    at_capacity: AtCapacity | None  # the predicted cell at the capacity (output tok/s, TTFT, per user ...)
    levels: list[int]
    reason: str = ""  # why there is no answer (does not fit)

    def to_dict(self) -> JsonObject:
        return {"concurrency": self.capacity, "not_reached": self.not_reached, "knee": self.knee,
                "knee_not_reached": self.knee_not_reached, "levels_predicted": self.levels,
                "at_capacity": self.at_capacity, "reason": self.reason or None}


def _brief(p: Prediction) -> AtCapacity:
    return {key: p.summary.value(key) for key in AT_CAPACITY}


def capacity_row(twin: Twin, w: Workload, slos: Mapping[str, float], knobs: Knobs = AS_MEASURED,
                 max_level: int | None = None) -> CapacityRow:
    top = max_level or max(8, 2 * twin.profile.engine.max_num_seqs if knobs.max_num_seqs is None
                           else 2 * knobs.max_num_seqs)
    preds: dict[int, Prediction] = {}

    def at(c: int) -> Prediction:
        if c not in preds:
            preds[c] = predict(twin, w, [Load(concurrency=c)], knobs, slos=slos, bands=False)[0]
        return preds[c]

    def ok(c: int) -> bool:
        return meets_slos(at(c).summary)

    try:
        at(1)
    except ServescopeError as e:
        return CapacityRow(w.name, w.description, None, False, None, False, None, [], reason=e.message)
    last_ok, first_bad, misses = 0, 0, 0
    for c in (lv for lv in LEVELS if lv <= top):
        if ok(c):
            last_ok, misses = c, 0
        else:
            first_bad = first_bad or c
            misses += 1
            if misses >= 2:
                break
    if last_ok and first_bad and first_bad > last_ok:  # narrow between the last pass and the first miss
        lo, hi = last_ok, first_bad
        while hi - lo > max(1, lo // 8):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        last_ok = max(c for c in preds if ok(c))
    views = [view(preds[c], i) for i, c in enumerate(sorted(preds))]
    cap = capacity(views)
    kn = knee(views)
    level = int(cap.level) if cap.level is not None else None
    return CapacityRow(w.name, w.description, level, cap.not_reached, kn.concurrency, kn.not_reached,
                       _brief(preds[level]) if level else None, sorted(preds))


# --- the track record -----------------------------------------------------------------------------------------
def _fig(d: Mapping[str, object], key: str) -> float | None:
    name, _, stat = key.partition(".")
    v = d.get(name)
    v = v.get(stat) if stat and isinstance(v, Mapping) else v
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def confirm_pairs(preds: Sequence[Prediction], measured: Sequence[Mapping[str, object]]) -> list[ConfirmPair]:
    """Per predicted cell: the measured figures and the relative error (predicted / measured - 1) of each."""
    out: list[ConfirmPair] = []
    for p, m in zip(preds, measured, strict=True):
        predicted = {k: p.summary.value(k) for k in FIGURES}
        got = {k: _fig(m, k) for k in FIGURES}
        err: dict[str, float | None] = {}
        for k in FIGURES:
            pv, mv = predicted[k], got[k]
            err[k] = pv / mv - 1.0 if pv is not None and mv else None
        out.append({"workload": p.workload, "concurrency": p.load.concurrency, "rate": p.load.rate,
                     "predicted": predicted, "measured": got, "error": err, "status": m.get("status")})
    return out


CONFIRM_SEED_STEP = 1_000  # confirming run k of a session runs with its seed + k x this: prompts of its own


def confirm_seed(session: Session, base_seed: int) -> int:
    """The seed of the next confirming run: the session's seed moved on by one step per confirming run recorded,
    so that its prompts are neither the session's (a server's prefix cache would serve those again: a faster
    TTFT than the twin's) nor an earlier confirming run's."""
    runs: set[str] = set()
    try:
        for line in (twin_dir(session) / CONFIRM_FILE).read_text(encoding="utf-8").splitlines():
            try:
                runs.add(str(json.loads(line).get("confirm_session")))
            except (ValueError, AttributeError):
                continue
    except OSError:
        pass
    return base_seed + CONFIRM_SEED_STEP * (len(runs) + 1)


def record_confirmation(session: Session, pairs: Sequence[ConfirmPair], confirm_session: str,
                        knobs: Knobs) -> None:
    """Append the pairs to SESSION/twin/confirm.jsonl (the twin's track record, shown by reports)."""
    d = twin_dir(session)
    d.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with open(d / CONFIRM_FILE, "a", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps({"at": stamp, "confirm_session": confirm_session, "settings": knobs.label(), **p}) + "\n")
