"""SessionMeta: session.toml typed; a key of the wrong type is one line naming the file and the key."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any, get_type_hints

import polars as pl
import pytest

from servescope.core.errors import ServescopeError
from servescope.sessions.importers import import_files
from servescope.sessions.meta import (
    SCHEMA_VERSION,
    ImportMeta,
    MetaUpdate,
    SessionMeta,
    meta_of_table,
    read_meta,
)
from servescope.sessions.store import SessionWriter, load_session
from servescope.sessions.views import PlannedLoad, planned_load
from tests.support.meta import stored

from .conftest import CellSpec, SessionSpec, build_session
from .test_quality_sessions import quality_session, result, ts
from .tune_synth import write_tune_session


def test_a_written_session_reads_typed(tmp_path: Path) -> None:
    spec = SessionSpec("gptq", [CellSpec("sharegpt", 1), CellSpec("sharegpt", 4)], tags={"quant": "GPTQ"},
                       slos={"ttft_ms": 500.0})
    s = load_session(build_session(tmp_path, spec))
    info = s.info
    assert isinstance(info, SessionMeta)
    assert info.name == "gptq" and info.model == "Qwen/Qwen3.5-35B-A3B"
    assert info.target.url == "http://127.0.0.1:8000" and info.target.version == "0.32.0"
    assert info.target.metrics is True and info.max_model_len == 32768
    assert [c.concurrency for c in info.cells] == [1, 4] and [c.load_label for c in info.cells] == ["c=1", "c=4"]
    assert planned_load(s) == PlannedLoad([1, 4], [], [], [20], [], [0])
    assert info.slos == {"ttft_ms": 500.0} and info.tags == {"quant": "GPTQ"}
    assert [c.status for c in info.cells] == ["done", "done"]
    assert info.workload_names == ["sharegpt"]
    assert info.server is None and info.import_ is None


def test_defaults_and_unknown_keys() -> None:
    m = SessionMeta.from_dict({"schema_version": 2, "import": {"format": "vllm-bench-serve"}, "new_key": [1]},
                              "x/session.toml")
    assert m.import_ == ImportMeta(format="vllm-bench-serve")
    assert m.model == "?" and m.target.url == "?" and m.status == "unknown" and m.tags == {} and m.sweep is None
    full = SessionMeta.from_dict({"schema_version": 2, "server": {"launch": "vllm serve m", "variants": ["-tp 2"],
                                                                  "args": ["--port", 8000]},
                                  "electricity_usd_per_kwh": 1, "sweep": {"sweep_version": 1}}, "x")
    assert full.server is not None and full.server.variants == ["-tp 2"] and full.electricity_usd_per_kwh == 1
    assert full.sweep == {"sweep_version": 1}


@pytest.mark.parametrize(("meta", "needle"), [
    ({"schema_version": "2"}, "schema_version: expected int, got str"),
    ({"schema_version": 2, "target": {"url": 8000}}, "target.url: expected str, got int"),
    ({"schema_version": 2, "cells": [{"index": 0, "concurrency": "4"}]}, "cells[0].concurrency: expected int"),
    ({"schema_version": 2, "slos": {"ttft_ms": "fast"}}, "slos.ttft_ms: expected float, got str"),
    ({"schema_version": 2, "cells": [{"index": 0}, 3]}, "cells[1]: expected object, got int"),
    ({"schema_version": 2, "max_model_len": 1.5}, "max_model_len: expected int"),
    ({"schema_version": 2, "import": "yes"}, "import: expected object"),
])
def test_wrong_types_are_one_line(meta: dict[str, Any], needle: str) -> None:
    with pytest.raises(ServescopeError) as e:
        SessionMeta.from_dict(meta, "/s/session.toml")
    msg = str(e.value)
    assert msg.startswith("/s/session.toml: ") and needle in msg and "\n" not in msg, msg


def test_not_a_table() -> None:
    with pytest.raises(ServescopeError, match="expected a table"):
        SessionMeta.from_dict([1], "w")  # type: ignore[arg-type]


def test_a_table_without_a_schema_version_is_no_session() -> None:
    with pytest.raises(ServescopeError, match="no schema_version: not a servescope session.toml"):
        meta_of_table({"name": "x"}, "/s/session.toml")


def test_a_session_is_read_once(tmp_path: Path) -> None:
    """session.toml is read and typed when the session is loaded, not again on every look at it."""
    s = load_session(build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1)])))
    assert s.info is s.info and s.info.name == "a"


def test_a_writers_updates_are_typed_as_the_schema_declares() -> None:
    """SessionWriter.update's keys (MetaUpdate) are SessionMeta's fields, each of the same type: one schema."""
    fields, updates = get_type_hints(SessionMeta), get_type_hints(MetaUpdate)
    assert updates and all(fields[k] == t for k, t in updates.items()), {
        k: (fields.get(k), t) for k, t in updates.items() if fields.get(k) != t}


@pytest.mark.parametrize("kind", ["sweep", "tune", "import", "quality", "old"])
def test_every_kind_of_session_reads_back_whole(tmp_path: Path, kind: str) -> None:
    """What each writer put in session.toml reads into SessionMeta and back to the same table: no key the schema
    does not hold, no value of another type (an old session: all but its [load] table, which schema 4 dropped)."""
    if kind == "sweep":
        path = build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1), CellSpec("sharegpt", 4)],
                                                   tags={"quant": "FP8"}, slos={"ttft_ms": 500.0}))
    elif kind == "tune":
        path = write_tune_session(tmp_path / "t")
    elif kind == "import":
        path = import_files([Path(__file__).parent / "data" / "vllm-bench-c1-detailed.json"], save=tmp_path / "i")
    elif kind == "quality":
        path = quality_session(tmp_path, "q", result({"arithmetic": ts(9, 10)}))
    else:
        path = Path(__file__).parent / "old" / "v2" / "tiny-open"
    raw = tomllib.loads((path / "session.toml").read_text())
    raw.pop("load", None)
    assert _lost(raw, stored(load_session(path))) == []


def _lost(raw: object, typed: object, at: str = "") -> list[str]:
    """Where `typed` (the table read typed and written back) lacks or changes what `raw` (the file) held; keys the
    typed table adds are its defaults."""
    if isinstance(raw, dict):
        if not isinstance(typed, dict):
            return [at]
        return [w for k, v in raw.items() for w in ([f"{at}.{k}"] if k not in typed else _lost(v, typed[k], f"{at}.{k}"))]
    if isinstance(raw, list):
        if not isinstance(typed, list) or len(raw) != len(typed):
            return [at]
        return [w for i, (a, b) in enumerate(zip(raw, typed, strict=True)) for w in _lost(a, b, f"{at}[{i}]")]
    return [] if raw == typed and type(raw) is type(typed) else [f"{at}: {raw!r} -> {typed!r}"]


def test_cells_parquet_names_each_figure_by_its_key(tmp_path: Path) -> None:
    """A figure has one spelling: cells.parquet's column is its key (`ttft_ms.p50`), as in the CSV and --fail-on;
    an old session's columns (`ttft_ms_p50`) are read under those names, and rewritten so when it is resumed."""
    path = build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1)]))
    on_disk = pl.read_parquet(path / "cells.parquet")
    (summary,) = load_session(path).summaries()
    assert summary is not None and on_disk["ttft_ms.p50"].to_list() == [summary.value("ttft_ms.p50")]
    assert not any(c.endswith("_p50") for c in on_disk.columns), on_disk.columns
    old = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "old" / "v2" / "gptq", old)
    assert "ttft_ms_p50" in pl.read_parquet(old / "cells.parquet").columns  # as servescope 0.1 wrote it
    s = load_session(old)
    assert "ttft_ms_p50" not in s.cells.columns and s.cells["ttft_ms.p50"].to_list() == [
        x.value("ttft_ms.p50") if x is not None else None for x in s.summaries()]
    SessionWriter.open(old)  # resumed: brought to this schema on disk
    assert "ttft_ms.p50" in pl.read_parquet(old / "cells.parquet").columns
    assert read_meta(old / "session.toml").schema_version == SCHEMA_VERSION


def test_a_baseline_files_session_toml_is_written_redacted(tmp_path: Path) -> None:
    """Every session.toml servescope writes goes through redact_meta: the one a baseline file is unpacked into too
    (a file from elsewhere, or from an older servescope, may hold a key in its launch command)."""
    import json

    from servescope.sessions.gate import load_baseline, save_baseline

    path = build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1)]))
    f = tmp_path / "base.json"
    save_baseline(load_session(path), f)
    doc = json.loads(f.read_text())
    doc["meta"]["server"] = {"launch": "vllm serve m --api-key sk-live-123456789"}
    f.write_text(json.dumps(doc))
    s = load_baseline(f, tmp_path / "work")
    text = (s.path / "session.toml").read_text()
    assert "sk-live-123456789" not in text and "--api-key" in text
    assert s.info.server.launch is not None and "sk-live" not in s.info.server.launch
