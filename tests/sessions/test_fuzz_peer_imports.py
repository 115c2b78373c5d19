"""Hypothesis property tests of every importer of another tool's files (GuideLLM, AIPerf records and aggregates,
inference-perf, llm-d reports): a stored file with values replaced at random places (numbers of every size and sign,
NaN and infinities, texts, nulls, lists, tables) imports or is refused with one ServescopeError line, never an
uncaught exception; an import that succeeds has only finite, non-negative figures, opens, reports and exports.
Bounded: `max_examples` per format, no deadline (a busy host)."""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.reports.report import render_report
from servescope.sessions.importers import import_files
from servescope.sessions.llmd import export_reports
from servescope.sessions.store import load_session

# the --fast lane leaves this module out: 4 tests, ~19 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
PEERS = DATA / "peers"

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.sampled_from([0, -1, 1e300, -1e-9, "inf", "NaN", 2**63]))
VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.text(max_size=6), kids, max_size=3), max_leaves=8)


def _paths(doc: Any, keep: Callable[[tuple[Any, ...]], bool], path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in `doc` (tables, lists and leaves) that `keep` accepts."""
    out = [path] if path and keep(path) else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, keep, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):  # the first entries of a list stand for the rest
            out += _paths(v, keep, (*path, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


def numbers(v: Any, where: str = "") -> list[tuple[str, float]]:
    if isinstance(v, dict):
        return [x for k, sub in v.items() for x in numbers(sub, f"{where}.{k}")]
    if isinstance(v, list):
        return [] if where.endswith("errors") else [x for i, s in enumerate(v) for x in numbers(s, f"{where}[{i}]")]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [(where, float(v))]
    return []


def _guidellm() -> Any:
    doc = json.loads((PEERS / "guidellm-0.8.1" / "benchmarks.json").read_text())
    doc["benchmarks"] = doc["benchmarks"][:1]
    return doc


def _skip_noise(path: tuple[Any, ...]) -> bool:
    """Places an importer reads (not the tools' free-form settings it never looks at)."""
    text = "/".join(map(str, path))
    return not any(x in text for x in ("warnings", "pdf", "percentile_cis", "mean_ci", "api_routes", "request_args",
                                       "output_metrics", "input_metrics", "response_chunks", "/request/",
                                       "response\x00"))


def _write_json(tmp: Path, name: str, doc: Any) -> Path:
    f = tmp / name
    f.write_text(json.dumps(doc, allow_nan=True))
    return f


def _check_import(files: list[Path], tmp: Path) -> None:
    try:
        path = import_files(files, sessions_dir=tmp / "s")
    except ServescopeError as e:
        assert e.message and "\n" not in e.message, e.message
        event("refused")
        return
    event("imported")
    s = load_session(path)
    for summ in s.summaries():
        assert summ is not None
        for where, v in numbers(summ.to_dict()):
            # never a negative or non-finite figure (the prompt's measured minus requested tokens is signed)
            assert math.isfinite(v) and (v >= 0 or where == ".input_tokens_mismatch.mean"), (where, v)
    render_report(s, fmt="md")
    export_reports(s, tmp / "x", "0.2")
    try:  # schema 0.1 requires figures a tool's file may lack: refused in one line naming the way out
        export_reports(s, tmp / "x01", "0.1")
    except ServescopeError as e:
        assert "\n" not in e.message and e.message.endswith("export it with --llmd-schema 0.2"), e.message


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


def _mutate(data: st.DataObject, doc: Any, keep: Callable[[tuple[Any, ...]], bool] = _skip_noise) -> Any:
    doc = copy.deepcopy(doc)
    places = _paths(doc, keep)
    for path in data.draw(st.lists(st.sampled_from(places), min_size=1, max_size=4), label="places"):
        try:
            _set(doc, path, data.draw(VALUES, label="/".join(map(str, path))))
        except (KeyError, IndexError, TypeError):  # an earlier change replaced a table above this place
            continue
    return doc


GUIDELLM = _guidellm()


@FUZZ
@given(data=st.data())
def test_fuzz_guidellm(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("gl")
    _check_import([_write_json(tmp, "benchmarks.json", _mutate(data, GUIDELLM))], tmp)


AIPERF_RECORDS = [json.loads(x) for x in (PEERS / "aiperf-0.13.0" / "concurrency_2" / "profile_export.jsonl")
                  .read_text().splitlines()]
AIPERF_AGG = json.loads((PEERS / "aiperf-0.13.0" / "concurrency_2" / "profile_export_aiperf.json").read_text())


@FUZZ
@given(data=st.data())
def test_fuzz_aiperf(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("ap")
    run = tmp / "run"
    run.mkdir()
    records = data.draw(st.booleans(), label="records")
    agg = _mutate(data, AIPERF_AGG) if data.draw(st.booleans(), label="change the aggregates") else AIPERF_AGG
    _write_json(run, "profile_export_aiperf.json", agg)
    if records:
        recs = _mutate(data, AIPERF_RECORDS)
        (run / "profile_export.jsonl").write_text("\n".join(json.dumps(r, allow_nan=True) for r in recs) + "\n")
    _check_import([run], tmp)


INFPERF = PEERS / "inference-perf"
INFPERF_REQS = json.loads((INFPERF / "per_request_lifecycle_metrics.json").read_text())
INFPERF_STAGE = json.loads((INFPERF / "stage_0_lifecycle_metrics.json").read_text())


@FUZZ
@given(data=st.data())
def test_fuzz_inference_perf(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("ip")
    d = tmp / "reports"
    d.mkdir()
    shutil.copy(INFPERF / "config.yaml", d)
    reqs = data.draw(st.booleans(), label="per-request file")
    stage = _mutate(data, INFPERF_STAGE) if data.draw(st.booleans(), label="change the stage") else INFPERF_STAGE
    _write_json(d, "stage_0_lifecycle_metrics.json", stage)
    if reqs:
        _write_json(d, "per_request_lifecycle_metrics.json", _mutate(data, INFPERF_REQS[:12]))
    _check_import([d], tmp)


LLMD = yaml.safe_load((DATA / "llmd" / "br_v0_2_example.yaml").read_text())
LLMD = json.loads(json.dumps(LLMD, default=str))
LLMD["results"].pop("observability")  # the example's own free-form parts: no importer reads them
LLMD["results"].pop("session_performance")


@FUZZ
@given(data=st.data())
def test_fuzz_llmd_report(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("ll")
    doc = _mutate(data, LLMD, lambda p: _skip_noise(p) and p[:2] != ("scenario", "stack"))
    as_yaml = data.draw(st.booleans(), label="yaml")
    if as_yaml:
        f = tmp / "report.yaml"
        try:
            f.write_text(yaml.safe_dump(doc))
        except (yaml.YAMLError, ValueError):
            return
    else:
        f = _write_json(tmp, "report.json", doc)
    _check_import([f], tmp)
