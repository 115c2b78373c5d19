"""servescope launches the real CPU vLLM itself: KV budget from log and /metrics, two server variants (the first
with n-gram speculation, whose cells carry its acceptance), each launch's cold start, and a kill -9 of the server
mid-sweep that servescope survives by relaunching it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import run_json
from tests.support import vllm_server

pytestmark = pytest.mark.vllm
N_REQUESTS = 24  # per cell
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
V2 = f"--max-num-seqs 2 --speculative-config '{NGRAM}'"  # the first variant speculates (n-gram), the second not
V8 = "--max-num-seqs 8"


def _second_cell(save: Path) -> tuple[bool, bool, bool]:
    """(the second cell has started, its requests are in the server, it has ended), from the session's event log:
    in the server once the log has a batch of the second cell's finished requests with fewer than all of them
    done, and no end of that cell (a closed loop keeps its users' next requests in the server meanwhile)."""
    import json

    log = save / "events.jsonl"
    if not log.exists():
        return False, False, False
    started = measuring = ended = False
    for line in log.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        kind, cell = ev.get("kind"), (ev.get("fields") or {}).get("cell") or {}
        if cell.get("index") != 1:
            continue
        if kind == "CellStarted":
            started = True
        elif kind == "RequestsMeasured" and 0 < int(ev["fields"].get("done") or 0) < N_REQUESTS:
            measuring = True
        elif kind in ("CellFinished", "CellSkipped"):
            ended = True
    return started, started and measuring and not ended, ended


def _pids_listening_on(port: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and str(port).encode() in cmd and any(b"vllm" in c for c in cmd):
            pids.append(int(d.name))
    return pids


def test_launch_variants_and_kill_9(tmp_path: Path) -> None:
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1")
    venv, models = vllm_server.setup()
    port = vllm_server.free_port()
    # vLLM puts ZMQ ipc sockets in TMPDIR, whose paths must stay under 107 bytes: a short scratch folder
    scratch = Path(tempfile.mkdtemp(prefix="ssv-"))
    env = vllm_server.vllm_env(scratch)
    env_words = " ".join(f"{k}={env[k]}" for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT",
                                                   "TMPDIR", "VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE"))
    launch = f"{env_words} {venv}/bin/vllm serve {models}/dense --max-model-len 2048 --enforce-eager --port {port}"
    wl = tmp_path / "w.toml"
    # 128 output tokens: the second cell lasts seconds, so the kill lands inside it, not in the variant switch
    # greedy: a random-weight model's text repeats itself, so the n-gram proposer drafts and vLLM accepts
    wl.write_text('[workload]\nname = "short"\ninput_tokens = 128\noutput_tokens = 128\ntemperature = 0\n')
    save = tmp_path / "s"
    killed = threading.Event()

    killed_pids: list[int] = []
    looks: list[str] = []  # what the killer saw, for the failure message: "t+s started/measuring/ended pids"

    def killer() -> None:
        t0 = time.monotonic()
        deadline = t0 + 600
        while time.monotonic() < deadline:
            # once the second cell has started and not ended (the session's event log says so; the first cell was
            # on disk before it started), kill -9 at once: its closed loop sends its users' requests as it starts,
            # and a fast server finished a 24-request cell within 0.3 s of its start. Nothing slow is asked in
            # between: a look at the server's /metrics, which a busy CPU server answers late, once let the cell
            # end before the kill
            try:
                started, measuring, ended = _second_cell(save)
            except Exception as e:  # noqa: BLE001 - a file being replaced: look again
                looks.append(f"{time.monotonic() - t0:.2f} {type(e).__name__}")
                started = ended = False
            if started:
                pids = [] if ended else _pids_listening_on(port)
                looks.append(f"{time.monotonic() - t0:.2f} started{' measuring' * measuring}{' ended' * ended} "
                             f"pids {pids}")
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed_pids.append(pid)
                    except ProcessLookupError:
                        pass
                if killed_pids:
                    killed.set()
                    return
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        out = _run(launch, wl, save)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    t.join(5)
    assert killed.is_set(), f"the killer found no running cell to kill the server in; its looks: {looks[-20:]}"
    _check(out, save, port, killed)


def _run(launch: str, wl: Path, save: Path) -> dict[str, Any]:
    return run_json("--launch", launch, "--server-variant", V2, "--server-variant", V8,
                    "-w", str(wl), "-c", "4,8", "-n", str(N_REQUESTS), "--save", str(save), "--recover-timeout", "300s",
                    "--telemetry-interval", "0.5s", timeout=1500)


def _check(out: dict[str, Any], save: Path, port: int, killed: threading.Event) -> None:
    assert killed.is_set()
    assert out["status"] == "completed"
    s = load_session(save)
    cells = s.cells.sort("index")
    assert cells["status"].to_list() == ["done"] * 4  # the lost cell was re-run; no finished cell lost
    assert cells["server_variant"].to_list() == [V2] * 2 + [V8] * 2
    # each launch's cold start (the first, the restart after the kill, the second variant's): healthy, first token
    # and the phases vLLM's log names; the speculating variant's cells carry its acceptance, the other's none
    variant_of = dict(zip(cells["index"].to_list(), cells["server_variant"].to_list(), strict=True))
    for c in out["cells"]:
        st = c["startup"]
        assert 0 < st["healthy_s"] <= st["first_token_s"], st
        assert {"weights_s", "engine_init_s"} <= set(st["phases"]), st  # the CPU build logs these two
        assert (variant_of[c["index"]] == V2) or c["spec_decode"] is None, c["spec_decode"]
    # a cell's figures need both its boundary scrapes of /metrics, which a busy 2-core box's CPU vLLM may answer
    # only after the cell ended (then the cell has none): one speculating cell with its acceptance will do
    spec = {c["index"]: c["spec_decode"] for c in out["cells"]}
    assert any(sd is not None and 0 < (sd["acceptance_rate"] or 0) <= 1 and (sd["mean_accepted_tokens"] or 0) > 0
               for i, sd in spec.items() if variant_of[i] == V2), spec
    assert out["cells"][0]["startup"] != out["cells"][-1]["startup"]  # two launches, two records
    kinds = [e["kind"] for e in s.meta["events"]]
    assert "server_lost" in kinds and "server_back" in kinds and "server_launched" in kinds
    assert s.requests().height == 4 * N_REQUESTS
    assert (s.requests()["output_tokens"] == 128).all()
    # the KV budget from the startup log equals the one from /metrics
    kv = s.meta["kv_budget"]
    assert kv["source"] == "metrics+log" and kv["kv_cache_tokens"] == kv["log_kv_cache_tokens"] > 0
    assert s.meta["server"]["args"]["max_num_seqs"] == 2
    assert s.meta["server"]["variant_args"]["1"]["max_num_seqs"] == 8
    # each variant ran with its own setting. vLLM's own queue time (its /metrics histogram, exact deltas at the cell's
    # boundaries): at c=8, 2 sequences in a batch make 6 requests wait for a whole reply before they are scheduled;
    # 8 do not. (Timings such as TTFT say the same on a quiet machine but move with a busy 2-core box, and its
    # sampled running gauge is not reliable: a busy CPU vLLM may answer a scrape only after the cell ended.)
    queue = {(r["server_variant"], r["concurrency"]): summary.value("server", "queue_ms_mean")
             for r, summary in zip(s.cells.to_dicts(), s.summaries(), strict=True) if summary is not None}
    two, eight = queue[(V2, 8)], queue[(V8, 8)]
    running = {(r["server_variant"], r["concurrency"]): r["telemetry_running_max"] or 0 for r in cells.to_dicts()}
    # The client shares 2 cores with CPU vLLM and its loop lags by seconds here (its health says `bound`, before
    # this change too): a stall can deliver a c=8 cell's requests to max-num-seqs 2 a few at a time, with no queue.
    # Then the running gauge shows the other variant's higher limit at work: either server-side sign will do.
    assert two is not None and eight is not None, (two, eight)
    assert two > 3 * eight or max(running[(V8, 4)], running[(V8, 8)]) > 2, (
        two, eight, running)
    for cell in cells.to_dicts():  # a gauge sample, when one landed in the cell, never above the variant's limit
        limit = 2 if cell["server_variant"] == V2 else 8
        assert (cell["telemetry_running_max"] or 0) <= limit
    assert not _pids_listening_on(port)  # servescope stopped what it launched
