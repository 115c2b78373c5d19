"""session.toml, one typed schema: `SessionMeta` is what a session's metadata holds, written by the store
(`SessionWriter`: created whole, then changed by typed updates) and read once per session (`read_meta`), every
table typed: the target, the server, the planned cells, the events, the telemetry, GPU and KV-budget tables, the
prices, the quality probe's settings, an import's provenance and a tune's search. The one table left as it is
written is [sweep]: the sweep-file format, whose schema is `SweepSpec` (servescope.engine.spec), which writes it
and reads it back (`servescope resume`, `run --sweep SESSION/session.toml`).

TOML has no null, so every key that may be absent has a default. `kind` says what the session holds: a sweep
(cells, the default), a quality probe alone ("quality": quality.json, no cells) or a search ("tune": its cells
are sessions of their own, its answer the [tune] table); a sweep may hold quality results too, and then its
[quality] table records the probe's settings. Unknown keys are ignored (a newer servescope may add some); a key
of the wrong type is a ServescopeError naming the file and the key. Older schemas are migrated when read
(`read_meta`: schema 1's sweep rebuilt as a [sweep] table); `SessionWriter.open` brings a resumed session to
this schema on disk.

This module imports neither polars nor the engine: the app and `watch` read a session's table cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import msgspec

from servescope.core.errors import ServescopeError, error_text
from servescope.core.kvbudget import KvBudgetMeta
from servescope.core.launchspec import ArgValue
from servescope.core.textsafe import clean_text
from servescope.sessions.provenance import SourceMeta
from servescope.workloads.spec import WorkloadTable, parse_toml

__all__ = ["PLAN_COLUMNS", "SCHEMA_VERSION", "SESSION_STATUSES", "GpuTable", "ImportMeta", "InputLengths",
           "MetaUpdate", "PlannedCell", "QualityMeta", "ServerMeta", "SessionEvent", "SessionMeta", "SweepTable",
           "TargetMeta", "TelemetryTable", "TuneBest", "TuneDim", "TuneMeta", "TunePrediction", "TuneRunnerUp",
           "TuneRunning", "TuneStep", "damaged", "migrate_v1", "read_meta"]

# 5: cells.parquet's summary columns named by their figure keys (`ttft_ms.p50`, `server.preemptions`: the one spelling
# of a figure, core.results.summary_columns; older: `ttft_ms_p50`, migrated when read);
# 4: each cell's plan stored once, in [[cells]] (no [load] table, no plan columns in cells.parquet);
# 3: each distribution's `n` in the cells' summaries; 2: the [sweep] table; older ones read as they are
SCHEMA_VERSION = 5
# what session.toml's `status` may say (a runner that died while `running` reads as interrupted; "unknown": a file
# that says nothing)
SESSION_STATUSES = ("running", "completed", "interrupted", "failed")

TagValue = str | int | float | bool  # a tag as TOML holds it (servescope writes strings)
SweepTable = dict[str, object]  # the sweep-file table: SweepSpec.to_table() writes it, SweepSpec.from_table reads it


class _Table(msgspec.Struct, frozen=True, kw_only=True):
    """A session.toml table (a value left None is not written: TOML has no null)."""


class TargetMeta(_Table, frozen=True):
    url: str = "?"
    version: str | None = None
    metrics: bool | None = None
    tokenizer: str | None = None
    engine: str | None = None  # "vllm" | "llamacpp" | "openai" (older sessions: absent)
    # how a new connection cost, measured apart from any request (core/tls.py measure_handshakes: ms, p50); and for
    # an https target whether its certificate was verified (false: --insecure) and the --ca-cert file's name
    connect_ms: float | None = None
    tls_handshake_ms: float | None = None
    tls_verify: bool | None = None
    tls_ca: str | None = None


ServerArgs = dict[str, ArgValue] | list[ArgValue] | str  # as the server reported them (older: a list, a text)


class ServerMeta(_Table, frozen=True):
    """Set when servescope launched the server: its command, the variants swept, the arguments it ran with."""

    launch: str | None = None
    variants: list[str] = msgspec.field(default_factory=list)
    args: ServerArgs | None = None
    variant_args: dict[str, ServerArgs] = msgspec.field(default_factory=dict)  # variant number -> its arguments


class PlannedCell(_Table, frozen=True):
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
    # whether the cell's requests/cell-NNNN.parquet was written (None: written before the key; a done or stopped
    # cell measured by servescope has one)
    requests_file: bool | None = None


# cells.parquet's columns that come from the plan ([[cells]]) in schema 4, in their order, with their types
PLAN_COLUMNS: tuple[tuple[str, type], ...] = (
    ("index", int), ("server_variant", str), ("workload", str), ("api", str), ("concurrency", int), ("rate", float),
    ("arrival", str), ("max_concurrency", int), ("burstiness", float), ("ramp_s", float), ("pattern", str),
    ("requests_planned", int), ("duration_s_planned", float), ("warmup", int), ("load_label", str), ("repeat", int),
    ("tokenizer", str), ("transport", str), ("telemetry_interval", str))


class SessionEvent(_Table, frozen=True):
    """One line of the session's event log (`[[events]]`: resumed, server_lost, quality, ...)."""

    time: str = ""
    kind: str = ""
    text: str = ""


