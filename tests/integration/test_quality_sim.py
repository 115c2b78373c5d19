"""`servescope quality` and `--quality-share` end to end against the simulator: the Contract's JSON, task scoring
against a profile with known error rates, divergence against a reference session, quality under load, bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servescope.core.quality import TASKS, TaskItem, score
from servescope.sessions.store import load_session
from tests.integration.helpers import run_json, servescope

# the --fast lane leaves this module out: 12 tests, ~32 s on 2 busy cores (2026-12-08)
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

TINY = (Path(__file__).resolve().parents[2] / "servescope/sim/profiles/tiny.toml").read_text()


def quality(*args: str) -> dict[str, Any]:
    p = servescope("quality", *args, "--json")
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _profile(tmp: Path, name: str, **quality: float) -> Path:
    """tiny.toml with its [quality] table replaced."""
    body = TINY.split("[quality]")[0] + "[quality]\n" + "".join(f"{k} = {v}\n" for k, v in quality.items())
    p = tmp / f"{name}.toml"
    p.write_text(body)
    return p


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulator whose answers are wrong 30% of the time and whose logits carry noise."""
    from servescope.sim.launcher import start_sim

    path = _profile(tmp_path_factory.mktemp("prof"), "degraded", error_rate=0.3, logit_noise=0.3, seed=7)
    with start_sim(str(path)) as h:
        yield h.url


def test_the_cli_default_tasks_are_the_probes_tasks() -> None:
    from servescope.cli.args import DEFAULT_TASKS

    assert ",".join(TASKS) == DEFAULT_TASKS


def test_quality_on_the_simulator_prints_the_contract_and_saves_a_quality_session(tmp_path: Path) -> None:
    out = quality("--url", "sim://tiny", "-n", "5", "--context", "1024,2048", "--save", str(tmp_path / "q"))
    assert set(out) == {"session", "perplexity", "tasks", "reference"}
    assert out["session"] == str(tmp_path / "q") and out["reference"] is None
    assert set(out["tasks"]) == {"arithmetic", "retrieval@1K", "retrieval@2K", "needle@1K", "needle@2K", "json"}
    assert all(t == {"accuracy": 1.0, "n": 5} for t in out["tasks"].values())  # tiny's toy model never errs
    assert out["perplexity"] > 1
    s = load_session(tmp_path / "q")
    assert s.info.kind == "quality" and s.info.quality is not None and s.info.quality.contexts == [1024, 2048]
    q = s.quality()
    assert q is not None and q.summary() == {k: v for k, v in out.items() if k != "session"}
    assert len(q.traces) == 16 and all(1 <= len(t.tokens) == len(t.top) <= 32 for t in q.traces)
    assert "secret" not in (tmp_path / "q" / "session.toml").read_text().lower()


def test_task_scores_follow_the_profiles_error_rate(degraded: str, tmp_path: Path) -> None:
    out = quality("--url", degraded, "--tasks", "arithmetic,json", "-n", "60", "--no-perplexity",
                  "--save", str(tmp_path / "d"))
    acc = [t["accuracy"] for t in out["tasks"].values()]
    assert all(0.5 < a < 0.9 for a in acc), acc  # 30% wrong answers, 60 questions each
    q = load_session(tmp_path / "d").quality()
    assert q is not None and len(q.answers) == 120
    for a in q.answers:  # every stored verdict is the scorer's verdict on the stored output
        scorer = "json" if a["task"] == "json" else "exact"
        assert score(TaskItem(task=a["task"], prompt="", answer=a["answer"], scorer=scorer), a["output"]) == a["ok"]
        if scorer == "exact":
            assert a["ok"] == (a["output"].strip() == a["answer"])


def test_divergence_is_zero_against_itself_and_shows_against_a_noisy_copy(degraded: str, tmp_path: Path) -> None:
    quality("--url", "sim://tiny", "--tasks", "json", "-n", "2", "--save", str(tmp_path / "ref"))
    same = quality("--url", "sim://tiny", "--tasks", "json", "-n", "2", "--reference", str(tmp_path / "ref"),
                   "--save", str(tmp_path / "same"))
    assert same["reference"]["kl_mean"] == 0 and same["reference"]["top1_agreement"] == 1.0
    ref = load_session(tmp_path / "ref").quality()
    assert ref is not None  # never diverged: the first divergence is the generation's length
    assert same["reference"]["first_divergence_mean"] == sum(len(t.tokens) for t in ref.traces) / len(ref.traces)
    noisy = quality("--url", degraded, "--tasks", "json", "-n", "2", "--reference", str(tmp_path / "ref"),
                    "--save", str(tmp_path / "noisy"))
    r = noisy["reference"]
    assert r["kl_mean"] > 1e-3 and r["top1_agreement"] < 1.0 and r["first_divergence_mean"] < 32
    assert noisy["perplexity"] != same["perplexity"]
    md = servescope("compare", str(tmp_path / "same"), str(tmp_path / "noisy"))
    assert md.returncode == 0, md.stderr
    assert "KL" in md.stdout


