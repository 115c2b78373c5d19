"""SessionMeta: session.toml typed; a key of the wrong type is one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import ServescopeError
from servescope.sessions.meta import SessionMeta
from servescope.sessions.store import load_session
from servescope.sessions.views import PlannedLoad, planned_load

from .conftest import CellSpec, SessionSpec, build_session


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
    assert m.import_ == {"format": "vllm-bench-serve"}
    assert m.model == "?" and m.target.url == "?" and m.status == "unknown" and m.tags == {} and m.sweep is None
    full = SessionMeta.from_dict({"schema_version": 2, "server": {"launch": "vllm serve m", "variants": ["-tp 2"],
                                                                  "args": ["--port", 8000]},
                                  "electricity_usd_per_kwh": 1, "sweep": {"sweep_version": 1}}, "x")
    assert full.server is not None and full.server.variants == ["-tp 2"] and full.electricity_usd_per_kwh == 1
    assert full.sweep == {"sweep_version": 1}


@pytest.mark.parametrize(("meta", "needle"), [
    ({"schema_version": "2"}, "schema_version: expected int, got str"),
    ({}, "schema_version: missing"),
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
