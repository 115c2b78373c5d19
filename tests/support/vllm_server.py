"""Start and stop the real CPU vLLM (from .ci/setup_vllm.sh's cached venv) for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup() -> tuple[Path, Path]:
    """Run .ci/setup_vllm.sh (idempotent, cached) and return (venv, models dir)."""
    out = subprocess.run(["bash", str(ROOT / ".ci" / "setup_vllm.sh")], check=True, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    return Path(lines[-2]), Path(lines[-1])


@dataclass
class VLLMServer:
    proc: subprocess.Popen[bytes]
    url: str
    model: str
    log_path: Path
    venv: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def vllm_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    for d in ("cache", "config", "tmp"):
        (scratch / d).mkdir(parents=True, exist_ok=True)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        VLLM_CACHE_ROOT=str(scratch / "cache"),
        VLLM_CONFIG_ROOT=str(scratch / "config"),
        TMPDIR=str(scratch / "tmp"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


def serve_args(venv: Path, model_dir: Path, port: int, extra: list[str] | None = None) -> list[str]:
    return [str(venv / "bin" / "vllm"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            *(extra or [])]


def start(model: str = "dense", extra: list[str] | None = None, scratch: Path | None = None,
          timeout_s: float = 300, env: dict[str, str] | None = None) -> VLLMServer:
    """The real CPU vLLM serving `model` with `extra` arguments and, beside vllm_env's, the environment `env`
    (e.g. VLLM_SERVER_DEV_MODE=1 for POST /reset_prefix_cache); healthy when it returns."""
    venv, models = setup()
    model_dir = models / model
    port = free_port()
    scratch = scratch or Path(os.environ.get("SERVESCOPE_TEST_CACHE", Path.home() / ".cache" / "servescope-test")) / "scratch"
    log_path = scratch / f"vllm-{port}.log"
    scratch.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(serve_args(venv, model_dir, port, extra), stdout=log, stderr=subprocess.STDOUT,
                            env={**vllm_env(scratch), **(env or {})}, start_new_session=True)
    srv = VLLMServer(proc, f"http://127.0.0.1:{port}", str(model_dir), log_path, venv)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before it was healthy:\n{srv.log_tail()}")
        try:
            with urllib.request.urlopen(srv.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return srv
        except OSError:
            pass
        time.sleep(1)
    srv.stop()
    raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s:\n{srv.log_tail()}")


def engine_apart(cores: set[int] | None, nice: int = 15, group: int | None = None) -> None:
    """Every `VLLM::` process (the engine core and its CPU worker, all threads) at `nice` and, with `cores`, on
    those cores (start the server with VLLM_CPU_OMP_THREADS_BIND set to match, so the worker's own binding agrees);
    with `group`, only that process group's (a server started by `start` leads its own). On 2 cores at equal
    priority the engine core's polling and the worker take both cores, the API server and the client wait for a
    CPU, and tokens arrive in bursts that change from run to run."""
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and (proc / "comm").read_text().startswith("VLLM::")
                    and (group is None or os.getpgid(int(proc.name)) == group)):
                for task in (proc / "task").iterdir():
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
                    if cores:
                        os.sched_setaffinity(int(task.name), cores)
        except OSError:
            continue


if __name__ == "__main__":
    s = start(sys.argv[1] if len(sys.argv) > 1 else "dense", sys.argv[2:])
    print(s.url, s.model, flush=True)
    try:
        s.proc.wait()
    except KeyboardInterrupt:
        s.stop()
