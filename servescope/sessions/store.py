"""Sessions on disk: one directory per run.

    session.toml         metadata (schema_version, target, model, workloads, SLOs, tags, status), every planned
                         cell ([[cells]]: its workload, its load, its status: the one place a cell's plan is
                         stored), and the whole sweep as a [sweep] table in the sweep-file format (its
                         [sweep.load] the load as asked), from which `servescope resume` and
                         `servescope run --sweep SESSION/session.toml` start
    cells.parquet        one row per finished or skipped cell: its index, status and summary (what was
                         measured); `Session.cells` joins each row to its plan
    requests/cell-NNNN.parquet   one row per request of that cell: raw stamps and counts
    quality.json         the quality probe's results (core.quality.QualityResult.to_dict()), when it ran: in a
                         session of kind "quality" (no cells) or beside a sweep's cells; session.toml's
                         [quality] table holds the probe's settings

Every file is written to a temporary name and renamed, and each finished cell is on disk before the next
cell starts, so kill -9 loses at most the cell that was running (session.toml then still says "running").
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import tomli_w

from servescope import __version__
from servescope.core.cost import with_cost
from servescope.core.errors import ServescopeError, error_text
from servescope.core.prices import prices_of_meta
from servescope.core.quality import QualityResult
from servescope.core.results import CellResult
from servescope.core.secrets import redact_meta
from servescope.core.textsafe import clean_text, slug
from servescope.sessions.live import BUS_FILES, RunnerState, runner_state, write_failed
from servescope.sessions.meta import PLAN_COLUMNS, SessionMeta
from servescope.workloads.spec import parse_toml

# 4: each cell's plan stored once, in [[cells]] (no [load] table, no plan columns in cells.parquet);
# 3: each distribution's `n` in the cells' summaries; 2: the [sweep] table; older ones read as they are
SCHEMA_VERSION = 4
QUALITY_FILE = "quality.json"
# what session.toml's `status` may say (a runner that died while `running` reads as interrupted)
SESSION_STATUSES = ("running", "completed", "interrupted", "failed")
# [[cells]] statuses whose cell has its row in cells.parquet (written by write_cell), and of those, the ones
# whose requests are in requests/cell-NNNN.parquet (a skipped cell ran none; a lost one's are in -lostN)
ROW_STATUSES = frozenset({"done", "stopped", "skipped", "server_lost"})
REQUEST_STATUSES = frozenset({"done", "stopped"})
# a [[cells]] entry's key saying whether the cell's requests/cell-NNNN.parquet was written (sessions written
# before it: a done or stopped cell measured by servescope has one)
REQUESTS_KEY = "requests_file"
# the columns every requests/cell-NNNN.parquet has held since the first schema, with their types: what reading a
# session's requests needs (its warmup flag, statuses, stamps, counts; not the error texts, which a baseline file
# leaves out); checked on the file's schema (its footer)
REQUEST_COLUMNS: dict[str, pl.DataType] = {
    "index": pl.Int64(), "user": pl.Int64(), "warmup": pl.Boolean(), "status": pl.String(),
    "http_status": pl.Int64(), "input_tokens_requested": pl.Int64(),
    "output_tokens_requested": pl.Int64(), "prompt_tokens": pl.Int64(), "output_tokens": pl.Int64(),
    "reasoning_tokens": pl.Int64(), "usage_reported": pl.Boolean(), "scheduled_ns": pl.Int64(),
    "sent_ns": pl.Int64(), "first_token_ns": pl.Int64(), "first_content_ns": pl.Int64(), "end_ns": pl.Int64(),
    "chunk_ns": pl.List(pl.Int64()), "chunk_tokens": pl.List(pl.Int64())}
_SECRET_KEYS = frozenset({"api_key", "api_key_env", "token", "password", "secret", "authorization", "headers"})


def sessions_home() -> Path:
    """$SERVESCOPE_HOME/sessions, else the user's data directory."""
    env = os.environ.get("SERVESCOPE_HOME")
    if env:
        return Path(env).expanduser() / "sessions"
    from platformdirs import user_data_dir

    return Path(user_data_dir("servescope", appauthor=False)) / "sessions"


