"""Fuzz (Hypothesis): workload and sweep TOML from generated documents. `Workload.from_dict`, `load_toml`,
`SweepSpec.from_table` and `SweepSpec.from_toml` never raise anything but a one-line ServescopeError, and a
sweep that loads is storable: the table a session writes of it is TOML and reads back the same.
Bounded: 150 examples for workload tables, 150 + 150 for sweep tables, 100 for raw TOML text."""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import event, given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.engine.fields import ARRIVALS, ENGINES, TRANSPORTS
from servescope.engine.spec import SECTION_KEYS, TOP_KEYS, SweepSpec
from servescope.workloads.spec import DIST_KEYS, WORKLOAD_KEYS, Workload, load_toml, parse_toml

SCALARS = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["fixed", "uniform", "normal", "chat", "completions", "sharegpt",
                                           "1s", "off", "-5", "nan", "sim://tiny", "http://127.0.0.1:9",
                                           "ttft_ms=5", "vllm serve M --api-key k", "context-sweep", ""]),
    st.dates(min_value=dt.date(1, 1, 1)),
)
KEY_TEXT = st.text(min_size=0, max_size=10)


def values(keys: list[str] | tuple[str, ...] | set[str]) -> st.SearchStrategy[Any]:
    known = sorted(keys)
    key = st.one_of(st.sampled_from(known), KEY_TEXT) if known else KEY_TEXT
    return st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.one_of(st.sampled_from(sorted(DIST_KEYS)), key), kids, max_size=4), max_leaves=10)


def table(keys: set[str] | tuple[str, ...], vals: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.one_of(st.sampled_from(sorted(keys)), KEY_TEXT), vals, max_size=6)


WORKLOAD_TABLES = table(WORKLOAD_KEYS, values(WORKLOAD_KEYS | set(DIST_KEYS)))


def sweep_tables() -> st.SearchStrategy[dict[str, Any]]:
    sections = {name: table(keys, values(keys)) | values(keys) for name, keys in SECTION_KEYS.items()}
    parts = {**sections, "workload": st.lists(WORKLOAD_TABLES, max_size=2) | WORKLOAD_TABLES | SCALARS,
             "workloads": st.lists(st.one_of(st.sampled_from(["sharegpt", "longin", "context-sweep", "x.toml",
                                                              "context-sweep/4k"]), st.text(max_size=8)),
                                   max_size=3) | SCALARS,
             "slo": table({"ttft_ms", "tpot_ms", "e2e_ms", "per_user_tok_s"}, SCALARS) | SCALARS,
             "tags": table({"quant"}, values(set())) | SCALARS}
    tops = sorted(TOP_KEYS)
    return st.fixed_dictionaries({}, optional={k: parts.get(k, values(set())) for k in tops}).flatmap(
        lambda d: st.dictionaries(KEY_TEXT, SCALARS, max_size=1).map(lambda extra: {**d, **extra}))


def one_line(e: ServescopeError) -> None:
    assert e.message and "\n" not in e.message, e.message


@settings(max_examples=150, deadline=None)
@given(WORKLOAD_TABLES)
def test_fuzz_workload_tables(d: dict[str, Any]) -> None:
    try:
        w = Workload.from_dict(d, "fuzz.toml")
    except ServescopeError as e:
        one_line(e)
        return
    assert w.input_tokens.upper >= 1 and w.output_tokens.upper >= 1  # a workload that loads is usable
    w.shape()
    assert Workload.from_dict(w.to_dict(), "again") == w