def test_quality_results_land_in_an_existing_sweep_session(tmp_path: Path) -> None:
    w = tmp_path / "chat.toml"
    w.write_text('[workload]\nname = "chat"\napi = "chat"\ninput_tokens = 256\noutput_tokens = 32\n')
    run = run_json("--url", "sim://tiny", "-w", str(w), "-c", "2", "-n", "6", "--save", str(tmp_path / "s"))
    assert run["cells"][0]["status"] == "done"
    quality("--url", "sim://tiny", "--tasks", "arithmetic", "-n", "3", "--save", str(tmp_path / "s"))
    s = load_session(tmp_path / "s")
    assert s.info.kind == "sweep" and len(s.cells) == 1
    q = s.quality()
    assert q is not None and q.tasks["arithmetic"].n == 3
    rep = servescope("report", str(tmp_path / "s"))
    assert rep.returncode == 0 and "Quality" in rep.stdout and "output tok/s" in rep.stdout.lower()


@pytest.mark.slow
def test_quality_share_puts_accuracy_and_divergence_in_each_cell(degraded: str, tmp_path: Path) -> None:
    # short chat requests (sharegpt's 256 output tokens made the c=1 cell 40 s long): the probe sends its first
    # question once the cell's first request is done and its first divergence prompt once 5 are (a share of 0.2 is
    # one probe per 4 requests), so 24 requests leave both room to finish in either cell
    w = tmp_path / "chat.toml"
    w.write_text('[workload]\nname = "chat"\napi = "chat"\ninput_tokens = 256\noutput_tokens = 64\n')
    out = run_json("--url", degraded, "-w", str(w), "-c", "1,4", "-n", "24", "--quality-share", "0.2")
    for cell in out["cells"]:
        q = cell["quality"]
        assert q["n"] >= 1 and 0 <= q["accuracy"] <= 1 and q["correct"] <= q["n"], (cell["concurrency"], q)
        assert sum(t["n"] for t in q["tasks"].values()) == q["n"]
        assert q["prompts"] >= 1 and q["kl_mean"] >= 0 and 0 <= q["top1_agreement"] <= 1
        assert cell["requests_ok"] == 24  # the probe's requests are not in the cell's own figures


@pytest.mark.parametrize(("args", "message"), [
    (("--tasks", "arithmetic,trivia"), r"unknown task 'trivia' in --tasks; use a comma-separated list of"),
    (("--context", "100000"), r"--context 100000 does not fit the model's max_model_len 8192"),
    (("--context", "12x"), r"bad --context value '12x'"),
    (("--reference", "/nonexistent/session"), r"no session '/nonexistent/session'"),
    (("--task-file", "/nonexistent.jsonl"), r"--task-file /nonexistent.jsonl: no such file"),
    (("--top-k", "50"), r"--top-k 50: servers return at most 20"),
])
def test_bad_input_is_one_clear_line(args: tuple[str, ...], message: str) -> None:
    p = servescope("quality", "--url", "sim://tiny", *args)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert err and re.search(message, err[-1]), p.stderr
    assert "Traceback" not in p.stderr


def test_a_bad_quality_share_is_refused_before_anything_runs() -> None:
    p = servescope("run", "--url", "sim://tiny", "--quality-share", "0.9")
    assert p.returncode != 0 and "must be from 0 to 0.5" in p.stderr and "Traceback" not in p.stderr


def test_the_api_key_is_never_written_into_a_quality_session(tmp_path: Path) -> None:
    key = "sk-quality-secret-4242"
    p = servescope("quality", "--url", "sim://tiny", "--tasks", "arithmetic", "-n", "2", "--save", str(tmp_path / "k"),
                   "--json", env={"OPENAI_API_KEY": key})
    assert p.returncode == 0, p.stderr
    files = [f for f in (tmp_path / "k").rglob("*") if f.is_file()]
    assert files and not any(key.encode() in f.read_bytes() for f in files)
    assert key not in p.stdout + p.stderr
    rep = servescope("report", str(tmp_path / "k"))
    assert rep.returncode == 0 and key not in rep.stdout
