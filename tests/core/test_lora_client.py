"""LoRA on the client's side: a request names its adapter as the model (core/client.py), its record keeps it, and a
cell's per-adapter figures come from those records (core/lorafigures.py); a launch command's adapters
(core/launchspec.py) and the base model picked among a server's adapters (core/target.py)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from servescope.core.client import ClientOptions, RequestSpec, build_body
from servescope.core.errors import ServescopeError
from servescope.core.launchspec import lora_modules, parse_launch
from servescope.core.lorafigures import adapter_figures
from servescope.core.metrics import records_frame
from servescope.core.target import ModelInfo, TargetInfo
from tests.core.test_metrics import rec


def test_a_request_names_its_adapter_and_carries_the_workloads_sampling() -> None:
    opts = ClientOptions(base_url="http://x", model="base-model")
    body = json.loads(build_body(RequestSpec("completions", "hi", 1, 4, model="sql", temperature=0.0,
                                             spec_acceptance=0.8), opts))
    assert body["model"] == "sql" and body["temperature"] == 0.0 and body["vllm_xargs"] == {"spec_acceptance": 0.8}
    plain = json.loads(build_body(RequestSpec("completions", "hi", 1, 4), opts))
    assert plain["model"] == "base-model" and "temperature" not in plain and "vllm_xargs" not in plain


def test_per_adapter_figures_from_the_records() -> None:
    rows = []
    for i, adapter in enumerate(["sql", "sql", "chat", "", "sql"]):
        r = rec(i, 0, [(100 + 10 * i, 1), (120 + 10 * i, 1), (140 + 10 * i, 1)])
        r.adapter = adapter
        rows.append(r)
    bad = rec(5, 0, [], status="error")
    bad.adapter = "chat"
    warm = rec(-1, 0, [(10, 1), (20, 1)])
    warm.warmup, warm.adapter = True, "other"
    df = records_frame([*rows, bad, warm])
    assert df.schema["adapter"] == pl.Utf8
    figs = adapter_figures(df, wall_s=2.0)
    assert figs is not None and list(figs) == ["sql", "chat", "base"]  # the warmup's adapter is not measured
    sql = figs["sql"]
    assert sql.requests == 3 and sql.output_tok_s == pytest.approx(9 / 2.0)
    assert sql.ttft_ms.p50 == pytest.approx(110.0) and sql.tpot_ms.p50 == pytest.approx((141 - 100) / 2)  # each: 3 tokens over 41 ms
    assert figs["chat"].requests == 1 and figs["base"].requests == 1  # the failed chat request is not counted
    plain = [rec(0, 0, [(10, 1)])]
    assert adapter_figures(records_frame(plain), 1.0) is None
    assert adapter_figures(records_frame(plain).drop("adapter"), 1.0) is None  # a session written before


def test_launch_commands_take_several_adapters_and_get_the_workloads() -> None:
    spec = parse_launch("vllm serve M --enable-lora --lora-modules sql=/a/sql '{\"name\": \"chat\", \"path\": \"/b\"}' "
                        "--max-loras 2")
    assert lora_modules(spec) == {"sql": "/a/sql", "chat": "/b"}
    assert spec.argv[3:8] == ["--enable-lora", "--lora-modules", "sql=/a/sql", '{"name": "chat", "path": "/b"}',
                              "--max-loras"]
    assert spec.server_args["enable_lora"] is True and spec.server_args["max_loras"] == 2
    more = spec.with_adapters(["sql", "code"], "/adapters")
    assert lora_modules(more) == {"sql": "/a/sql", "chat": "/b", "code": "/adapters/code"}
    assert more.argv.count("--enable-lora") == 1
    bare = parse_launch("vllm serve M").with_adapters(["sql"], "/d")
    assert "--enable-lora" in bare.argv and bare.argv[bare.argv.index("--lora-modules") + 1] == "sql=/d/sql"
    with pytest.raises(ServescopeError, match="--lora-dir DIR") as e:
        parse_launch("vllm serve M").with_adapters(["sql"], None)
    assert "\n" not in e.value.message
    sim = parse_launch("servescope sim --profile tiny").with_adapters(["sql"], None)  # the simulator reads no path
    assert lora_modules(sim) == {"sql": "sql"}
    same = parse_launch("vllm serve M --port 9")
    assert same.with_adapters([], None) is same  # no adapter: the command as it was


def test_the_base_model_among_its_adapters_is_the_sweeps_model() -> None:
    info = TargetInfo("http://x", [ModelInfo("/m/dense", 8192), ModelInfo("sql", None, "/m/dense"),
                                   ModelInfo("chat", None, "/m/dense")])
    assert info.model(None).id == "/m/dense"
    two = TargetInfo("http://x", [ModelInfo("a"), ModelInfo("b")])
    with pytest.raises(ServescopeError, match="several models"):
        two.model(None)
