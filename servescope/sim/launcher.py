"""Start and stop a simulator in a subprocess (tests, `sim://NAME` targets, `servescope demo`)."""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from servescope.sim.profile import DEFAULT_PROFILE, ProfileError, load_profile
from servescope.sim.profile import list_profiles as _list_profiles

LISTENING = "servescope-sim listening on "

__all__ = ["SimHandle", "SimStartError", "list_profiles", "start_sim"]


class SimStartError(Exception):
    """The simulator did not come up; the message is one line a user can act on."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def list_profiles() -> list[str]:
    return _list_profiles()


class SimHandle:
    """A running simulator: `.url`, `.proc`, `.stop()`; a context manager that stops it on exit."""

    def __init__(self, proc: subprocess.Popen[str], url: str, stderr_path: Path, reader: threading.Thread) -> None:
        self.proc = proc
        self.url = url
        self.stderr_path = stderr_path
        self._reader = reader

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    def stop(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self._reader.join(1.0)
        try:
            self.stderr_path.unlink()
        except OSError:
            pass

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _child_env() -> dict[str, str]:
    """The child must import this very servescope, installed or not, whatever the working directory."""
    import os

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# what a `sim://PROFILE?KEY=VALUE&...` URL may set: the simulator's hosted-mode flags (switches take 1/true/yes)
URL_SWITCHES = {"hosted": "--hosted", "reject_vllm_fields": "--reject-vllm-fields"}
URL_VALUES = {"tpm": "--tpm", "net_latency_ms": "--net-latency-ms", "net_jitter_ms": "--net-jitter-ms"}


def url_args(profile: str) -> tuple[str, list[str]]:
    """A profile as a sim:// URL gives it (`tiny?hosted=1&tpm=20000`) -> the profile and the simulator flags its
    query asks for; an unknown key or a bad switch raises SimStartError naming the keys there are."""
    from urllib.parse import parse_qsl

    name, sep, query = profile.partition("?")
    if not sep:
        return profile, []
    known = ", ".join([*URL_SWITCHES, *URL_VALUES])
    args: list[str] = []
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise SimStartError(f"sim://{profile}: the part after ? is KEY=VALUE&...; keys: {known}") from None
    for key, value in pairs:
        if key in URL_SWITCHES:
            if value.lower() not in ("", "1", "true", "yes", "0", "false", "no"):
                raise SimStartError(f"sim://{profile}: {key}={value}: give {key}=1 (or leave it out)")
            if value.lower() in ("", "1", "true", "yes"):
                args.append(URL_SWITCHES[key])
        elif key in URL_VALUES:
            args += [URL_VALUES[key], value]
        else:
            raise SimStartError(f"sim://{profile}: unknown setting {key!r}; the simulator's URL takes {known}")
    return name or str(DEFAULT_PROFILE), args


def start_sim(
    profile: str = "tiny",
    extra_args: list[str] | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 30,
) -> SimHandle:
    """Start `python -m servescope.sim` on a free port and wait until it listens. The simulator exits by itself
    when this process is gone (even after kill -9: it watches its parent pid). An unknown profile is one line
    listing the profiles, before anything starts. `profile` may carry a sim:// URL's query (`tiny?hosted=1`:
    `url_args`), whose flags go before `extra_args`."""
    import os

    profile, query_args = url_args(profile)
    extra_args = [*query_args, *(extra_args or [])]
    try:
        load_profile(profile)
    except ProfileError as e:
        raise SimStartError(f"sim://{profile}: {e} (or give a path to a profile .toml)") from None
    cmd = [sys.executable, "-m", "servescope.sim", "--profile", profile, "--host", host, "--port", "0",
           "--exit-with-parent", str(os.getpid()), *extra_args]
    err = tempfile.NamedTemporaryFile(prefix="servescope-sim-", suffix=".log", delete=False)  # noqa: SIM115
    stderr_path = Path(err.name)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1, env=_child_env())
    except OSError as e:
        err.close()
        raise SimStartError(f"cannot start the simulator ({' '.join(cmd[:3])}): {e}") from None
    err.close()
    found = threading.Event()
    url_box: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=20)

    def read_stdout() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:  # keeps draining after the listening line so the pipe never fills
                line = line.rstrip("\n")
                if not found.is_set() and line.startswith(LISTENING):
                    url_box.append(line[len(LISTENING):].strip())
                    found.set()
                else:
                    tail.append(line)
        except (ValueError, OSError):
            pass
        found.set()  # EOF: the process is gone (or stdout closed)

    reader = threading.Thread(target=read_stdout, name="servescope-sim-stdout", daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while not found.wait(0.05):
        if proc.poll() is not None or time.monotonic() > deadline:
            break
    handle = SimHandle(proc, url_box[0] if url_box else "", stderr_path, reader)
    if url_box:
        return handle
    try:  # stdout closed: the process is exiting; its code says more than "did not listen"
        proc.wait(2.0)
    except subprocess.TimeoutExpired:
        pass
    died = proc.poll() is not None
    lines = [*tail, *_read_tail(stderr_path)]
    handle.stop()
    what = f"exited with code {proc.returncode}" if died else f"did not listen within {timeout_s:g} s"
    last = " | ".join(x.strip() for x in lines[-5:] if x.strip()) or "no output"
    raise SimStartError(f"servescope sim --profile {profile} {what}; last output: {last}")


def _read_tail(path: Path, lines: int = 10) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []
