"""SweepSpec: the sweep-file schema, flags as overrides, the Compose form, and errors a user can act on."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.spec import RunContext, SweepSpec, add_flags, add_workload_flag, parse_field
from servescope.workloads.spec import PRESETS, Workload, fixed, load_toml


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_workload_flag(p)
    add_flags(p)
    return p.parse_args(list(argv))


def test_round_trip_presets_inline_and_files(tmp_path: Path) -> None:
    wfile = tmp_path / "wl" / "rag.toml"
    wfile.parent.mkdir()
    wfile.write_text('[workload]\nname = "rag"\ninput_tokens = 4096\noutput_tokens = 128\n')
    inline = Workload("mine", "chat", fixed(100), fixed(20), source="inline", description="made in the app")
    spec = SweepSpec(url="sim://tiny", api_key_env="MY_KEY", model="tiny",
                     workloads=(PRESETS["sharegpt"], *load_toml(wfile), inline), concurrency=(1, 4, 16),
                     requests=50, duration_s=30, warmup=2, slos={"ttft_ms": 3000, "tpot_ms": 50},
                     tags={"quant": "FP8"}, name="nightly", tokenizer="/tok", transport="httpx",
                     telemetry_interval_s=None, electricity_price=0.2)
    path = spec.save(tmp_path / "sweep.toml")
    text = path.read_text()
    assert "MY_KEY" in text and "api_key =" not in text
    back = SweepSpec.from_toml(path)
    assert [w.name for w in back.workloads] == ["sharegpt", "rag", "mine"]
    assert back.workloads[2].input_tokens == fixed(100)
    assert back == spec.replace(workloads=back.workloads)  # every other field survives the file
    assert back.telemetry_interval_s is None and back.transport == "httpx" and back.tokenizer == "/tok"


def test_inline_workloads_make_a_session_table_self_contained(tmp_path: Path) -> None:
    wfile = tmp_path / "rag.toml"
    wfile.write_text('[workload]\nname = "rag"\ninput_tokens = 64\noutput_tokens = 8\n')
    spec = SweepSpec(workloads=(PRESETS["sustained-c32"], *load_toml(wfile)), requests=3)
    table = spec.to_table(inline_workloads=True)
    assert table["workloads"] == ["sustained-c32"] and table["workload"][0]["name"] == "rag"
    wfile.unlink()  # the file is gone: the table still holds the workload
    back = SweepSpec.from_table(table, "session")
    assert [w.name for w in back.workloads] == ["sustained-c32", "rag"]
    assert back.workloads[0].default_concurrency == (32,)  # a preset comes back with its defaults


def test_relative_workload_paths_resolve_next_to_the_sweep(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text('[workload]\nname = "w"\ninput_tokens = 64\noutput_tokens = 8\n')
    (tmp_path / "s.toml").write_text('workloads = ["w.toml"]\n[load]\nrates = [0.5, 2]\nrequests = 10\n')
    spec = SweepSpec.from_toml(tmp_path / "s.toml")
    assert spec.rates == (0.5, 2.0) and spec.concurrency is None
    assert spec.workloads[0].name == "w"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[target\nurl = 1", "s.toml:1:"),
        ('workloads = ["sharegpt"]\n[load]\nconcurrency = [1, "x", 4]\n', "s.toml:3: [load] concurrency"),
        ('workloads = ["sharegpt"]\n[load]\nconcurrency = "1,x,4"\n', "'x'"),
        ('workloads = ["sharegpt"]\n[load]\nconcurrency = [1]\nrates = [1.0]\n', "not both"),
        ('workloads = ["nope"]\n', "unknown workload"),
        ('[target]\napi_key = "sk-123"\n[load]\n', "not allowed (keys never go in files)"),
        ('workloads = ["sharegpt"]\n[slo]\nfoo_ms = 3\n', "bad SLO 'foo_ms': not a metric"),
        ('workloads = ["sharegpt"]\n[slo]\nttft_ms = -5\n', "above 0"),
        ('workloads = ["sharegpt"]\n[load]\nduration = "soon"\n', "s.toml:3: [load] duration: bad duration"),
        ('workloads = ["sharegpt"]\n[load]\nconcurency = [4]\n', "did you mean 'concurrency'?"),
        ('[[workload]]\nname = "w"\ninput_tokns = 4\n', "unknown key 'input_tokns'; did you mean 'input_tokens'?"),
        ('workloads = ["sharegpt"]\n[load]\nrequests = 0\n', "at least 1"),
        ("[load]\nrequests = 3\n", "no workload"),
        ('workloads = ["sharegpt"]\ncolour = "blue"\n', "s.toml:2: colour: unknown key"),
        ('workloads = ["sharegpt"]\n[target]\ntransport = "curl"\n', "'raw', 'aiohttp' or 'httpx'"),
    ],
)
def test_errors_are_actionable(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "s.toml"
    p.write_text(body)
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_toml(p)
    assert needle in e.value.message
    assert "\n" not in e.value.message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ServescopeError, match="no such sweep file"):
        SweepSpec.from_toml(tmp_path / "nope.toml")
    with pytest.raises(ServescopeError, match="is a directory"):
        SweepSpec.from_toml(tmp_path)


def test_server_table_round_trip(tmp_path: Path) -> None:
    launch = "vllm serve my/model --max-model-len 4096 --port 8123"
    spec = SweepSpec(workloads=(PRESETS["sharegpt"],), concurrency=(4,), requests=8, launch=launch,
                     variants=("--max-num-seqs 4", "--max-num-seqs 16"), recover_timeout_s=120)
    text = spec.save(tmp_path / "s.toml").read_text()
    assert "[server]" in text and "args = \"--max-num-seqs 16\"" in text and "url =" not in text
    back = SweepSpec.from_toml(tmp_path / "s.toml")
    assert back.launch == launch and back.variants == ("--max-num-seqs 4", "--max-num-seqs 16")
    assert back.recover_timeout_s == 120 and back.launch_timeout_s == 900


def test_server_variants_as_plain_strings(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text('workloads = ["sharegpt"]\n[server]\nlaunch = "vllm serve m"\nvariants = ["--max-num-seqs 2"]\n')
    spec = SweepSpec.from_toml(p)
    assert spec.variants == ("--max-num-seqs 2",) and spec.launch == "vllm serve m"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[[server.variants]]\nargs = "--max-num-seqs 4"\n', "need a launch command"),
        ('[target]\nurl = "http://h:1"\n[server]\nlaunch = "vllm serve m"\n', "not both"),
        ('[server]\nlaunch = "vllm run m"\n', "vllm serve MODEL"),
        ('[server]\nlaunch = "vllm serve m"\ngpu = 1\n', "[server] gpu: unknown key"),
        ('[server]\nlaunch = "vllm serve m"\n[[server.variants]]\nargs = "--port x"\n', "not a number"),
        ('[server]\nlaunch = "vllm serve m"\n[[server.variants]]\nflags = "--x"\n', "give only args"),
        ('[server]\nlaunch = "vllm serve m"\nrecover_timeout = "soon"\n', "bad duration"),
    ],
)
def test_server_table_errors(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "s.toml"
    p.write_text('workloads = ["sharegpt"]\n' + body)
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_toml(p)
    assert needle in e.value.message and "\n" not in e.value.message


def test_flags_override_a_file(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text('workloads = ["sharegpt"]\n[target]\nurl = "sim://tiny"\n[load]\nrates = [1.0]\nrequests = 9\n'
                 '[telemetry]\ninterval = "2s"\n')
    base = SweepSpec.from_toml(p)
    spec = SweepSpec.from_args(_args("-c", "2,8", "--transport", "httpx", "--telemetry-interval", "off",
                                     "--tag", "a=1", "--tag", "b=2"), base)
    assert spec.concurrency == (2, 8) and spec.rates is None  # the flag replaces the file's counterpart
    assert spec.requests == 9 and spec.url == "sim://tiny"  # what no flag gave stays the file's
    assert spec.transport == "httpx" and spec.telemetry_interval_s is None
    assert spec.tags == {"a": "1", "b": "2"}


def test_a_tag_or_slo_flag_overrides_only_the_keys_it_names(tmp_path: Path) -> None:
    """`--sweep FILE --tag quant=FP8` kept quant=FP8 alone and dropped the file's gpu=RTXPro6000 (issue 44, item 7);
    --slo is a table too. A price names both its keys, so its flag replaces the file's whole (it is complete)."""
    p = tmp_path / "s.toml"
    p.write_text('workloads = ["sharegpt"]\n[target]\nurl = "sim://tiny"\nprice = {input = 1, output = 2}\n'
                 '[slo]\nttft_ms = 3000\ntpot_ms = 50\n[tags]\nquant = "GPTQ-Int4"\ngpu = "RTXPro6000"\n')
    base = SweepSpec.from_toml(p)
    spec = SweepSpec.from_args(_args("--tag", "quant=FP8", "--slo", "ttft_ms=1000"), base)
    assert spec.tags == {"quant": "FP8", "gpu": "RTXPro6000"}
    assert spec.slos == {"ttft_ms": 1000, "tpot_ms": 50}
    assert SweepSpec.from_args(_args("--tag", "run=2"), base).tags == {"quant": "GPTQ-Int4", "gpu": "RTXPro6000",
                                                                       "run": "2"}
    priced = SweepSpec.from_args(_args("--price", "input=3,output=4"), base).price
    assert priced is not None and (priced.input, priced.output) == (3, 4)
    assert SweepSpec.from_args(_args("--tag", "quant=FP8")).tags == {"quant": "FP8"}  # no file: the flags alone


