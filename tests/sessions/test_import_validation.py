"""`servescope import` of files that pass the vllm-bench shape check but hold bad values (issue 11, item 8):
one line naming the file and the key, exit 2, no session written. Plus a Hypothesis fuzz of import JSON
(60 examples): only ServescopeError escapes, and an import that succeeds has only finite, non-negative
metrics and loads, lists and reports."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servescope.__main__ import main
from servescope.core.errors import ServescopeError
from servescope.reports.report import render_report
from servescope.sessions.importers import import_files
from servescope.sessions.store import load_session

DATA = Path(__file__).parent / "data"


def base_doc() -> dict[str, Any]:
    d: dict[str, Any] = json.loads((DATA / "vllm-bench-c1-detailed.json").read_text())
    return d


def write(tmp_path: Path, doc: dict[str, Any], name: str = "r.json") -> Path:
    f = tmp_path / name
    f.write_text(json.dumps(doc, allow_nan=True))
    return f


def ragged(d: dict[str, Any]) -> None:
    d["itls"] = d["itls"][:-1]


def itl_not_list(d: dict[str, Any]) -> None:
    d["itls"][0] = 0.5


BAD: dict[str, tuple[Any, str]] = {
    "max_concurrency Infinity": (lambda d: d.update(max_concurrency=math.inf), "max_concurrency is Infinity"),
    "max_concurrency NaN": (lambda d: d.update(max_concurrency=math.nan), "max_concurrency is NaN"),
    "max_concurrency 0": (lambda d: d.update(max_concurrency=0), "max_concurrency is 0"),
    "input_lens abc": (lambda d: d["input_lens"].__setitem__(0, "abc"), "input_lens[0] is 'abc'"),
    "output_lens negative": (lambda d: d["output_lens"].__setitem__(2, -3), "output_lens[2] is -3"),
    "ragged itls": (ragged, "itls has 11 entries but ttfts 12"),
    "itl not a list": (itl_not_list, "itls[0] is 0.5"),
    "itl NaN": (lambda d: d["itls"][1].__setitem__(0, math.nan), "itls[1][0] is NaN"),
    "ttft negative": (lambda d: d["ttfts"].__setitem__(0, -1.0), "ttfts[0] is -1.0"),
    "ttft huge": (lambda d: d["ttfts"].__setitem__(0, 1e300), "ttfts[0] is 1e+300"),
    "duration NaN": (lambda d: d.update(duration=math.nan), "duration is NaN"),
    "duration text": (lambda d: d.update(duration="long"), "duration is 'long'"),
    "completed Infinity": (lambda d: d.update(completed=math.inf), "completed is Infinity"),
    "completed fraction": (lambda d: d.update(completed=2.5), "completed is 2.5"),
    "mean_ttft_ms -inf": (lambda d: d.update(mean_ttft_ms=-math.inf), "mean_ttft_ms is -Infinity"),
    "ttfts a dict": (lambda d: d.update(ttfts={"a": 1}), "ttfts is"),
    "errors a number": (lambda d: d["errors"].__setitem__(0, 5), "errors[0] is 5"),
    "no output_lens": (lambda d: d.pop("output_lens"), "has ttfts but no output_lens"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_values_one_line(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = base_doc()
    change, needle = BAD[case]
    change(doc)
    f = write(tmp_path, doc)
    sessions = tmp_path / "sessions"
    assert main(["import", str(f), "--sessions-dir", str(sessions)]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"servescope import: error: {f}: ") and needle in lines[0], lines[0]
    assert not sessions.exists() or not any(sessions.iterdir())  # nothing written


def test_good_files_still_import(tmp_path: Path) -> None:
    doc = base_doc()
    doc["max_concurrency"] = None  # vllm writes null without --max-concurrency
    doc["request_goodput"] = None
    path = import_files([write(tmp_path, doc), DATA / "vllm-bench-c4-detailed.json"],
                        sessions_dir=tmp_path / "s")
    assert load_session(path).cells.height == 2


# ---- fuzz ------------------------------------------------------------------------------------------------
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.text(max_size=6), kids, max_size=3), max_leaves=8)
KEYS = ["completed", "failed", "num_prompts", "duration", "max_concurrency", "request_rate", "burstiness",
        "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
        "total_token_throughput", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "model_id", "label",
        "endpoint_type", "date"]
PER_REQUEST = ["input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors"]


def numbers(v: Any, path: str = "") -> list[tuple[str, float]]:
    """Every number in a summary (errors' HTTP statuses left out)."""
    if isinstance(v, dict):
        return [x for k, sub in v.items() for x in numbers(sub, f"{path}.{k}")]
    if isinstance(v, list):
        return [] if path.endswith("errors") else [x for i, sub in enumerate(v) for x in numbers(sub, f"{path}[{i}]")]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [(path, float(v))]
    return []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_import_json(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    detailed = data.draw(st.booleans(), label="detailed")
    doc = base_doc()
    if not detailed:
        for k in PER_REQUEST:
            doc.pop(k, None)
    for k in data.draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True), label="keys"):
        doc[k] = data.draw(JSON_VALUES, label=k)
    if detailed:
        for k in data.draw(st.lists(st.sampled_from(PER_REQUEST), max_size=2, unique=True), label="lists"):
            if data.draw(st.booleans(), label=f"{k} whole"):
                doc[k] = data.draw(st.lists(JSON_VALUES, max_size=13), label=k)
            else:
                i = data.draw(st.integers(0, len(doc[k]) - 1), label=f"{k} index")
                doc[k][i] = data.draw(JSON_VALUES, label=f"{k}[{i}]")
    tmp = tmp_path_factory.mktemp("imp")
    f = write(tmp, doc)
    try:
        path = import_files([f], sessions_dir=tmp / "s")
    except ServescopeError as e:
        assert e.message and "\n" not in e.message
        event("refused")
        return
    event("imported")
    s = load_session(path)
    for summ in s.summaries():
        assert summ is not None
        for where, v in numbers(summ.to_dict()):
            assert math.isfinite(v) and v >= 0, (where, v)  # never a negative or non-finite metric
    render_report(s, fmt="md")
    render_report(s, fmt="csv")