class TelemetryTable(TypedDict, total=False):
    """[telemetry]: whether /metrics is sampled, how often, or why not."""

    metrics: bool
    interval_s: float | str  # "cell boundaries" when sampled only there
    metrics_reason: str


class GpuTable(TypedDict, total=False):
    """[gpu]: how many GPUs are sampled, or why none is."""

    available: bool
    count: int
    reason: str


class InputLengths(_Table, frozen=True):
    """[input_lengths]: how prompts were sized without the server's tokenizer ("calibrated" on its usage)."""

    method: str = ""
    probes: int = 0
    tokens_per_word: float | None = None


class QualityMeta(_Table, frozen=True):
    """[quality]: the quality probe's settings (servescope.engine.quality.QualitySpec.settings: never a secret)
    and when it measured."""

    tasks: list[str] = msgspec.field(default_factory=list)
    contexts: list[int] = msgspec.field(default_factory=list)
    n: int | None = None
    user_sets: list[str] = msgspec.field(default_factory=list)
    reference: str | None = None
    top_k: int | None = None
    divergence_tokens: int | None = None
    perplexity: bool | None = None
    divergence: bool | None = None
    seed: int | None = None
    concurrency: int | None = None
    measured_at: str | None = None


class ImportMeta(_Table, frozen=True):
    """[import]: where an imported session came from (servescope.sessions.importers)."""

    format: str = ""
    files: list[str] = msgspec.field(default_factory=list)
    detailed: bool = False  # the files held each request (--save-detailed)
    dates: list[str] = msgspec.field(default_factory=list)
    lacks: dict[str, str] = msgspec.field(default_factory=dict)  # figure -> why the import cannot give it
    vllm_reported: list[dict[str, int | float]] = msgspec.field(default_factory=list)  # per cell, vLLM's own figures


class TuneDim(_Table, frozen=True):
    flag: str = ""
    values: list[str] = msgspec.field(default_factory=list)
    scale: str = "list"  # "log" | "list"


class TuneBest(_Table, frozen=True):
    server_args: str = ""
    concurrency: int = 0
    objective: float = 0.0
    ci: list[float] = msgspec.field(default_factory=list)  # [low, high], or none
    serve: str = ""  # the command that serves it (a launched search)


class TuneRunnerUp(_Table, frozen=True):
    server_args: str = ""
    concurrency: int = 0
    objective: float = 0.0
    measured: bool = False
    why: str = ""


class TuneStep(_Table, frozen=True):
    """One measured cell of the search path, in order."""

    step: int = 0
    server_args: str = ""
    concurrency: int = 0
    why: str = ""
    objective: float = 0.0
    relaunch: bool = False
    skipped: bool = False
    band: list[float] = msgspec.field(default_factory=list)  # [low, high] predicted before it was measured
    cell: str = ""  # its session's folder under the tune session


class TunePrediction(_Table, frozen=True):
    server_args: str = ""
    concurrency: int = 0
    low: float = 0.0
    mid: float = 0.0
    high: float = 0.0


class TuneRunning(_Table, frozen=True):
    """The cell being measured while the search runs."""

    step: int = 0
    server_args: str = ""
    concurrency: int = 0
    cell: str = ""


class TuneMeta(_Table, frozen=True):
    """[tune]: `servescope tune`'s search (servescope.engine.tunerun writes it: while it runs, after every step
    and when a cell starts; when it ends, with `stop`)."""

    objective: str = ""  # "goodput" | "capacity"
    unit: str = ""
    search: list[TuneDim] = msgspec.field(default_factory=list)
    loads: list[int] = msgspec.field(default_factory=list)
    grid_cells: int = 0
    budget: int = 0
    cells_measured: int = 0
    relaunches: int = 0
    confirmed: bool = False
    stop: str | None = None  # why the search stopped: set only when it finished
    seconds: float | None = None
    fits: str = ""
    best: TuneBest | None = None
    runner_up: TuneRunnerUp | None = None
    path: list[TuneStep] = msgspec.field(default_factory=list)
    predicted: list[TunePrediction] = msgspec.field(default_factory=list)
    running: TuneRunning | None = None

    @property
    def partial(self) -> bool:
        """Written while the search ran (it has no `stop`, which the finished table always has)."""
        return self.stop is None


