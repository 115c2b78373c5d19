"""Sweep TOML files: round trip, the flag-shaped dict, and errors a user can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.sessions.sweepfile import load_sweep, plan_from_sweep, save_sweep
from servescope.workloads.spec import PRESETS, Workload, fixed


def test_round_trip_presets_inline_and_files(tmp_path: Path) -> None:
    wfile = tmp_path / "wl" / "rag.toml"
    wfile.parent.mkdir()
    wfile.write_text('[workload]\nname = "rag"\ninput_tokens = 4096\noutput_tokens = 128\n')
    from servescope.workloads.spec import load_toml

    inline = Workload("mine", "chat", fixed(100), fixed(20), source="inline", description="made in the app")
    path = save_sweep(
        tmp_path / "sweep.toml", url="sim://tiny", api_key_env="MY_KEY", model="tiny",
        workloads=[PRESETS["sharegpt"], *load_toml(wfile), inline], concurrency=[1, 4, 16], requests=50,
        duration="30s", warmup=2, slos={"ttft_ms": 3000, "tpot_ms": 50}, tags={"quant": "FP8"}, name="nightly",
    )
    text = path.read_text()
    assert "MY_KEY" in text and "api_key =" not in text
    sw = load_sweep(path)
    assert sw["url"] == "sim://tiny"
    assert sw["api_key_env"] == "MY_KEY"
    assert sw["model"] == "tiny"
    assert [w.name for w in sw["workloads"]] == ["sharegpt", "rag", "mine"]
    assert sw["workloads"][2].input_tokens == fixed(100)
    # the values have the shapes of `servescope run` flags
    assert sw["concurrency"] == "1,4,16"
    assert sw["rate"] is None
    assert sw["requests"] == 50
    assert sw["duration"] == "30s"
    assert sw["warmup"] == 2
    assert sw["slo"] == "ttft_ms=3000,tpot_ms=50"
    assert sw["tag"] == ["quant=FP8"]
    assert sw["name"] == "nightly"
    plan = plan_from_sweep(sw, "http://127.0.0.1:1", "sim://tiny")
    assert plan.concurrency == [1, 4, 16] and plan.duration_s == 30 and plan.slos == {"ttft_ms": 3000.0, "tpot_ms": 50.0}
    assert plan.tags == {"quant": "FP8"} and plan.target_label == "sim://tiny"


def test_relative_workload_paths_resolve_next_to_the_sweep(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text('[workload]\nname = "w"\ninput_tokens = 64\noutput_tokens = 8\n')
    (tmp_path / "s.toml").write_text('workloads = ["w.toml"]\n[load]\nrates = [0.5, 2]\nrequests = 10\n')
    sw = load_sweep(tmp_path / "s.toml")
    assert sw["rate"] == "0.5,2" and sw["concurrency"] is None
    assert sw["workloads"][0].name == "w"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[target\nurl = 1", "s.toml:1:"),
        ('workloads = ["sharegpt"]\n[load]\nconcurrency = [1, "x", 4]\n', "concurrency"),
        ('workloads = ["sharegpt"]\n[load]\nconcurrency = "1,x,4"\n', "'x'"),
        ('workloads = ["sharegpt"]\n[load]\nconcurrency = [1]\nrates = [1.0]\n', "not both"),
        ('workloads = ["nope"]\n', "unknown workload"),
        ('[target]\napi_key = "sk-123"\n[load]\n', "api_key is not allowed"),
        ('workloads = ["sharegpt"]\n[slo]\nfoo_ms = 3\n', "unknown key 'foo_ms'"),
        ('workloads = ["sharegpt"]\n[load]\nduration = "soon"\n', "bad duration"),
        ("[load]\nrequests = 3\n", "no workload"),
        ('workloads = ["sharegpt"]\ncolour = "blue"\n', "unknown key"),
    ],
)
def test_errors_are_actionable(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "s.toml"
    p.write_text(body)
    with pytest.raises(ServescopeError) as e:
        load_sweep(p)
    assert needle in e.value.message
    assert "\n" not in e.value.message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ServescopeError, match="no such sweep file"):
        load_sweep(tmp_path / "nope.toml")


def test_server_table_round_trip(tmp_path: Path) -> None:
    launch = "vllm serve my/model --max-model-len 4096 --port 8123"
    path = save_sweep(tmp_path / "s.toml", url="sim://tiny", workloads=["sharegpt"], concurrency=[4], requests=8,
                      launch=launch, variants=["--max-num-seqs 4", "--max-num-seqs 16"], recover_timeout="120s")
    text = path.read_text()
    assert "[server]" in text and "args = \"--max-num-seqs 16\"" in text and "url =" not in text
    sw = load_sweep(path)
    assert sw["launch"] == launch and sw["url"] == ""
    assert sw["server_variant"] == ["--max-num-seqs 4", "--max-num-seqs 16"]
    plan = plan_from_sweep(sw, "", None)
    assert plan.launch == launch and plan.variants == ["--max-num-seqs 4", "--max-num-seqs 16"]
    assert plan.recover_timeout_s == 120 and plan.launch_timeout_s == 900


def test_server_variants_as_plain_strings(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text('workloads = ["sharegpt"]\n[server]\nlaunch = "vllm serve m"\nvariants = ["--max-num-seqs 2"]\n')
    assert load_sweep(p)["server_variant"] == ["--max-num-seqs 2"]
    plan = plan_from_sweep(load_sweep(p), "", None)
    assert plan.launch == "vllm serve m" and plan.url == ""


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[[server.variants]]\nargs = "--max-num-seqs 4"\n', "needs [server] launch"),
        ('[target]\nurl = "http://h:1"\n[server]\nlaunch = "vllm serve m"\n', "not both"),
        ('[server]\nlaunch = "vllm run m"\n', "vllm serve MODEL"),
        ('[server]\nlaunch = "vllm serve m"\ngpu = 1\n', "unknown [server] key"),
        ('[server]\nlaunch = "vllm serve m"\n[[server.variants]]\nargs = "--port x"\n', "not a number"),
        ('[server]\nlaunch = "vllm serve m"\n[[server.variants]]\nflags = "--x"\n', "give only args"),
        ('[server]\nlaunch = "vllm serve m"\nrecover_timeout = "soon"\n', "bad duration"),
    ],
)
def test_server_table_errors(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "s.toml"
    p.write_text('workloads = ["sharegpt"]\n' + body)
    with pytest.raises(ServescopeError) as e:
        load_sweep(p)
    assert needle in e.value.message and "\n" not in e.value.message
