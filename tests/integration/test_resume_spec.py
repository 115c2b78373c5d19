"""A session's [sweep] table is the whole sweep: `resume` continues with every setting the sweep started
with, and `run --sweep SESSION/session.toml` plans exactly the same cells (simulator, real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from servescope.engine.spec import SweepSpec
from servescope.sessions.store import load_session
from tests.integration.helpers import ROOT, run_json, servescope, wait_for
from tests.support.meta import stored
from tests.support.vllm_server import setup


def _kill_9_after_first_cell(args: list[str], save: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "run", *args, "--save", str(save)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (save / "cells.parquet").exists() and pl.read_parquet(save / "cells.parquet").height >= 1,
                 120, "the first cell on disk")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()


@pytest.mark.vllm  # the tiny model's tokenizer is built by the real vLLM's setup (.ci/setup_vllm.sh)
def test_resume_continues_with_the_tokenizer_transport_and_telemetry_interval(tmp_path: Path) -> None:
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1: real-vLLM tests skipped on purpose")
    _venv, models = setup()
    tok = models / "dense"  # a local Hugging Face tokenizer (the tests' tiny model)
    save = tmp_path / "s"
    _kill_9_after_first_cell(["--url", "sim://tiny", "-w", "sharegpt", "-c", "2,3,4", "-n", "6",
                              "--tokenizer", str(tok), "--transport", "httpx", "--telemetry-interval", "off"], save)
    before = load_session(save)
    assert before.status == "interrupted" and before.cells.height == 1

    p = servescope("resume", str(save), "--json")  # no flag repeats the settings: the session has them
    assert p.returncode == 0, p.stderr[-3000:]
    s = load_session(save)
    assert s.status == "completed"
    cells = s.cells.sort("index")
    assert cells["status"].to_list() == ["done", "done", "done"]
    # what each cell really ran with, recorded by the runner as it ran it (cells 1-2 ran after the resume)
    assert cells["tokenizer"].to_list() == [f"local {tok}"] * 3
    assert cells["transport"].to_list() == ["httpx"] * 3
    assert cells["telemetry_interval"].to_list() == ["off"] * 3
    spec = SweepSpec.from_toml(save / "session.toml")
    assert (spec.tokenizer, spec.transport, spec.telemetry_interval_s) == (str(tok), "httpx", None)


@pytest.mark.slow
def test_run_sweep_of_a_session_plans_the_same_cells(tmp_path: Path) -> None:
    first = run_json("--url", "sim://tiny", "-w", "sharegpt,longin", "-c", "1,2", "-n", "2", "--warmup", "1",
                     "--slo", "ttft_ms=3000", "--tag", "k=v", "--save", str(tmp_path / "a"))
    again = run_json("--sweep", str(tmp_path / "a" / "session.toml"), "--save", str(tmp_path / "b"))
    key = ("index", "workload", "concurrency", "rate", "requests_planned", "warmup", "server_variant")
    a, b = (stored(load_session(x["session"]))["cells"] for x in (first, again))
    assert [tuple(c.get(k) for k in key) for c in a] == [tuple(c.get(k) for k in key) for c in b]
    assert len(a) == 4
    assert stored(load_session(again["session"]))["tags"] == {"k": "v"}
    assert stored(load_session(again["session"]))["slos"] == {"ttft_ms": 3000.0}


@pytest.mark.slow
def test_the_same_seed_sends_the_same_requests(tmp_path: Path) -> None:
    wl = tmp_path / "w.toml"  # lengths drawn from a range, short outputs: the run takes a second
    wl.write_text('[workload]\nname = "u"\napi = "chat"\ninput_tokens = { dist = "uniform", min = 100, max = 400 }\n'
                  'output_tokens = 8\n')

    def lengths(seed: str) -> list[int]:
        out = run_json("--url", "sim://tiny", "-w", str(wl), "-c", "1", "-n", "6", "--seed", seed,
                       "--telemetry-interval", "off", "--sessions-dir", str(tmp_path))
        return load_session(out["session"]).requests().sort("index")["input_tokens_requested"].to_list()

    a, b, c = lengths("7"), lengths("7"), lengths("8")
    assert a == b and a != c