class SessionMeta(msgspec.Struct, frozen=True, kw_only=True):
    """session.toml. `SessionMeta.from_dict` reads a table; `read_meta` a file."""

    schema_version: int = SCHEMA_VERSION
    servescope_version: str = "?"
    host: str = "?"
    started_at: str | None = None
    ended_at: str | None = None
    status: str = "unknown"
    message: str = ""
    name: str | None = None
    kind: str = "sweep"  # "sweep" | "quality" | "tune"
    target: TargetMeta = msgspec.field(default_factory=TargetMeta)
    model: str = "?"
    max_model_len: int | None = None
    models_json: str | None = None  # /v1/models as the server answered it (JSON text)
    workloads: list[WorkloadTable] = msgspec.field(default_factory=list)  # Workload.to_dict()
    slos: dict[str, float] = msgspec.field(default_factory=dict)
    tags: dict[str, TagValue] = msgspec.field(default_factory=dict)
    sweep: SweepTable | None = None
    cells: list[PlannedCell] = msgspec.field(default_factory=list)
    events: list[SessionEvent] = msgspec.field(default_factory=list)
    server: ServerMeta | None = None
    telemetry: TelemetryTable | None = None
    gpu: GpuTable | None = None
    kv_budget: KvBudgetMeta | None = None
    # prices (core/prices.py prices_of_meta; prices are not secrets): --electricity-price, --price, --gpu-hour
    electricity_usd_per_kwh: float | None = None
    price_usd_per_1m_input_tokens: float | None = None
    price_usd_per_1m_output_tokens: float | None = None
    gpu_usd_per_hour: float | None = None
    input_lengths: InputLengths | None = None
    ignore_eos_dropped: str | None = None  # the server refused ignore_eos: its answer
    import_: ImportMeta | None = msgspec.field(default=None, name="import")  # older imports (vllm bench)
    source: SourceMeta | None = None  # an imported session's tool, files and definitions (sessions/provenance.py)
    quality: QualityMeta | None = None
    tune: TuneMeta | None = None

    @classmethod
    def from_dict(cls, meta: Mapping[str, object], where: str) -> SessionMeta:
        """Validate `meta` (session.toml as a table); a wrong type -> ServescopeError `where: key: what`."""
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
        status = meta.get("status")
        if status is not None and status not in SESSION_STATUSES:
            raise ServescopeError(f"{where}: status {clean_text(repr(status))[:60]} is not a session status "
                                  f"({', '.join(SESSION_STATUSES)}); the file is damaged: restore it from a copy, or "
                                  "move its session directory out of the sessions folder")
        try:
            return msgspec.convert(dict(meta), cls, strict=True)
        except msgspec.ValidationError as e:
            raise ServescopeError(f"{where}: {_explain(str(e))}") from None

    def to_table(self) -> dict[str, object]:
        """As session.toml holds it: plain TOML values (None left out by the writer)."""
        table: dict[str, object] = msgspec.to_builtins(self)
        return table

    @property
    def workload_names(self) -> list[str]:
        """The workloads in plan order, then any a planned cell names that the workload list lacks."""
        names = [str(w.get("name")) for w in self.workloads]
        for c in self.cells:
            if str(c.workload) not in names:
                names.append(str(c.workload))
        return names


class MetaUpdate(TypedDict, total=False):
    """What a writer changes in a session's table after creating it (`SessionWriter.update(**changes)`), each
    key typed as SessionMeta declares it (tests/sessions/test_meta.py holds the two equal). The plan's cells,
    the events, the server's variant arguments, the quality settings and the end are changed by the writer's
    own methods."""

    status: str
    message: str
    name: str | None
    model: str
    max_model_len: int | None
    models_json: str | None
    target: TargetMeta
    sweep: SweepTable | None
    telemetry: TelemetryTable | None
    gpu: GpuTable | None
    kv_budget: KvBudgetMeta | None
    input_lengths: InputLengths | None
    ignore_eos_dropped: str | None
    tune: TuneMeta | None


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


# ---- reading --------------------------------------------------------------------------------------------
def damaged(file: Path, e: BaseException) -> ServescopeError:
    """One line for a session file that cannot be decoded: which file, why, and what to do."""
    reason = clean_text(str(e)).split("\n")[0][:160] or error_text(e)
    return ServescopeError(f"{file}: cannot be read ({reason}); the file is damaged (truncated or overwritten): "
                           "restore it from a copy, or move its session directory out of the sessions folder")