# sweep tables most of whose values are of the kind their key takes (any text where a text goes, numbers in
# range, durations, the known choices), so that many load and reach the writer: the wild tables above
# mostly stop at the first bad value
TEXT = st.text(max_size=16)
DURATIONS = st.sampled_from(["1s", "250ms", "5m", "0.5", "1e-3s", "1.5h"]) | st.floats(1e-6, 1e7) | st.integers(1, 10**9)
COUNTS = st.integers(1, 2**40)
KEY_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "url": TEXT | st.sampled_from(["sim://tiny", "http://127.0.0.1:9"]), "api_key_env": TEXT, "model": TEXT,
    "tokenizer": TEXT, "launch": TEXT | st.sampled_from(["vllm serve m --api-key k", "vllm serve 'a b'"]),
    "ray": TEXT, "engine": st.sampled_from(ENGINES), "transport": st.sampled_from(TRANSPORTS),
    "arrival": st.sampled_from(ARRIVALS), "workers": st.just("auto") | st.integers(1, 64),
    "ray_nodes": st.lists(TEXT, max_size=3) | TEXT, "concurrency": st.lists(COUNTS, min_size=1, max_size=3),
    "rates": st.lists(st.floats(1e-6, 1e9), min_size=1, max_size=3), "ramp": DURATIONS | st.sampled_from(["auto", "0s", 0]),
    "duration": DURATIONS,
    "timeout": DURATIONS, "launch_timeout": DURATIONS, "recover_timeout": DURATIONS,
    "interval": DURATIONS | st.just("off"), "max_concurrency": COUNTS, "requests": COUNTS,
    "warmup": st.integers(0, 2**40), "repeat": st.integers(1, 100), "seed": st.integers(-(2**63), 2**63 - 1),
    "quality_share": st.floats(0, 1), "ignore_eos": st.booleans(), "electricity_price": st.floats(0, 1e6),
    "retry_after": DURATIONS,
    "ca_cert": TEXT, "tls_verify": st.booleans(), "gpu_hour": st.floats(0, 1e6),
    "price": st.fixed_dictionaries({}, optional={"input": st.floats(0, 1e6), "output": st.floats(0, 1e6)})
    | TEXT | st.sampled_from(["input=2.5,output=10", "input=x"]),
    "burstiness": st.floats(0.01, 100), "pattern": st.sampled_from(["1x for 2s, 3x", "0x for 1ms, 2.5x"]),
    "variants": st.lists(st.fixed_dictionaries({"args": TEXT}), max_size=2),
    "window": st.sampled_from(["steady", "whole"]) | TEXT, "stop_after_saturation": st.booleans(),
    "precision": st.sampled_from(["5%", "0.02", "output_tok_s:2%,ttft_ms.p50:5%", "ttft_ms.p5:1%", "150%"]) | TEXT,
    "probe_rate": st.floats(0, 200) | st.sampled_from(["0.5", "off"]),
    "reset_prefix_cache": st.booleans(), "lora_dir": TEXT,
}


def loadable_sweep_tables() -> st.SearchStrategy[dict[str, Any]]:
    sections = {name: st.fixed_dictionaries({}, optional={k: KEY_VALUES[k] | SCALARS for k in sorted(keys)})
                for name, keys in SECTION_KEYS.items()}
    return st.fixed_dictionaries(
        {"workloads": st.sampled_from([["sharegpt"], ["longin"], ["context-sweep"], "sharegpt"])},
        optional={**sections, "name": TEXT, "workload": st.lists(WORKLOAD_TABLES, max_size=1),
                  "slo": st.dictionaries(st.sampled_from(["ttft_ms", "tpot_ms", "e2e_ms", "per_user_tok_s"]),
                                         st.floats(1e-3, 1e6) | st.integers(1, 10**6) | SCALARS, max_size=2),
                  "tags": st.dictionaries(TEXT, TEXT | SCALARS, max_size=2)})


def _loads_and_stores(d: dict[str, Any]) -> bool:
    """A table either is refused in one line, or loads; then what a session stores of it (its [sweep] table,
    workloads inline) is TOML and reads back to the same table. Whether it loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            spec = SweepSpec.from_table(d, "fuzz.toml", Path(tmp))
        except ServescopeError as e:
            one_line(e)
            return False
        spec.to_table()
        stored = spec.to_table(inline_workloads=True)
        f = Path(tmp) / "again.toml"
        f.write_text(tomli_w.dumps(stored))  # a spec that loaded must be storable
        assert SweepSpec.from_toml(f).to_table(inline_workloads=True) == stored
        return True


@settings(max_examples=150, deadline=None)
@given(sweep_tables())
def test_fuzz_sweep_tables(d: dict[str, Any]) -> None:
    _loads_and_stores(d)


@settings(max_examples=150, deadline=None)
@given(loadable_sweep_tables())
def test_fuzz_loadable_sweep_tables_store_and_read_back(d: dict[str, Any]) -> None:
    loaded = _loads_and_stores(d)
    event("loaded" if loaded else "refused")  # `pytest --hypothesis-show-statistics`: about a quarter load


def _dump(d: dict[str, Any]) -> str:
    try:
        return tomli_w.dumps(d)
    except (TypeError, ValueError):
        return ""


TEXTS = st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                  WORKLOAD_TABLES.map(lambda d: _dump({"workload": d})), sweep_tables().map(_dump))


@settings(max_examples=100, deadline=None)
@given(TEXTS)
def test_fuzz_toml_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "fuzz.toml"
        f.write_bytes(text.encode("utf-8", errors="replace"))
        for load in (load_toml, SweepSpec.from_toml):
            try:
                load(f)
            except ServescopeError as e:
                one_line(e)
        try:
            parse_toml(text, "fuzz.toml")
        except ServescopeError as e:
            one_line(e)
