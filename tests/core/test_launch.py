"""Launching a server: command parsing, variants, and ServerProcess against the simulator (and the real CPU
vLLM's log and /metrics)."""

from __future__ import annotations

import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from servescope.core.errors import ServescopeError
from servescope.core.launch import LaunchSpec, ServerProcess, ServerStartError, parse_launch, with_variant
from servescope.core.telemetry import kv_budget_from_metrics, parse_metrics

# --------------------------------------------------------------------------------------------------------
# parse_launch / with_variant
# --------------------------------------------------------------------------------------------------------


def test_parse_vllm_serve_with_interesting_args() -> None:
    spec = parse_launch(
        "vllm serve Qwen/Qwen3.5-35B-A3B-GPTQ-Int4 --quantization gptq --gpu-memory-utilization 0.85 "
        "--kv-cache-dtype fp8 --max-model-len 32768 --max-num-seqs=64 --max-num-batched-tokens 8192 "
        "-tp 2 --no-enable-prefix-caching --enforce-eager --trust-remote-code --served-model-name 'my model'"
    )
    assert spec.kind == "vllm"
    assert spec.model == "Qwen/Qwen3.5-35B-A3B-GPTQ-Int4"
    assert spec.host == "127.0.0.1" and 0 < spec.port < 65536
    assert spec.url == f"http://127.0.0.1:{spec.port}"
    assert spec.argv[:3] == ["vllm", "serve", "Qwen/Qwen3.5-35B-A3B-GPTQ-Int4"]
    assert spec.argv[-4:] == ["--host", "127.0.0.1", "--port", str(spec.port)]
    assert spec.server_args == {
        "quantization": "gptq",
        "gpu_memory_utilization": 0.85,
        "kv_cache_dtype": "fp8",
        "max_model_len": 32768,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "tensor_parallel_size": 2,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "served_model_name": "my model",
    }
    assert spec.args["trust_remote_code"] is True
    assert "--served-model-name" in spec.argv and "my model" in spec.argv
    assert shlex.split(spec.shell_line()) == spec.argv


def test_parse_paths_host_port_env_and_api_server() -> None:
    spec = parse_launch("VLLM_CPU_KVCACHE_SPACE=2 /opt/venv/bin/vllm serve /models/dense --host 0.0.0.0 --port 8001")
    assert spec.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert spec.argv[0] == "/opt/venv/bin/vllm" and spec.model == "/models/dense"
    assert spec.port == 8001 and spec.host == "0.0.0.0" and spec.url == "http://127.0.0.1:8001"
    assert spec.argv.count("--port") == 1 and spec.argv.count("--host") == 1
    assert spec.shell_line().startswith("VLLM_CPU_KVCACHE_SPACE=2 /opt/venv/bin/vllm serve")

    api = parse_launch("python3 -m vllm.entrypoints.openai.api_server --model facebook/opt-125m --port=9000")
    assert api.kind == "vllm" and api.model == "facebook/opt-125m" and api.port == 9000
    assert api.argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--port=9000" not in api.argv and api.argv[api.argv.index("--port") + 1] == "9000"

    model_flag = parse_launch("vllm serve --model m1 --max-num-seqs 4")
    assert model_flag.model == "m1" and model_flag.server_args["max_num_seqs"] == 4


def test_parse_simulator_forms() -> None:
    spec = parse_launch("servescope sim --profile tiny --kv-cache-tokens 4096")
    assert spec.kind == "sim" and spec.model == "tiny"
    assert spec.argv[:3] == [sys.executable, "-m", "servescope.sim"]
    assert spec.server_args == {"kv_cache_tokens": 4096}
    zero = parse_launch(f"{sys.executable} -m servescope.sim --profile tiny --port 0")
    assert zero.port != 0 and zero.argv[zero.argv.index("--port") + 1] == str(zero.port)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("sglang serve m", "must start with `vllm serve MODEL`"),
        ("vllm bench serve", "serve MODEL"),
        ("vllm serve", "names no model"),
        ("vllm serve --port 8000", "names no model"),
        ("vllm serve 'unclosed", "cannot read"),
        ("vllm serve m --max-num-seqs 4 stray", "unexpected word"),
        ("vllm serve m --port abc", "not a number"),
        ("python -m http.server", "cannot launch `python -m http.server`"),
        ("A=1", "empty"),
    ],
)
def test_parse_errors_are_one_line(command: str, words: str) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_launch(command)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_with_variant_overrides_and_adds() -> None:
    base = parse_launch("vllm serve m --gpu-memory-utilization 0.85 --enable-prefix-caching --port 8000")
    v = with_variant(base, "--gpu-memory-utilization 0.70 --max-num-seqs 4 --no-enable-prefix-caching")
    assert v.server_args["gpu_memory_utilization"] == 0.70
    assert v.server_args["max_num_seqs"] == 4
    assert v.server_args["enable_prefix_caching"] is False
    assert v.argv.count("--gpu-memory-utilization") == 1
    assert "--enable-prefix-caching" not in v.argv and "--no-enable-prefix-caching" in v.argv
    assert v.port == 8000 and v.model == "m"
    # the original is unchanged (frozen)
    assert base.server_args == {"gpu_memory_utilization": 0.85, "enable_prefix_caching": True}
    assert with_variant(base, "--port 8123").url == "http://127.0.0.1:8123"
    assert with_variant(base, "").argv == base.argv
    with pytest.raises(ServescopeError):
        with_variant(base, "oops")
    sim = with_variant(parse_launch("servescope sim --profile tiny"), "--max-num-seqs 2")
    assert sim.kind == "sim" and sim.server_args == {"max_num_seqs": 2}


