"""What a sweep session records about itself: session.toml's metadata (the target, the model, the workloads,
the planned cells, each with its load: the one place a cell's load is stored; the sweep's load as asked is
its [sweep.load]) and the settings each cell's row records that it really ran with. Plain
functions of the sweep, so that the runner and anything else that writes a sweep session write one shape."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from servescope.core.launchspec import ArgValue
from servescope.core.secrets import redact_command, redact_sweep_table, redact_text
from servescope.core.target import ModelInfo, TargetInfo
from servescope.engine.fields import dump_interval
from servescope.engine.plan import Cell
from servescope.engine.spec import SweepSpec
from servescope.sessions.meta import PlannedCell, ServerMeta, SessionMeta, TargetMeta

__all__ = ["ran_with", "session_meta"]

def session_meta(spec: SweepSpec, cells: Sequence[Cell], *, name: str, label: str, target: TargetInfo,
                 model: ModelInfo, tokenizer: str, api_key: str | None = None,
                 server_args: Mapping[str, ArgValue] | None = None) -> SessionMeta:
    """session.toml's table for a new sweep session (the store adds its own keys: schema_version, host, status,
    ...): `label` is the target as shown and stored (`sim://tiny`, never a key), `tokenizer` the tokenizer's name,
    `server_args` the launched server's arguments (recorded only when the sweep launches its server). The API key
    never lands in it."""
    return SessionMeta(
        name=name,
        target=TargetMeta(url=label, version=target.version, metrics=target.metrics_available, tokenizer=tokenizer,
                          engine=target.engine, connect_ms=target.connect_ms, tls_handshake_ms=target.tls_handshake_ms,
                          tls_verify=target.tls_verify, tls_ca=target.tls_ca or None),
        model=model.id,
        max_model_len=model.max_model_len,
        models_json=redact_text(json.dumps(target.raw_models, default=str), [api_key]),
        workloads=[w.to_dict() for w in spec.workloads],
        slos=dict(spec.slos),
        tags=dict(spec.tags),
        sweep=redact_sweep_table(spec.to_table(inline_workloads=True)),  # secrets never stored
        cells=[PlannedCell(**c.row()) for c in cells],
        server=ServerMeta(launch=redact_command(spec.launch), variants=[redact_command(v) for v in spec.variants],
                          args=dict(server_args) if server_args is not None else None) if spec.launch else None,
        electricity_usd_per_kwh=spec.electricity_price,
        price_usd_per_1m_input_tokens=spec.price.input if spec.price is not None else None,
        price_usd_per_1m_output_tokens=spec.price.output if spec.price is not None else None,
        gpu_usd_per_hour=spec.gpu_hour,
    )


def ran_with(spec: SweepSpec, tokenizer: str) -> dict[str, str]:
    """What a cell really runs with beyond its plan (a resumed sweep may differ from its first part): the
    columns each cell's row adds to `Cell.row()`."""
    return {"tokenizer": tokenizer, "transport": spec.transport,
            "telemetry_interval": dump_interval(spec.telemetry_interval_s)}