def test_flags_alone_use_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVESCOPE_URL", raising=False)
    spec = SweepSpec.from_args(_args())
    assert spec == SweepSpec(workloads=(PRESETS["sharegpt"],))
    assert spec.arrival == "poisson" and spec.url == "sim://"
    assert SweepSpec.from_args(_args("--no-ignore-eos")).ignore_eos is False


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-c", "1,x"], "--concurrency: bad value 'x'"),
        (["-c", "1", "--rate", "2"], "not both"),
        (["--slo", "ttft_ms=nan"], "above 0"),
        (["--electricity-price", "-3"], "0 or more"),
        (["--server-variant", "--max-num-seqs 4"], "flags: server variants need a launch command"),
        (["--launch", "vllm serve m", "--url", "http://h:1"], "not both"),
        (["--tag", "novalue"], "KEY=VALUE"),
        (["-n", "0"], "at least 1"),
        # issue 32: accepted silently, or refused by argparse before the value was read
        (["-c", "1,,4"], "--concurrency: '1,,4' has an empty item; give positive integers like 1,4,8"),
        (["--rate", "0.5,"], "--rate: '0.5,' has an empty item; give request rates like 0.5,2,5"),
        (["-w", ""], "--workload: empty; give a value"),
        (["--launch", ""], "--launch: empty; give a value"),
        (["--launch", "vllm serve m", "--server-variant", " "], "--server-variant: variant 1 is empty"),
        (["--ray-nodes", "10.0.0.2"], "flags: ray nodes place Ray workers; add ray = \"auto\""),
        (["--ray", "auto", "--ray-nodes", "a,,b"], "--ray-nodes: 'a,,b' has an empty item"),
        (["--rate", "2", "--ramp", "-5s"], "--ramp: the duration must be above 0, not -5s (e.g. 10s)"),
        (["--duration", "-1s"], "--duration: the duration must be above 0, not -1s (e.g. 10s)"),
        (["--telemetry-interval", "-1s"], "--telemetry-interval: the duration must be above 0, not -1s"),
        (["--duration", "1e308s"], "--duration: 1e308s is too long; give at most 2592000s (30 days)"),
        (["--rate", "2", "--ramp", "721h"], "--ramp: 721h is too long; give at most 2592000s (30 days)"),
        (["--url", "http://[::1"], "--url: 'http://[::1' is not a URL (Invalid IPv6 URL); give e.g."),
        (["--url", "ftp://h"], "--url: 'ftp://h' is not an http(s) URL with a host"),
        (["--slo", ""], "--slo: empty; give a value"),
        (["--slo", "tpot_ms=0"], "--slo: tpot_ms=0: tpot_ms must be a number above 0, e.g. tpot_ms=50"),
        (["--slo", "ttft_ms=-5"], "--slo: ttft_ms=-5: ttft_ms must be a number above 0, e.g. ttft_ms=3000"),
    ],
)
def test_bad_flags(argv: list[str], needle: str) -> None:
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_args(_args(*argv))
    assert needle in e.value.message