def toml_clean(table: Mapping[str, object]) -> dict[str, object]:
    """TOML has no null: drop None values recursively."""
    return {str(k): _drop_none(v) for k, v in table.items() if v is not None}


def _drop_none(obj: object) -> object:
    if isinstance(obj, Mapping):
        return {str(k): _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [_drop_none(v) for v in obj if v is not None]
    return obj


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all (a temporary file, fsynced, then renamed over it). A write that
    fails (a full or read-only disk) leaves the file as it was, removes the temporary one (its space is freed)
    and is the one-line SessionWriteError."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_failed(path, e) from None


def write_parquet_atomic(path: Path, df: pl.DataFrame) -> None:
    _atomic_parquet(path, df)


def _atomic_parquet(path: Path, df: pl.DataFrame) -> None:
    """The frame as Parquet, encoded in memory and written with atomic_write: polars' own file writer reports a
    full disk as a Parquet ComputeError ("Invalid thrift"), this way it is the OS's error, said as such."""
    buf = io.BytesIO()
    df.write_parquet(buf)
    atomic_write(path, buf.getvalue())


def new_session_dir(base: Path | None, name: str) -> Path:
    base = base or sessions_home()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    d = base / f"{stamp}-{slug(name)}"
    i = 1
    while d.exists():
        i += 1
        d = base / f"{stamp}-{slug(name)}-{i}"
    return d


def _flatten(summary: Mapping[str, object]) -> dict[str, object]:
    """The summary's columns in cells.parquet (`ttft_ms_p50`, ...) beside its full `summary_json`. Of a cell's
    `quality` only the figures (`quality_accuracy`, `quality_n`, ...): its per-task table, keyed by task names
    that differ from cell to cell (and may be empty, which Parquet cannot hold), stays in summary_json, and so do
    the whole cell's figures beside a steady window's (`whole`: a second summary, read through CellResult)."""
    row: dict[str, object] = {}
    for k, v in summary.items():
        if isinstance(v, dict) and k not in ("input_tokens_mismatch", "server", "whole"):
            for sk, sv in v.items():
                if k == "quality" and not isinstance(sv, (int, float, str, bool)):
                    continue
                row[f"{k}_{sk}"] = sv
        elif isinstance(v, (int, float, str, bool)) or v is None:
            row[k] = v
    return row


summary_columns = _flatten

_PLAN_KEYS = frozenset(k for k, _ in PLAN_COLUMNS) - {"index"}
_POLARS_TYPES: dict[type, type[pl.DataType]] = {int: pl.Int64, float: pl.Float64, str: pl.Utf8}


def _index(row: Mapping[str, object]) -> int:
    idx = row.get("index")
    if not isinstance(idx, int) or isinstance(idx, bool):
        raise TypeError(f"a cell's index is a number, not {idx!r}")
    return idx


def _plan_part(row: Mapping[str, object]) -> dict[str, object]:
    """What a cell's row says about what was asked (its [[cells]] entry in session.toml)."""
    return {k: v for k, v in row.items() if k in _PLAN_KEYS}


def _measured_part(row: Mapping[str, object]) -> dict[str, object]:
    """What a cell's row says about what was measured (its row in cells.parquet): all but the plan."""
    return {k: v for k, v in row.items() if k not in _PLAN_KEYS}


def join_plan(cells: pl.DataFrame, planned: list[object]) -> pl.DataFrame:
    """cells.parquet's rows (schema 4) with their plan's columns from session.toml's [[cells]] before the
    measured ones, as every reader sees a session's cells; a column the file holds itself is kept."""
    if not cells.height or "index" not in cells.columns:
        return cells
    missing = [(k, t) for k, t in PLAN_COLUMNS if k != "index" and k not in cells.columns]
    if not missing:
        return cells
    by_index = {c["index"]: c for c in planned if isinstance(c, Mapping) and isinstance(c.get("index"), int)}
    rows = [by_index.get(i, {}) for i in cells["index"].to_list()]
    plan = pl.DataFrame([pl.Series(k, [_typed(r.get(k), t) for r in rows], dtype=_POLARS_TYPES[t]) for k, t in missing])
    joined = pl.concat([cells, plan], how="horizontal")
    order = [k for k, _ in PLAN_COLUMNS if k in joined.columns]
    return joined.select(order + [c for c in joined.columns if c not in order])


def _typed(v: object, t: type) -> object:
    """A [[cells]] value as its column's type; None where it is missing or of another type."""
    if isinstance(v, bool):
        return None
    if t is float:
        return float(v) if isinstance(v, (int, float)) else None
    return v if isinstance(v, t) else None


@dataclass
class SessionWriter:
    path: Path
    meta: dict[str, object]  # session.toml as it is written (SessionMeta reads it back)
    cell_rows: list[dict[str, object]] = field(default_factory=list)  # cells.parquet's rows

    @classmethod
    def create(cls, path: Path, meta: Mapping[str, object], exist_ok: bool = False) -> SessionWriter:
        """A new session directory; it may hold its runner's bus files already (servescope.sessions.live), and
        with `exist_ok` server logs (launched servers)."""
        try:
            path.mkdir(parents=True, exist_ok=False)
            (path / "requests").mkdir()
        except FileExistsError:
            if any(p for p in path.iterdir() if not (p.name in BUS_FILES or exist_ok and p.name.startswith("server-"))):
                raise ServescopeError(f"{path} already exists and is not empty; choose another --save directory") from None
            (path / "requests").mkdir(exist_ok=True)
        except OSError as e:
            raise ServescopeError(f"cannot create session directory {path}: {e.strerror}; choose another --save") from None
        full: dict[str, object] = {
            "schema_version": SCHEMA_VERSION,
            "servescope_version": __version__,
            "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "status": "running",
            **meta,
        }
        w = cls(path, full)
        w.save_meta()
        return w

    @classmethod
    def open(cls, path: Path) -> SessionWriter:
        """Reopen a session to continue it (`servescope resume`). A session of an older schema is brought to
        this one first (its cells' plans moved into [[cells]], its [load] table dropped) and saved so, before
        anything is added to it: a session on disk is always one schema, whole."""
        s = load_session(path)
        rows = s.cells.drop("summary_json").to_dicts() if "summary_json" in s.cells.columns else s.cells.to_dicts()
        if "summary_json" in s.cells.columns:
            for r, js in zip(rows, s.cells["summary_json"].to_list(), strict=True):
                r["summary_json"] = js
        try:
            (s.path / "requests").mkdir(exist_ok=True)
        except OSError as e:
            raise write_failed(s.path / "requests", e) from None
        w = cls(s.path, s.meta, [])
        upgrade = s.meta.get("schema_version") != SCHEMA_VERSION
        if upgrade:
            for r in rows:
                w._plan_entry(_index(r)).update({k: v for k, v in _plan_part(r).items() if v is not None})
            w.meta.pop("load", None)
            w.meta["schema_version"] = SCHEMA_VERSION
        w.cell_rows = [_measured_part(r) for r in rows]
        if upgrade:  # the plans first: the file's own columns still stand
            w.save_meta()
            _atomic_parquet(w.path / "cells.parquet", w._cells_frame())
        return w

    def add_event(self, kind: str, text: str) -> None:
        events = self.meta.get("events")
        if not isinstance(events, list):
            events = self.meta["events"] = []
        events.append({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kind": kind, "text": text})
        self.save_meta()

    def save_meta(self) -> None:
        # every string of the table through the one redaction (core.secrets.redact_meta): whatever filled it (a
        # launch line, a tune's sweep table, a serve line, an event's text), no secret reaches the disk
        atomic_write(self.path / "session.toml", tomli_w.dumps(toml_clean(redact_meta(self.meta))).encode())

    def _planned(self) -> list[dict[str, object]]:
        cells = self.meta.get("cells")
        return [c for c in cells if isinstance(c, dict)] if isinstance(cells, list) else []

    def _plan_entry(self, index: int) -> dict[str, object]:
        """The [[cells]] entry of cell `index`, added (as planned) when the plan lacks it (an imported run)."""
        for c in self._planned():
            if c.get("index") == index:
                return c
        cells = self.meta.get("cells")
        if not isinstance(cells, list):
            cells = self.meta["cells"] = []
        entry: dict[str, object] = {"index": index, "status": "planned"}
        cells.append(entry)
        return entry

    def cell_statuses(self) -> dict[int, str]:
        """Each planned cell's status by its index (a resumed sweep runs again only those not finished)."""
        return {i: str(c.get("status", "planned")) for c in self._planned() if isinstance(i := c.get("index"), int)}

    def set_cell_status(self, index: int, status: str, reason: str = "") -> None:
        for c in self._planned():
            if c["index"] == index:
                c["status"] = status
                if reason:
                    c["reason"] = reason
        self.save_meta()

    def set_variant_args(self, variant: int, args: Mapping[str, object]) -> None:
        """Record the arguments a relaunched server variant runs with ([server.variant_args]); save_meta() writes it."""
        server = self.meta.get("server")
        if not isinstance(server, dict):
            server = self.meta["server"] = {}
        by_variant = server.get("variant_args")
        if not isinstance(by_variant, dict):
            by_variant = server["variant_args"] = {}
        by_variant[str(variant)] = args

    def write_cell(self, plan_row: Mapping[str, object], requests: pl.DataFrame | None, summary: CellResult | None,
                   suffix: str = "") -> None:
        """Persist one finished (or skipped) cell: its requests, then the cell table, then the metadata.
        The summary is written as `summary_json` (`CellResult.to_dict()`, which reads back into the same
        CellResult) with its figures flattened into the table's columns. A `suffix` (a lost attempt: "-lost1")
        keeps that attempt's requests beside the re-run's."""
        idx = _index(plan_row)
        if requests is not None:
            _atomic_parquet(self.path / "requests" / f"cell-{idx:04d}{suffix}.parquet",
                            requests.with_columns(cell=pl.lit(idx)))
        entry = self._plan_entry(idx)
        entry.update({k: v for k, v in _plan_part(plan_row).items() if v is not None})
        entry[REQUESTS_KEY] = requests is not None and not suffix  # session.toml promises the file (load checks)
        row = _measured_part(plan_row)
        if summary is not None:
            summary = with_cost(summary, prices_of_meta(self.meta))  # --price / --gpu-hour (core/cost.py)
            d = summary.to_dict()
            row.update(_flatten(d))
            row["summary_json"] = json.dumps(d, default=str)
        self.cell_rows = [r for r in self.cell_rows if r["index"] != idx] + [row]
        _atomic_parquet(self.path / "cells.parquet", self._cells_frame())
        self.set_cell_status(idx, str(row.get("status", "done")), str(row.get("reason", "")))

    def _cells_frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.cell_rows, infer_schema_length=None)

    def write_quality(self, result: QualityResult, settings: Mapping[str, object]) -> None:
        """Persist the quality probe's results as quality.json, then its settings (tasks, contexts, n, top_k,
        seed, reference, task files: never a secret) as session.toml's [quality] table. A sweep session keeps its
        kind: it then holds quality results beside its speed."""
        data = json.dumps(result.to_dict(), indent=1, default=str).encode()  # NaN as NaN: json.loads reads it back
        atomic_write(self.path / QUALITY_FILE, data)
        table = {str(k): v for k, v in settings.items() if str(k).lower() not in _SECRET_KEYS}
        self.meta["quality"] = {**table, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.save_meta()

    def finish(self, status: str, message: str = "") -> None:
        """End the session as `status` (one of SESSION_STATUSES)."""
        if status not in SESSION_STATUSES:
            raise ValueError(f"{status!r} is not a session status ({', '.join(SESSION_STATUSES)})")
        self.meta["status"] = status
        self.meta["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if message:
            self.meta["message"] = message
        self.save_meta()


@dataclass
class Session:
    path: Path
    meta: dict[str, object]  # session.toml as read (schema 1 migrated); `info` is its typed view
    cells: pl.DataFrame

    @property
    def info(self) -> SessionMeta:
        """The metadata, typed and validated (servescope.sessions.meta.SessionMeta)."""
        return SessionMeta.from_dict(self.meta, str(self.path / "session.toml"))

    @property
    def status(self) -> str:
        """completed | running | interrupted | failed: a session.toml that says `running` is running only while
        its runner lives (its lock is held); else it was interrupted."""
        s = str(self.meta.get("status", "unknown"))
        if s != "running":
            return s
        return "running" if self.runner.running else "interrupted"

    @property
    def runner(self) -> RunnerState:
        """The session's runner as its lock tells (servescope.sessions.live.runner_state)."""
        return runner_state(self.path)

    def summaries(self) -> list[CellResult | None]:
        """Each cell row's summary, typed (None for a cell without one: skipped)."""
        if "summary_json" not in self.cells.columns:
            return []
        try:
            return [CellResult.from_json(s) for s in self.cells["summary_json"].to_list()]
        except _DECODE_ERRORS as e:  # a damaged summary is one line, never a traceback
            raise damaged(self.path / "cells.parquet", e) from None

    def quality(self) -> QualityResult | None:
        """The quality probe's results (quality.json), None when the session holds none; a file that cannot be
        decoded is the one-line damaged-file ServescopeError."""
        f = self.path / QUALITY_FILE
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ServescopeError(f"{f}: cannot read it ({clean_text(e.strerror or str(e))}); check its "
                                  "permissions") from None
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError(f"expected an object, got {type(doc).__name__}")
            return QualityResult.from_dict(doc)
        except _DECODE_ERRORS as e:  # JSON, UTF-8 or msgspec's validation: the file is damaged
            raise damaged(f, e) from None

    @property
    def has_quality(self) -> bool:
        """The session holds quality results (quality.json), whatever its kind."""
        return (self.path / QUALITY_FILE).is_file()

    def requests(self, cell: int | None = None) -> pl.DataFrame:
        d = self.path / "requests"
        files = request_files(self.path) if cell is None else [d / f"cell-{cell:04d}.parquet"]
        files = [f for f in files if f.exists()]
        if not files:
            return pl.DataFrame()
        frames = []
        for f in files:
            try:
                frames.append(pl.read_parquet(f))
            except _DECODE_ERRORS as e:  # polars/OS errors alike: the file is damaged
                raise damaged(f, e) from None
        try:
            return pl.concat(frames, how="diagonal_relaxed")
        except _DECODE_ERRORS as e:  # columns of incompatible types: damaged or foreign files
            raise damaged(d, e) from None


# what decoding a damaged file may raise: any Exception, and polars' PanicException (a BaseException)
_DECODE_ERRORS: tuple[type[BaseException], ...] = (Exception, pl.exceptions.PanicException)


def request_files(path: Path) -> list[Path]:
    """A session's per-request files of its final cell runs (not the `-lostN` attempts), in cell order."""
    d = path / "requests"
    return sorted(f for f in d.glob("cell-*.parquet") if "-lost" not in f.name) if d.is_dir() else []


def check_parquet_ends(f: Path) -> None:
    """Cheap check that a Parquet file is whole (its magic at both ends, its footer inside it): a file cut
    short (a copy, a full disk) fails here without reading it; the data is read when a report needs it."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(4)
            if size >= 12:
                fh.seek(size - 8)
            tail = fh.read(8)
    except OSError as e:
        raise ServescopeError(f"{f}: cannot read it ({clean_text(e.strerror or str(e))}); check its "
                              "permissions") from None
    footer = int.from_bytes(tail[:4], "little") if len(tail) == 8 else -1
    if size < 12 or head != b"PAR1" or tail[4:] != b"PAR1" or not 0 < footer <= size - 12:
        raise damaged(f, ValueError(f"not a whole Parquet file: {size} bytes, no footer at its end"))


def damaged(file: Path, e: BaseException) -> ServescopeError:
    """One line for a session file that cannot be decoded: which file, why, and what to do."""
    reason = clean_text(str(e)).split("\n")[0][:160] or error_text(e)
    return ServescopeError(f"{file}: cannot be read ({reason}); the file is damaged (truncated or overwritten): "
                           "restore it from a copy, or move its session directory out of the sessions folder")


def load_session(path: str | Path) -> Session:
    """Open a session, validating everything first: session.toml (TOML, schema_version, SessionMeta),
    cells.parquet, and the footer of each requests/cell-NNNN.parquet. Any decode error is a ServescopeError
    naming the file and what to do; nothing is written (loading never changes a session)."""
    p = Path(path)
    if not (p / "session.toml").exists():
        cand = sessions_home() / str(path)
        if (cand / "session.toml").exists():
            p = cand
        else:
            raise ServescopeError(f"{path}: not a servescope session (no session.toml); see `servescope sessions`")
    toml_path = p / "session.toml"
    meta = read_meta(toml_path)
    SessionMeta.from_dict(meta, str(toml_path))  # every key of the right type before anything reads it
    status = meta.get("status")
    if status is not None and status not in SESSION_STATUSES:
        raise ServescopeError(f"{toml_path}: status {clean_text(repr(status))[:60]} is not a session status "
                              f"({', '.join(SESSION_STATUSES)}); the file is damaged: restore it from a copy, or "
                              "move its session directory out of the sessions folder")
    cells_path = p / "cells.parquet"
    try:
        cells = pl.read_parquet(cells_path) if cells_path.exists() else pl.DataFrame()
    except _DECODE_ERRORS as e:  # polars raises ComputeError, OSError, even a PanicException
        raise damaged(cells_path, e) from None
    if cells.height and "index" not in cells.columns:
        raise damaged(cells_path, ValueError("no index column"))
    if int(str(meta.get("schema_version"))) >= 4:  # each cell's plan is in session.toml: every row needs one
        planned = {c.get("index") for c in _array(meta.get("cells")) if isinstance(c, Mapping)}
        lost = [i for i in (cells["index"].to_list() if cells.height else []) if i not in planned]
        if lost:
            raise damaged(toml_path, ValueError(f"cell {lost[0]} of cells.parquet has no [[cells]] entry (its plan)"))
        cells = join_plan(cells, _array(meta.get("cells")))
    _check_rows_promised(p, meta, cells)
    for f in request_files(p):
        check_parquet_ends(f)
        check_request_columns(f)
    s = Session(p, meta, cells)
    _check_requests_promised(s, s.summaries())
    return s


def _check_rows_promised(p: Path, meta: Mapping[str, object], cells: pl.DataFrame) -> None:
    """Every [[cells]] entry that says its cell was measured (or skipped) has its row in cells.parquet."""
    rows = set(cells["index"].to_list()) if cells.height else set()
    for c in _array(meta.get("cells")):
        if isinstance(c, Mapping) and c.get("status") in ROW_STATUSES and c.get("index") not in rows:
            what = "is missing" if not (p / "cells.parquet").exists() else f"has no row for cell {c.get('index')}"
            raise damaged(p / "cells.parquet", FileNotFoundError(
                f"session.toml says cell {c.get('index')} is {c.get('status')}, but cells.parquet {what}"))


def _check_requests_promised(s: Session, summaries: list[CellResult | None]) -> None:
    """Every cell whose [[cells]] entry says its requests were written (`requests_file`) has its
    requests/cell-NNNN.parquet. An entry without the key (written before it) promises one when its cell is done
    or stopped and was measured by servescope: cells imported from another tool's aggregates (their summary's
    `source` set, the session's [import] not `detailed`) legitimately have none."""
    if not s.cells.height or "status" not in s.cells.columns:
        return
    detailed = _table(s.meta.get("import")).get("detailed") is True
    promised = {c.get("index"): c.get(REQUESTS_KEY) for c in _array(s.meta.get("cells")) if isinstance(c, Mapping)}
    for idx, status, summary in zip(s.cells["index"].to_list(), s.cells["status"].to_list(), summaries,
                                    strict=False):
        said = promised.get(idx)
        if isinstance(said, bool):
            if not said:
                continue
        elif status not in REQUEST_STATUSES or summary is None or (summary.source is not None and not detailed):
            continue
        f = s.path / "requests" / f"cell-{idx:04d}.parquet"
        if not f.exists():
            missing = f if f.parent.is_dir() else f.parent
            raise damaged(missing, FileNotFoundError(f"it is missing: cell {idx} is {status} and its requests "
                                                     "were saved there"))


def check_request_columns(f: Path) -> None:
    """A requests file holds the columns reading it needs, of their types (its schema, read from its footer:
    no data is read). A valid Parquet file of other columns is damaged like a cut one."""
    try:
        schema = pl.read_parquet_schema(f)
    except _DECODE_ERRORS as e:
        raise damaged(f, e) from None
    for name, dtype in REQUEST_COLUMNS.items():
        got = schema.get(name)
        if got is None:
            raise damaged(f, ValueError(f"no {name!r} column: not a servescope requests file"))
        if got != dtype:
            raise damaged(f, ValueError(f"column {name!r} is {got}, not {dtype}"))


def read_meta(toml_path: Path) -> dict[str, object]:
    """session.toml as a dict (schema 1 migrated to 2); a file that is empty, not TOML, not a session's or
    from a newer servescope is a ServescopeError saying so."""
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
    meta = parse_toml(text, str(toml_path))
    ver = meta.get("schema_version")
    if ver is None:
        raise ServescopeError(f"{toml_path}: no schema_version: not a servescope session.toml (or one cut short); "
                              "restore it from a copy, or move its session directory out of the sessions folder")
    if isinstance(ver, bool) or not isinstance(ver, int) or ver < 1:
        raise ServescopeError(f"{toml_path}: schema_version {clean_text(repr(ver))} is not a session schema "
                              "version (1, 2, ...); the file is damaged: restore it from a copy")
    if ver > SCHEMA_VERSION:
        raise ServescopeError(f"{toml_path}: session schema_version {ver} is newer than this servescope "
                              f"understands ({SCHEMA_VERSION}); upgrade servescope")
    if ver < 2:
        meta = migrate_v1(meta)
    return meta


def session_dirs(base: Path) -> list[Path]:
    """The session directories under `base` (those holding a session.toml, whatever it is: one that is not a file
    is listed to be said broken), by name."""
    if not base.is_dir():
        return []
    try:
        return sorted(p for p in base.iterdir() if (p / "session.toml").exists())
    except OSError as e:
        raise ServescopeError(f"{base}: cannot list it ({clean_text(e.strerror or str(e))}); "
                              "check --sessions-dir") from None


@dataclass
class SessionEntry:
    """One directory of a sessions folder: its session, or why it cannot be opened (`broken`)."""

    path: Path
    session: Session | None
    broken: str | None = None


def scan_sessions(base: Path, newest_first: bool = False) -> list[SessionEntry]:
    """Every session under `base`, each loaded and validated; a damaged one is an entry with `broken` set to
    the one-line reason (it never hides the others). The CLI's `servescope sessions` and the app list these."""
    out = []
    dirs = session_dirs(base)
    for d in reversed(dirs) if newest_first else dirs:
        try:
            out.append(SessionEntry(d, load_session(d)))
        except ServescopeError as e:
            out.append(SessionEntry(d, None, e.message))
        except Exception as e:  # noqa: BLE001 - one unreadable session must not hide the others
            out.append(SessionEntry(d, None, clean_text(error_text(e))[:300]))
    return out


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
    inline: list[dict[str, object]] = []
    for w in _array(meta.get("workloads")):
        if not isinstance(w, dict):
            continue
        if w.get("source") == "preset":
            names.append(str(w.get("name")))
        else:
            inline.append(dict(w))
    sweep: dict[str, object] = {"sweep_version": 1}
    if meta.get("name"):
        sweep["name"] = meta["name"]
    if names:
        sweep["workloads"] = names
    tgt: dict[str, object] = {} if server.get("launch") else {"url": target.get("url", "sim://")}
    if meta.get("model"):
        tgt["model"] = meta["model"]
    sweep["target"] = tgt
    if inline:
        sweep["workload"] = inline
    ld: dict[str, object] = {}
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
