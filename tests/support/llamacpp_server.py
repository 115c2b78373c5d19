"""Start and stop a real llama.cpp `llama-server` (CPU, built by .ci/setup_llamacpp.sh) for tests and benchmarks.

    binary, models = setup()                       # runs the script once per process (cached outside the clone)
    with running(models / "tiny-f16.gguf") as srv:  # or srv = start(...); ...; srv.stop()
        urllib.request.urlopen(srv.url + "/health")
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "setup_llamacpp.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.lru_cache(maxsize=1)
def setup() -> tuple[Path, Path]:
    """Run .ci/setup_llamacpp.sh (idempotent, cached) once per process; return (llama-server, GGUF models dir).

    A cold run builds llama.cpp (about 8 minutes on 2 cores); a cached one takes about a second.
    """
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-40:])
        raise RuntimeError(f"{SCRIPT} failed with exit status {out.returncode}:\n{tail}")
    lines = out.stdout.strip().splitlines()
    if len(lines) < 2:
        raise RuntimeError(f"{SCRIPT} printed {out.stdout!r}: expected the server path and the model folder")
    return Path(lines[-2]), Path(lines[-1])


@dataclass
class LlamaCppServer:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    model: Path
    log_path: Path
    argv: list[str]

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM the server's process group, SIGKILL it if it has not exited after `timeout_s`."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> LlamaCppServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_args(binary: Path, model: Path, port: int, *, ctx: int = 4096, parallel: int = 4,
               extra: Sequence[str] = ()) -> list[str]:
    """The llama-server command line: `-c` is the context shared by the `--parallel` slots (ctx/parallel each)."""
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(ctx), "--parallel", str(parallel), "--metrics", *extra]


def start(model: Path | str = "tiny-f16.gguf", *, ctx: int = 4096, parallel: int = 4, extra: Sequence[str] = (),
          timeout_s: float = 120, binary: Path | None = None) -> LlamaCppServer:
    """Start llama-server on a free port and wait until /health answers 200 (it answers 503 while loading).

    `model` is a GGUF path, or a file name in setup()'s model folder ("tiny-f16.gguf", "tiny-q4_k_m.gguf").
    The server runs in its own process group, logging to a temporary file (`log_path`).
    """
    model = Path(model)
    if binary is None or not model.is_absolute():
        server_bin, models = setup()
        binary = binary or server_bin
        if not model.is_absolute() and not model.exists():
            model = models / model
    port = free_port()
    fd, log_name = tempfile.mkstemp(prefix=f"llama-server-{port}-", suffix=".log")
    log_path = Path(log_name)
    argv = serve_args(binary, model, port, ctx=ctx, parallel=parallel, extra=extra)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    srv = LlamaCppServer(proc, f"http://127.0.0.1:{port}", port, model, log_path, argv)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} before it was healthy:\n{srv.log_tail()}")
        try:
            with urllib.request.urlopen(srv.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return srv
        except urllib.error.HTTPError as e:  # 503 {"error": {"message": "Loading model", ...}} while loading
            e.close()
        except OSError:
            pass
        time.sleep(0.2)
    srv.stop()
    raise RuntimeError(f"llama-server not healthy after {timeout_s:.0f} s:\n{srv.log_tail()}")


@contextlib.contextmanager
def running(model: Path | str = "tiny-f16.gguf", **kwargs: object) -> Iterator[LlamaCppServer]:
    """`with running(models / "tiny-q4_k_m.gguf", parallel=2) as srv:` start, yield, always stop.

    The server's log is removed after a clean exit and kept (its path is `srv.log_path`) when the body raised.
    """
    srv = start(model, **kwargs)  # type: ignore[arg-type]
    try:
        yield srv
    except BaseException:
        srv.stop()
        raise
    srv.stop()
    with contextlib.suppress(OSError):
        srv.log_path.unlink()


if __name__ == "__main__":
    s = start(sys.argv[1] if len(sys.argv) > 1 else "tiny-f16.gguf", extra=sys.argv[2:])
    print(s.url, s.model, s.log_path, flush=True)
    try:
        s.proc.wait()
    except KeyboardInterrupt:
        s.stop()
