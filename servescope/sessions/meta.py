"""session.toml, typed: `SessionMeta.from_dict(meta, where)` validates what a session's metadata holds.

TOML has no null, so every key that may be absent has a default. `kind` says what the session holds: a sweep
(cells, the default) or a quality probe alone ("quality": quality.json, no cells); a sweep may hold quality
results too, and then its `quality` table records the probe's settings. Unknown keys are ignored (a newer
servescope may add some); a key of the wrong type is a ServescopeError naming the file and the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from servescope.core.errors import ServescopeError
from servescope.sessions.provenance import SourceMeta


class TargetMeta(msgspec.Struct, frozen=True, kw_only=True):
    url: str = "?"
    version: str | None = None
    metrics: bool | None = None
    tokenizer: str | None = None
    engine: str | None = None  # "vllm" | "llamacpp" | "openai" (older sessions: absent)


class ServerMeta(msgspec.Struct, frozen=True, kw_only=True):
    """Set when servescope launched the server: its command, the variants swept, the arguments it ran with."""

    launch: str | None = None
    variants: list[str] = msgspec.field(default_factory=list)
    args: dict[str, object] | list[object] | str | None = None  # as the server reported them (older: a list, a text)
    variant_args: dict[str, dict[str, object] | list[object] | str] = msgspec.field(default_factory=dict)


class PlannedCell(msgspec.Struct, frozen=True, kw_only=True):
    """A cell of the plan (`[[cells]]`): what was asked of it (`Cell.row()`: workload, load, repeat, server
    variant), what it ran with (tokenizer, transport, telemetry interval: added when it is written) and its
    status. The one place a cell's load is stored (schema 4); cells.parquet holds what was measured, by
    `index`, and `Session.cells` joins the two. The writer finds a cell by its index."""

    index: int
    status: str = "planned"
    reason: str = ""
    server_variant: str = ""
    workload: str | None = None
    api: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    arrival: str | None = None
    max_concurrency: int | None = None
    burstiness: float | None = None
    ramp_s: float | None = None
    pattern: str | None = None
    requests_planned: int | None = None
    duration_s_planned: float | None = None
    warmup: int | None = None
    load_label: str | None = None  # the load as people read it ("c=4"); comparisons join on the numbers
    repeat: int | None = None
    tokenizer: str | None = None
    transport: str | None = None
    telemetry_interval: str | None = None


# cells.parquet's columns that come from the plan ([[cells]]) in schema 4, in their order, with their types
PLAN_COLUMNS: tuple[tuple[str, type], ...] = (
    ("index", int), ("server_variant", str), ("workload", str), ("api", str), ("concurrency", int), ("rate", float),
    ("arrival", str), ("max_concurrency", int), ("burstiness", float), ("ramp_s", float), ("pattern", str),
    ("requests_planned", int), ("duration_s_planned", float), ("warmup", int), ("load_label", str), ("repeat", int),
    ("tokenizer", str), ("transport", str), ("telemetry_interval", str))


class SessionEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the session's event log (`[[events]]`: resumed, server_lost, quality, ...)."""

    time: str = ""
    kind: str = ""
    text: str = ""


class SessionMeta(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int
    servescope_version: str = "?"
    host: str = "?"
    started_at: str | None = None
    ended_at: str | None = None
    status: str = "unknown"
    message: str = ""
    name: str | None = None
    target: TargetMeta = msgspec.field(default_factory=TargetMeta)
    model: str = "?"
    max_model_len: int | None = None
    models_json: str | None = None
    # the tables below are passed through as written: each is read (and checked) where it is used
    workloads: list[dict[str, object]] = msgspec.field(default_factory=list)  # workload tables (Workload.to_dict)
    slos: dict[str, float] = msgspec.field(default_factory=dict)
    tags: dict[str, object] = msgspec.field(default_factory=dict)  # TOML values, strings when servescope wrote them
    cells: list[PlannedCell] = msgspec.field(default_factory=list)
    events: list[SessionEvent] = msgspec.field(default_factory=list)
    server: ServerMeta | None = None
    telemetry: dict[str, object] | None = None
    kv_budget: dict[str, object] | None = None
    gpu: dict[str, object] | None = None
    electricity_usd_per_kwh: float | None = None
    import_: dict[str, object] | None = msgspec.field(default=None, name="import")  # older imports (vllm bench)
    source: SourceMeta | None = None  # an imported session's tool, files and definitions (sessions/provenance.py)
    sweep: dict[str, object] | None = None  # the sweep-file table; SweepSpec.from_table validates it
    kind: str = "sweep"  # "sweep" | "quality" (a quality probe alone: no cells, quality.json) | "tune" (a search:
    # its cells are sessions under cells/, its answer the [tune] table); older: "sweep"
    quality: dict[str, object] | None = None  # the quality probe's settings when the session holds quality.json
    tune: dict[str, object] | None = None  # servescope tune's search and answer (kind "tune")

    @classmethod
    def from_dict(cls, meta: Mapping[str, object], where: str) -> SessionMeta:
        """Validate `meta` (session.toml as a dict); a wrong type -> ServescopeError `where: key: what`."""
        if not isinstance(meta, Mapping):
            raise ServescopeError(f"{where}: expected a table, got {type(meta).__name__}")
        slos = meta.get("slos")
        if isinstance(slos, Mapping):  # msgspec names a dict's bad value `slos[...]`: say which
            for k, v in slos.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ServescopeError(f"{where}: slos.{k}: expected float, got {type(v).__name__}")
        cells = meta.get("cells")
        for i, c in enumerate(cells if isinstance(cells, list) else []):  # the writer finds a cell by its index
            idx = c.get("index") if isinstance(c, Mapping) else 0  # not a table: msgspec's message says so
            if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
                raise ServescopeError(f"{where}: cells[{i}].index: expected a cell number, got "
                                      f"{'nothing' if idx is None else type(idx).__name__}; the file is damaged: "
                                      "restore it from a copy")
        try:
            return msgspec.convert(dict(meta), cls, strict=True)
        except msgspec.ValidationError as e:
            raise ServescopeError(f"{where}: {_explain(str(e))}") from None

    @property
    def workload_names(self) -> list[str]:
        """The workloads in plan order, then any a planned cell names that the workload list lacks."""
        names = [str(w.get("name")) for w in self.workloads]
        for c in self.cells:
            if str(c.workload) not in names:
                names.append(str(c.workload))
        return names


_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _explain(msg: str) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.load.warmup`' -> 'load.warmup: expected int, got str'."""
    miss = re.match(r"^Object missing required field `(?P<f>[^`]*)`(?: - at `\$(?P<path>[^`]*)`)?$", msg.strip())
    if miss:
        return ".".join(x for x in ((miss.group("path") or "").lstrip("."), miss.group("f")) if x) + ": missing"
    m = _AT.match(msg.strip())
    what = (m.group("what") if m else msg).replace("`", "")
    path = (m.group("path") or "").lstrip(".") if m else ""
    path = path or "session.toml"
    what = what[:1].lower() + what[1:]
    return f"{path}: {what}".replace("\n", " ")