# --------------------------------------------------------------------------------------------------------
# ServerProcess against the simulator
# --------------------------------------------------------------------------------------------------------


def _sim_spec(extra: str = "") -> LaunchSpec:
    return parse_launch(f"{shlex.quote(sys.executable)} -m servescope.sim --profile tiny {extra}")


def _gone(pid: int) -> bool:
    """No live process with this pid or in this process group (zombies awaiting the container's init
    do not count)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if (d.name == str(pid) or fields[2] == str(pid)) and fields[0] not in ("Z", "X"):
            return False
    return True


def test_server_process_sim_lifecycle(tmp_path: Path) -> None:
    spec = _sim_spec()
    log = tmp_path / "server.log"
    srv = ServerProcess.start(spec, log, health_timeout_s=60)
    try:
        assert srv.alive() and srv.healthy() and srv.url == spec.url and srv.pid
        assert srv.healthy_after_s is not None and srv.healthy_after_s < 60
        r = httpx.get(srv.url + "/v1/models", timeout=5)
        assert r.status_code == 200
        deadline = time.monotonic() + 60  # a generous limit: the wait ends when the budget is read
        while srv.kv_budget is None and time.monotonic() < deadline:
            time.sleep(0.05)
        budget = srv.kv_budget
        metrics = parse_metrics(httpx.get(srv.url + "/metrics", timeout=5).text)
        from_metrics = kv_budget_from_metrics(metrics, max_model_len=r.json()["data"][0]["max_model_len"])
        assert budget is not None and from_metrics is not None
        assert budget.tokens == from_metrics.tokens and budget.same_budget(from_metrics)
        assert "GPU KV cache size" in srv.log_tail(50)
        first_pid = srv.pid
        srv.restart(health_timeout_s=60)  # same spec, same port
        assert srv.pid != first_pid and _gone(first_pid)
        assert srv.healthy() and srv.url == spec.url and srv.starts == 2
        assert srv.kv_budget is not None or "restart" in log.read_text()
    finally:
        pid = srv.pid
        rc = srv.stop(grace_s=5)
    assert pid is not None and _gone(pid)
    assert not srv.alive() and rc is not None
    assert srv.stop() == rc  # stopping twice is harmless


def test_server_death_before_health_is_one_line_with_tail(tmp_path: Path) -> None:
    spec = parse_launch(f"{shlex.quote(sys.executable)} -m servescope.sim --profile no-such-profile")
    t = time.monotonic()
    with pytest.raises(ServerStartError) as e:
        ServerProcess.start(spec, tmp_path / "dead.log", health_timeout_s=60)
    assert time.monotonic() - t < 50  # the death was seen, not the health timeout (60 s) waited out
    err = e.value
    assert isinstance(err, ServescopeError)
    msg = str(err)
    assert "\n" not in msg and "exited with code 2" in msg and "no-such-profile" in msg
    assert "no-such-profile" in err.log_tail and err.returncode == 2
    assert err.log_path == tmp_path / "dead.log"


def test_control_sequences_in_the_log_are_cleaned(tmp_path: Path) -> None:
    script = tmp_path / "vllm"  # a "vllm" that prints colours and dies
    script.write_text("#!/bin/sh\nprintf '\\033[31mboom\\033[0m \\033]0;title\\007bad model\\n' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(ServerStartError) as e:
        ServerProcess.start(parse_launch(f"{script} serve m"), tmp_path / "x.log", health_timeout_s=30)
    assert "\x1b" not in str(e.value) and "\x1b" not in e.value.log_tail and "\x07" not in e.value.log_tail
    assert "boom" in str(e.value) and "exited with code 3" in str(e.value)


def test_missing_executable_and_busy_port(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="cannot start"):
        ServerProcess.start(parse_launch("/nonexistent/bin/vllm serve m"), tmp_path / "a.log")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerStartError, match="already in use"):
            ServerProcess.start(_sim_spec(f"--port {port}"), tmp_path / "b.log")


def test_health_timeout_stops_the_server(tmp_path: Path) -> None:
    script = tmp_path / "vllm"  # a server that never answers /health
    script.write_text("#!/bin/sh\necho starting\nsleep 60 &\nwait\n")
    script.chmod(0o755)
    t = time.monotonic()
    with pytest.raises(ServerStartError) as e:
        ServerProcess.start(parse_launch(f"{script} serve m"), tmp_path / "slow.log", health_timeout_s=1.0)
    assert time.monotonic() - t < 45  # its child sleeps 60 s: a stop that waited for it would take that long
    assert "did not answer /health within 1 s" in str(e.value) and "starting" in str(e.value)
    assert e.value.returncode is None


def test_a_stop_ends_the_wait_for_health(tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM while a model loads (`stopping()` true) ends the wait at once, not after the launch
    timeout: the server is stopped and the error says so."""
    script = tmp_path / "vllm"  # a server that never answers /health
    script.write_text("#!/bin/sh\necho loading\nsleep 60 &\nwait\n")
    script.chmod(0o755)
    asked = threading.Event()
    threading.Timer(0.5, asked.set).start()
    with pytest.raises(ServerStartError) as e:
        ServerProcess.start(parse_launch(f"{script} serve m"), tmp_path / "s.log", health_timeout_s=600,
                            stopping=asked.is_set)
    assert "stopped while the server was starting" in str(e.value) and e.value.returncode is None


