"""What a sweep session records about itself: session.toml's metadata (the target, the model, the workloads,
the planned cells, each with its load: the one place a cell's load is stored; the sweep's load as asked is
its [sweep.load]) and the settings each cell's row records that it really ran with. Plain
functions of the sweep, so that the runner and anything else that writes a sweep session write one shape."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

from servescope.core.secrets import redact_command, redact_sweep_table, redact_text
from servescope.core.target import ModelInfo, TargetInfo
from servescope.engine.fields import dump_interval
from servescope.engine.plan import Cell
from servescope.engine.spec import SweepSpec

__all__ = ["NewSessionMeta", "ran_with", "session_meta"]

class TargetTable(TypedDict):
    url: str
    version: str | None
    metrics: bool
    tokenizer: str
    engine: str
    # how a new connection cost, measured apart from any request (core/tls.py measure_handshakes: ms, p50); and
    # for an https target whether its certificate was verified (false: --insecure) and the --ca-cert file's name
    connect_ms: NotRequired[float]
    tls_handshake_ms: NotRequired[float]
    tls_verify: NotRequired[bool]
    tls_ca: NotRequired[str]


class ServerTable(TypedDict):
    launch: str
    variants: list[str]
    args: Mapping[str, object] | None


class NewSessionMeta(TypedDict):
    """session.toml as a new sweep writes it (servescope.sessions.meta.SessionMeta reads it back); the store
    adds its own keys (schema_version, host, status, ...), None values are left out of the file."""

    name: str
    target: TargetTable
    model: str
    max_model_len: int | None
    models_json: str
    workloads: list[Mapping[str, object]]  # Workload.to_dict()
    slos: dict[str, float]
    tags: dict[str, str]
    sweep: Mapping[str, object]  # the sweep-file table (SweepSpec.to_table), its secrets redacted
    cells: list[Mapping[str, object]]  # Cell.row() and its status
    server: NotRequired[ServerTable]  # a launched server's command and arguments
    electricity_usd_per_kwh: NotRequired[float]
    price_usd_per_1m_input_tokens: NotRequired[float]  # --price (read back by core/prices.py prices_of_meta)
    price_usd_per_1m_output_tokens: NotRequired[float]
    gpu_usd_per_hour: NotRequired[float]  # --gpu-hour


def session_meta(spec: SweepSpec, cells: Sequence[Cell], *, name: str, label: str, target: TargetInfo,
                 model: ModelInfo, tokenizer: str, api_key: str | None = None,
                 server_args: Mapping[str, object] | None = None) -> NewSessionMeta:
    """session.toml's metadata for a new sweep session: `label` is the target as shown and stored
    (`sim://tiny`, never a key), `tokenizer` the tokenizer's name, `server_args` the launched server's
    arguments (recorded only when the sweep launches its server). The API key never lands in it."""
    meta: NewSessionMeta = {
        "name": name,
        "target": {"url": label, "version": target.version, "metrics": target.metrics_available,
                   "tokenizer": tokenizer, "engine": target.engine},
        "model": model.id,
        "max_model_len": model.max_model_len,
        "models_json": redact_text(json.dumps(target.raw_models, default=str), [api_key]),
        "workloads": [w.to_dict() for w in spec.workloads],
        "slos": dict(spec.slos),
        "tags": dict(spec.tags),
        "sweep": redact_sweep_table(spec.to_table(inline_workloads=True)),  # secrets never stored
        "cells": [{**c.row(), "status": "planned"} for c in cells],
    }
    if spec.launch:
        meta["server"] = {"launch": redact_command(spec.launch), "variants": [redact_command(v) for v in spec.variants],
                          "args": server_args}
    if target.connect_ms is not None:
        meta["target"]["connect_ms"] = target.connect_ms
    if target.tls_handshake_ms is not None:
        meta["target"]["tls_handshake_ms"] = target.tls_handshake_ms
    if target.tls_verify is not None:
        meta["target"]["tls_verify"] = target.tls_verify
    if target.tls_ca:
        meta["target"]["tls_ca"] = target.tls_ca
    if spec.electricity_price is not None:
        meta["electricity_usd_per_kwh"] = spec.electricity_price
    if spec.price is not None:
        meta["price_usd_per_1m_input_tokens"] = spec.price.input
        meta["price_usd_per_1m_output_tokens"] = spec.price.output
    if spec.gpu_hour is not None:
        meta["gpu_usd_per_hour"] = spec.gpu_hour
    return meta


def ran_with(spec: SweepSpec, tokenizer: str) -> dict[str, str]:
    """What a cell really runs with beyond its plan (a resumed sweep may differ from its first part): the
    columns each cell's row adds to `Cell.row()`."""
    return {"tokenizer": tokenizer, "transport": spec.transport,
            "telemetry_interval": dump_interval(spec.telemetry_interval_s)}
