"""What a sweep session records about itself: session.toml's metadata (the target, the model, the workloads,
the load, the planned cells) and the settings each cell's row records that it really ran with. Plain
functions of the sweep, so that the runner and anything else that writes a sweep session write one shape."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from servescope.core.secrets import redact_command, redact_sweep_table, redact_text
from servescope.core.target import ModelInfo, TargetInfo
from servescope.engine.fields import dump_interval
from servescope.engine.plan import Cell
from servescope.engine.spec import SweepSpec

__all__ = ["ran_with", "session_meta"]


def session_meta(spec: SweepSpec, cells: Sequence[Cell], *, name: str, label: str, target: TargetInfo,
                 model: ModelInfo, tokenizer: str, api_key: str | None = None,
                 server_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """session.toml's metadata for a new sweep session: `label` is the target as shown and stored
    (`sim://tiny`, never a key), `tokenizer` the tokenizer's name, `server_args` the launched server's
    arguments (recorded only when the sweep launches its server). The API key never lands in it."""
    meta: dict[str, Any] = {
        "name": name,
        "target": {"url": label, "version": target.version, "metrics": target.metrics_available,
                   "tokenizer": tokenizer, "engine": target.engine},
        "model": model.id,
        "max_model_len": model.max_model_len,
        "models_json": redact_text(json.dumps(target.raw_models, default=str), [api_key]),
        "workloads": [w.to_dict() for w in spec.workloads],
        "load": {
            "concurrency": _list(spec.concurrency), "rates": _list(spec.rates), "arrival": spec.arrival,
            "max_concurrency": spec.max_concurrency, "requests": spec.requests, "duration_s": spec.duration_s,
            "warmup": spec.warmup, "timeout_s": spec.timeout_s, "ignore_eos": spec.ignore_eos,
        },
        "slos": dict(spec.slos),
        "tags": dict(spec.tags),
        "sweep": redact_sweep_table(spec.to_table(inline_workloads=True)),  # secrets never stored
        "cells": [{**c.row(), "status": "planned"} for c in cells],
    }
    if spec.launch:
        meta["server"] = {"launch": redact_command(spec.launch), "variants": [redact_command(v) for v in spec.variants],
                          "args": server_args}
    if spec.electricity_price is not None:
        meta["electricity_usd_per_kwh"] = spec.electricity_price
    return meta


def ran_with(spec: SweepSpec, tokenizer: str) -> dict[str, Any]:
    """What a cell really runs with beyond its plan (a resumed sweep may differ from its first part): the
    columns each cell's row adds to `Cell.row()`."""
    return {"tokenizer": tokenizer, "transport": spec.transport,
            "telemetry_interval": dump_interval(spec.telemetry_interval_s)}


def _list(v: tuple[Any, ...] | None) -> list[Any] | None:
    return list(v) if v is not None else None