def read_meta(toml_path: Path) -> SessionMeta:
    """session.toml, typed (older schemas migrated); a file that is empty, not TOML, not a session's, from a newer
    servescope or with a key of the wrong type is a ServescopeError saying so."""
    if toml_path.exists() and not toml_path.is_file():
        raise ServescopeError(f"{toml_path}: a directory, not a file: the session is damaged; restore "
                              "session.toml from a copy, or move its session directory out of the sessions folder")
    try:
        text = toml_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise damaged(toml_path, e) from None
    except OSError as e:
        raise ServescopeError(f"{toml_path}: cannot read it ({clean_text(e.strerror or str(e))}); "
                              "check its permissions") from None
    if not text.strip():
        raise ServescopeError(f"{toml_path}: the file is empty, not a session (a copy or a write cut short?); "
                              "restore it from a copy, or move its session directory out of the sessions folder")
    return meta_of_table(parse_toml(text, str(toml_path)), str(toml_path))


def meta_of_table(meta: Mapping[str, object], where: str) -> SessionMeta:
    """A session's table as parsed (session.toml, a baseline file's `meta`), its schema checked and migrated."""
    ver = meta.get("schema_version")
    if ver is None:
        raise ServescopeError(f"{where}: no schema_version: not a servescope session.toml (or one cut short); "
                              "restore it from a copy, or move its session directory out of the sessions folder")
    if isinstance(ver, bool) or not isinstance(ver, int) or ver < 1:
        raise ServescopeError(f"{where}: schema_version {clean_text(repr(ver))} is not a session schema "
                              "version (1, 2, ...); the file is damaged: restore it from a copy")
    if ver > SCHEMA_VERSION:
        raise ServescopeError(f"{where}: session schema_version {ver} is newer than this servescope "
                              f"understands ({SCHEMA_VERSION}); upgrade servescope")
    if ver < 2:
        meta = migrate_v1(meta)
    return SessionMeta.from_dict(meta, where)


def _table(v: object) -> dict[str, object]:
    return {str(k): x for k, x in v.items()} if isinstance(v, Mapping) else {}


def _array(v: object) -> list[object]:
    return list(v) if isinstance(v, list) else []


def migrate_v1(meta: Mapping[str, object]) -> dict[str, object]:
    """A schema-1 session (servescope 0.1) read as schema 2: its sweep rebuilt as a [sweep] table from what
    it recorded (the settings 0.1 did not record, tokenizer, transport and telemetry interval, were the
    defaults then). The file on disk is rewritten only when the session is written again (resume)."""
    out = dict(meta)
    out["schema_version"] = 2
    load = _table(meta.get("load"))
    server = _table(meta.get("server"))
    target = _table(meta.get("target"))
    names: list[str] = []
    inline: list[object] = []
    for w in _array(meta.get("workloads")):
        if not isinstance(w, dict):
            continue
        if w.get("source") == "preset":
            names.append(str(w.get("name")))
        else:
            inline.append(dict(w))
    sweep: SweepTable = {"sweep_version": 1}
    if meta.get("name"):
        sweep["name"] = meta["name"]
    if names:
        sweep["workloads"] = names
    tgt = {} if server.get("launch") else {"url": target.get("url", "sim://")}
    if meta.get("model"):
        tgt["model"] = meta["model"]
    sweep["target"] = tgt
    if inline:
        sweep["workload"] = inline
    ld = {}
    for src, dst in (("concurrency", "concurrency"), ("rates", "rates"), ("arrival", "arrival"),
                     ("max_concurrency", "max_concurrency"), ("requests", "requests"), ("warmup", "warmup"),
                     ("ignore_eos", "ignore_eos")):
        if load.get(src) is not None:
            ld[dst] = load[src]
    for src, dst in (("duration_s", "duration"), ("timeout_s", "timeout")):
        if load.get(src) is not None:
            ld[dst] = f"{load[src]}s"
    if "arrival" not in ld:
        ld["arrival"] = "constant"  # 0.1's runner default when a session did not say
    sweep["load"] = ld
    if meta.get("slos"):
        sweep["slo"] = _table(meta["slos"])
    if meta.get("tags"):
        sweep["tags"] = _table(meta["tags"])
    if server.get("launch"):
        sweep["server"] = {"launch": server["launch"],
                           "variants": [{"args": v} for v in _array(server.get("variants"))]}
    if meta.get("electricity_usd_per_kwh") is not None:
        sweep["telemetry"] = {"electricity_price": meta["electricity_usd_per_kwh"]}
    out.setdefault("sweep", sweep)
    return out