def test_durations_up_to_30_days_are_read_and_written_back() -> None:
    spec = SweepSpec.from_args(_args("--duration", "720h", "--rate", "2", "--ramp", "2592000s"))
    assert spec.duration_s == spec.ramp_s == 30 * 86400
    assert SweepSpec.from_table(spec.to_table()) == spec
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_table({"workloads": ["sharegpt"], "load": {"rates": [2], "ramp": 1e308}})
    assert e.value.message == "sweep: [load] ramp: 1e+308 is too long; give at most 2592000s (30 days)"


def test_an_empty_form_field_still_means_unset() -> None:
    """An empty flag is refused, but an empty field of the Compose form means "the default", as before."""
    spec, errors = SweepSpec.from_form({"slos": "", "launch": "", "model": "", "duration_s": "",
                                        "workloads": [PRESETS["sharegpt"]]})
    assert errors == {} and spec is not None
    assert spec.slos == {} and spec.launch is None and spec.model is None and spec.duration_s is None


def test_form_reports_every_bad_field_at_once() -> None:
    spec, errors = SweepSpec.from_form({"concurrency": "1,x", "requests": "-1", "slos": "ttft_ms=3000",
                                        "workloads": [PRESETS["sharegpt"]]})
    assert spec is None and set(errors) == {"concurrency", "requests"}
    spec, errors = SweepSpec.from_form({"concurrency": "1,4", "requests": "", "duration_s": "5s",
                                        "workloads": [PRESETS["sharegpt"]]},
                                       base=SweepSpec(tokenizer="/tok", workloads=(PRESETS["longin"],)))
    assert errors == {} and spec is not None
    assert spec.concurrency == (1, 4) and spec.duration_s == 5 and spec.requests is None
    assert spec.tokenizer == "/tok"  # what the form does not show comes from the loaded file
    assert [w.name for w in spec.workloads] == ["sharegpt"]