def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    # a parent that serves /health and a child that ignores SIGTERM: stop() must leave nothing behind
    port_spec = parse_launch(f"{tmp_path / 'vllm'} serve m")
    server = (
        "import http.server, os, signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        "print('child', child.pid, flush=True)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port_spec.port}), H).serve_forever()\n"
    )
    (tmp_path / "server.py").write_text(server)
    script = tmp_path / "vllm"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {tmp_path / 'server.py'}\n")
    script.chmod(0o755)
    srv = ServerProcess.start(port_spec, tmp_path / "g.log", health_timeout_s=120)
    deadline = time.monotonic() + 60  # a generous limit: the wait ends when the child's line is in the log
    while "child" not in srv.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(srv.log_tail().split("child ")[1].split()[0])
    pid = srv.pid
    assert pid is not None
    t = time.monotonic()
    srv.stop(grace_s=1)
    assert time.monotonic() - t < 60  # the child ignores SIGTERM and sleeps 120 s: it was killed, not waited for
    assert _gone(pid) and _gone(child)


# --------------------------------------------------------------------------------------------------------
# The real CPU vLLM's start-up log and /metrics (the session's shared server: servescope launching one is
# tests/integration/test_vllm_launch.py, which also checks the budget it saves)
# --------------------------------------------------------------------------------------------------------


def test_real_vllm_kv_budget_from_its_log_equals_its_metrics(vllm_server_perturbed: object) -> None:
    from servescope.core.kvbudget import kv_budget_from_log

    srv: Any = vllm_server_perturbed
    from_log = kv_budget_from_log(srv.log_path.read_text(errors="replace"))  # what ServerProcess.kv_budget reads
    metrics = parse_metrics(httpx.get(srv.url + "/metrics", timeout=10).text)
    mml = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    from_metrics = kv_budget_from_metrics(metrics, max_model_len=mml)
    assert from_log is not None, srv.log_tail(20)
    assert from_metrics is not None
    assert from_log.tokens == from_metrics.tokens > 0
    assert from_log.concurrency_at is not None and from_log.concurrency_at[0] == mml == 8192
    assert from_log.same_budget(from_metrics)
    assert from_metrics.num_gpu_blocks and from_metrics.block_size
    assert from_metrics.num_gpu_blocks * from_metrics.block_size == from_metrics.tokens


def test_a_launched_servers_log_keeps_no_secret_of_its_command(tmp_path: Path) -> None:
    from servescope.core.launch import ServerProcess, parse_launch

    spec = parse_launch("VLLM_API_KEY=sk-env-456 vllm serve m --api-key sk-secret-123")
    log = tmp_path / "server-0.log"
    log.write_text("INFO non-default args: {'api_key': ['sk-secret-123'], 'model': 'm'}\nenv sk-env-456\n")
    sp = ServerProcess(spec, log)
    assert "sk-secret-123" not in sp.log_text() and "sk-env-456" not in sp.log_text()
    sp._scrub_log()  # what stop() does once the server is down
    text = log.read_text()
    assert "sk-secret-123" not in text and "sk-env-456" not in text and "'model': 'm'" in text
