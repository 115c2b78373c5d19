"""`servescope run` against the simulator's hosted mode (`sim://tiny?hosted=1`: no /tokenize, no /metrics, a
tokens-per-minute limit answered 429 with Retry-After, network latency), as a user points it at a hosted API:
429s are counted as rate_limited (never as failures), --retry-after waits them out and records the waits, input
lengths are calibrated on the server's own usage to within 3% of the request, and a 400 for ignore_eos drops the
field once for the whole session. The simulator's own tokenizer is the ground truth: its usage.prompt_tokens."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import polars as pl
import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import servescope

# the --fast lane leaves this module out: 1 tests, ~3 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

OFF = ("--telemetry-interval", "off")


def _workload(tmp: Path, name: str, tokens: int, api: str = "completions", out: int = 16) -> str:
    p = tmp / f"{name}.toml"
    p.write_text(f'[workload]\nname = "{name}"\napi = "{api}"\ninput_tokens = {tokens}\noutput_tokens = {out}\n')
    return str(p)


def _run(*args: str) -> tuple[dict[str, object], str, str]:
    p = servescope("run", *args, *OFF, "--json", timeout=300)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return out, p.stdout, p.stderr


def test_429s_are_rate_limited_not_failures(tmp_path: Path) -> None:
    # 1,000 tokens a minute: the calibration's probes and a few requests of ~80 tokens, then every request gets 429
    out, _, _ = _run("--url", "sim://tiny?hosted=1&tpm=1000", "-w", _workload(tmp_path, "in64", 64),
                     "-c", "4", "-n", "40", "--save", str(tmp_path / "s"))
    [cell] = out["cells"]  # type: ignore[misc]
    limited = cell["requests_rate_limited"]
    assert limited >= 8 and cell["requests_ok"] >= 1, cell
    req = load_session(tmp_path / "s").requests(0)
    statuses = req["status"].value_counts().to_dicts()
    by = {d["status"]: d["count"] for d in statuses}
    assert by["rate_limited"] == limited and by["ok"] == cell["requests_ok"]
    assert cell["requests_failed"] == sum(n for s, n in by.items() if s not in ("ok", "rate_limited"))  # 429s apart
    assert not {"error", "timeout", "cut", "bad_usage"} & set(by), by  # a 429 is never an error
    assert (req.filter(pl.col("status") == "rate_limited")["retry_after_s"] > 0).all()  # the wait each was told
    assert (req.filter(pl.col("status") == "rate_limited")["http_status"] == 429).all()
    # a closed loop that only collects 429s ends the cell and says what to do
    assert "rate-limited (HTTP 429" in cell["reason"] and "--retry-after" in cell["reason"], cell["reason"]
    # the human table and the report say it as the JSON does
    text = servescope("report", str(tmp_path / "s"), timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"{limited} of " in text.stdout and "HTTP 429" in text.stdout, text.stdout[-1500:]


@pytest.mark.slow
def test_retry_after_waits_and_records_each_wait(tmp_path: Path) -> None:
    # 1,800 tokens a minute (30 a second): the first ~13 requests are paid from the full bucket, the rest wait
    out, _, table = _run("--url", "sim://tiny?hosted=1&tpm=1800", "-w", _workload(tmp_path, "in64", 64),
                          "-c", "3", "-n", "16", "--retry-after", "20s", "--save", str(tmp_path / "s"))
    [cell] = out["cells"]  # type: ignore[misc]
    assert (cell["requests_ok"], cell["requests_failed"], cell["requests_rate_limited"]) == (16, 0, 0), cell
    assert cell["rate_limit_retries"] >= 1 and cell["retry_wait_s"] > 0.5, cell
    req = load_session(tmp_path / "s").requests(0)
    waited = req.filter(pl.col("retries") > 0)
    assert waited.height >= 1 and (waited["retry_wait_s"] > 0).all()
    assert abs(float(req["retry_wait_s"].sum()) - cell["retry_wait_s"]) < 1e-6
    # a request that waited shows it in its client queueing (its latency is the served attempt's)
    queue_ms = (waited["sent_ns"] - waited["scheduled_ns"]) / 1e6
    assert (queue_ms >= waited["retry_wait_s"] * 1000).all()
    assert "rate limits: " in table and "sent again (--retry-after)" in table  # --json: the table is on stderr
    assert cell["retry_after_s_max"] is not None and cell["retry_after_s_max"] <= 20


@pytest.mark.slow
def test_calibrated_input_lengths_land_within_3_percent(tmp_path: Path) -> None:
    wl = ",".join([_workload(tmp_path, "c64", 64), _workload(tmp_path, "c700", 700),
                   _workload(tmp_path, "c3000", 3000, out=4), _workload(tmp_path, "chat64", 64, api="chat")])
    out, _, stderr = _run("--url", "sim://tiny?hosted=1&tpm=0", "-w", wl, "-c", "4", "-n", "24",
                               "--save", str(tmp_path / "s"))
    cells = out["cells"]
    assert len(cells) == 4  # type: ignore[arg-type]
    for c in cells:  # type: ignore[attr-defined]
        req, got = c["input_tokens_requested"], c["input_tokens_mean"]  # got: the server's usage.prompt_tokens
        assert c["requests_ok"] == 24 and c["input_lengths"] == "calibrated", c
        assert abs(got - req) <= 0.03 * req, (c["workload"], req, got)
    assert "input lengths are calibrated" in stderr and "estimated" not in stderr, stderr
    assert "calibrated lengths: no /tokenize" in stderr  # the table (on stderr with --json)
    meta = tomllib.loads((tmp_path / "s" / "session.toml").read_text())
    assert meta["input_lengths"]["method"] == "calibrated" and meta["input_lengths"]["probes"] == 6
    report = servescope("report", str(tmp_path / "s"), timeout=120).stdout
    assert "input lengths are calibrated on the server's usage, not exact" in report


@pytest.mark.slow
def test_a_refused_ignore_eos_is_dropped_once_and_said_once(tmp_path: Path) -> None:
    wl, wl2 = _workload(tmp_path, "in64", 64), _workload(tmp_path, "in64b", 64)  # two cells, each its own name
    for url in ("sim://tiny?hosted=1&tpm=0&reject_vllm_fields=1", "sim://tiny?reject_vllm_fields=1"):
        # hosted: found on the calibration's probe; with /tokenize: on the first requests (4 at once)
        save = tmp_path / url.split("?")[1].replace("&", "-")
        out, _, stderr = _run("--url", url, "-w", f"{wl},{wl2}", "-c", "4", "-n", "8", "--save", str(save))
        cells = out["cells"]
        assert [(c["requests_ok"], c["requests_failed"]) for c in cells] == [(8, 0), (8, 0)], cells  # type: ignore[attr-defined]
        assert stderr.count("refused ignore_eos") == 1, stderr
        meta = tomllib.loads((save / "session.toml").read_text())
        assert "ignore_eos" in meta["ignore_eos_dropped"]
        assert [e["kind"] for e in meta["events"]].count("ignore_eos_dropped") == 1
        report = servescope("report", str(save), timeout=120).stdout
        assert "the server refused ignore\\_eos" in report  # Markdown escapes the underscore