def test_a_session_toml_is_a_sweep_file(tmp_path: Path) -> None:
    spec = SweepSpec(workloads=(PRESETS["sharegpt"],), concurrency=(1, 2), requests=4, tokenizer="/tok")
    import tomli_w

    (tmp_path / "session.toml").write_text(tomli_w.dumps(
        {"schema_version": 2, "status": "completed", "cells": [{"index": 0}],
         "sweep": spec.to_table(inline_workloads=True)}))
    assert SweepSpec.from_toml(tmp_path / "session.toml") == spec
    assert SweepSpec.from_toml(tmp_path) == spec  # the session directory names its session.toml


def test_run_context_is_not_in_the_file() -> None:
    ctx = RunContext(url="http://127.0.0.1:1", api_key="sk-secret")
    table = SweepSpec(workloads=(PRESETS["sharegpt"],)).to_table()
    assert "sk-secret" not in repr(table) and ctx.api_key == "sk-secret"


def test_the_sweep_seed_reaches_every_cell() -> None:
    from servescope.engine.plan import plan_cells

    base = plan_cells(SweepSpec.from_args(_args("-c", "1,4")))
    seeded = plan_cells(SweepSpec.from_args(_args("-c", "1,4", "--seed", "7")))
    assert [c.prompt_key for c in base] == ["cell0", "cell1"] and [c.seed for c in base] == [0, 1]
    assert [c.prompt_key for c in seeded] == ["seed7-cell0", "seed7-cell1"]
    assert len({c.seed for c in seeded} | {c.seed for c in base}) == 4
    assert SweepSpec.from_table(SweepSpec(workloads=(PRESETS["sharegpt"],), seed=7).to_table()).seed == 7


@pytest.mark.parametrize(("key", "raw", "twice"), [("concurrency", "4,1,4", "4"), ("rates", "0.5,2,0.5", "0.5")])
def test_a_load_level_given_twice_is_refused_in_one_line(key: str, raw: str, twice: str) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_field(key, raw)
    msg = e.value.message
    assert "\n" not in msg and f"{twice} is given twice" in msg, msg
    with pytest.raises(ServescopeError):
        SweepSpec.from_table({"load": {key: [4, 1, 4] if key == "concurrency" else [0.5, 2, 0.5]}})


def test_the_compose_form_and_the_apps_wording_come_from_the_options() -> None:
    """Each option on the Compose form declares its field (Option.form): the form's id -> field map and the
    app's wording of that option's flags are read from it, so a new option on the form is one declaration."""
    import dataclasses

    from servescope.engine.spec import FormField, SweepSpec, form_fields, form_labels, form_wording
    from servescope.tui.wire import app_wording

    names = {fd.name for fd in dataclasses.fields(SweepSpec)}
    form = form_fields()
    assert set(form.values()) <= names and form["duration"] == "duration_s" and form["key-env"] == "api_key_env"
    said = form_wording()
    assert said["--url"] == "the URL field" and said["--launch"] == "the `or launch` field"
    assert "--transport" not in said  # not on the form: the flag stays as it is in the app's messages
    assert app_wording("give --duration 60s or --transport raw") == "give the duration field 60s or --transport raw"
    assert FormField("x", "quality share").said == "the `quality share` field"
    labels = form_labels()  # what the Compose screen shows beside each of these fields
    assert labels.keys() == form.keys() and labels["key-env"] == "API key var" and labels["launch"] == "or launch"
