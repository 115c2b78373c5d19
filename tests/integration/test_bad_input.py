"""Bad input end to end (issue 11): real `servescope` processes, the simulator, and a tiny hostile server
that echoes the Authorization header. Every problem is one line with exit 2 and leaves no session behind;
secrets never reach a session directory, a server log, stdout/stderr or a report."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import tomli_w

from servescope.sessions.store import load_session
from tests.integration.helpers import servescope

SMALL = '[workload]\nname = "small"\ninput_tokens = 32\noutput_tokens = 8\n'


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("servescope: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def tree_bytes(d: Path) -> list[tuple[str, bytes]]:
    return [(str(f), f.read_bytes()) for f in d.rglob("*") if f.is_file()]


def assert_nowhere(secrets: list[str], *places: str | bytes | Path) -> None:
    for place in places:
        blobs = tree_bytes(place) if isinstance(place, Path) else [("text", place.encode()
                                                                     if isinstance(place, str) else place)]
        for name, blob in blobs:
            for s in secrets:
                assert s.encode() not in blob, f"{s!r} found in {name}"


# ---- item 11: datasets and workload files are checked before anything starts ----------------------------
@pytest.mark.parametrize("dataset, needle", [
    (None, "no such file"),
    ("{oops", "not valid JSON"),
    ('{"not": "a list"}', "not ShareGPT-shaped"),
])
def test_bad_dataset_exits_2_and_leaves_no_session(tmp_path: Path, dataset: str | None, needle: str) -> None:
    if dataset is not None:
        (tmp_path / "d.json").write_text(dataset)
    wf = tmp_path / "bad-dataset.toml"
    wf.write_text('[workload]\nname = "ds"\napi = "chat"\ndataset = "d.json"\n')
    sessions = tmp_path / "sessions"
    p = servescope("run", "-w", str(wf), "--sessions-dir", str(sessions), "-c", "1", "-n", "2", timeout=120)
    assert p.returncode == 2
    line = one_error_line(p.stderr)
    assert needle in line and "d.json" in line
    assert not sessions.exists() or not any(sessions.iterdir())
    assert "started the simulator" not in p.stdout + p.stderr


def test_workload_key_typo(tmp_path: Path) -> None:
    wf = tmp_path / "typo.toml"
    wf.write_text('[workload]\nname = "t"\ninput_tokns = 100\n')
    p = servescope("run", "-w", str(wf), "--sessions-dir", str(tmp_path / "s"), timeout=120)
    assert p.returncode == 2 and "did you mean 'input_tokens'?" in one_error_line(p.stderr)
    assert not (tmp_path / "s").exists()


# ---- item 9a: a launch command's secrets, stored as ••••, and resume ----------------------------------
@pytest.mark.slow
def test_launch_secrets_never_stored_and_resume_asks_for_the_command(tmp_path: Path) -> None:
    wf = tmp_path / "small.toml"
    wf.write_text(SMALL)
    sessions = tmp_path / "sessions"
    launch = "VLLM_API_KEY=sekrit-launch HF_TOKEN=sekrit-hf servescope sim --profile tiny"
    env = {"OPENAI_API_KEY": "sekrit-key"}
    p = servescope("run", "--launch", launch, "-w", str(wf), "-c", "1,2", "-n", "3", "--sessions-dir",
                   str(sessions), "--telemetry-interval", "off", "--json", env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    session = Path(out["session"])
    assert [c["requests_ok"] for c in out["cells"]] == [3, 3]
    s = load_session(session)
    assert s.meta["server"]["launch"] == "VLLM_API_KEY=•••• HF_TOKEN=•••• servescope sim --profile tiny"
    assert list(session.glob("server-*.log"))
    report = servescope("report", str(session), env=env, timeout=120)
    assert report.returncode == 0 and "•" not in report.stderr
    secrets = ["sekrit-launch", "sekrit-hf", "sekrit-key"]
    assert_nowhere(secrets, sessions, p.stdout, p.stderr, report.stdout)

    # interrupted after its first cell: resume refuses to launch ••••, and says how
    meta = dict(s.meta, status="interrupted")
    meta["cells"] = [dict(c, status="planned") if c["index"] == 1 else c for c in meta["cells"]]
    (session / "session.toml").write_text(tomli_w.dumps(meta))
    r = servescope("resume", str(session), env=env, timeout=120)
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert f"servescope resume {session} --launch" in line and "sekrit" not in line
    r = servescope("resume", str(session), "--launch", launch, "--json", env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = load_session(session)
    assert s.status == "completed" and s.cells.height == 2
    assert_nowhere(secrets, sessions, r.stdout, r.stderr)


# ---- item 9b: a server that echoes the Authorization header ----------------------------------------------
class EchoAuth(BaseHTTPRequestHandler):
    """/v1/models answers (its owner is the Authorization header it got); every completion is a 401 whose
    body echoes the header, and the bare key."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization", "")
        if self.path.startswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "echo-model", "object": "model", "owned_by": auth,
                                                         "max_model_len": 4096}]})
        elif self.path.startswith("/health"):
            self._send(200, {})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        auth = self.headers.get("Authorization", "")
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if self.path.startswith("/v1/"):
            key = auth.removeprefix("Bearer ")
            self._send(401, {"error": {"message": f"Incorrect API key provided: {key}. You sent "
                                                  f"Authorization: {auth}", "type": "invalid_request_error",
                                       "code": 401}})
        else:
            self._send(404, {"error": "not found"})


@pytest.fixture
def echo_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), EchoAuth)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_echoed_key_never_printed_or_stored(tmp_path: Path, echo_server: str) -> None:
    wf = tmp_path / "small.toml"
    wf.write_text(SMALL)
    sessions = tmp_path / "sessions"
    key = "sk-sekrit-echo-123"
    env = {"OPENAI_API_KEY": key}
    p = servescope("run", "--url", echo_server, "-w", str(wf), "-c", "1", "-n", "3", "--sessions-dir",
                   str(sessions), "--telemetry-interval", "off", env=env, timeout=300)
    assert "Traceback" not in p.stderr
    assert "401" in p.stdout + p.stderr  # the failure is shown, without the key
    [session] = [d for d in sessions.iterdir() if (d / "session.toml").is_file()]
    s = load_session(session)
    assert s.cells.height == 1 and s.summaries()[0] is not None
    report = servescope("report", str(session), timeout=120)
    assert report.returncode == 0
    assert "401" in report.stdout
    assert_nowhere([key], sessions, p.stdout, p.stderr, report.stdout, report.stderr)


def test_json_run_of_an_echoing_server_keeps_the_key_out_of_json(tmp_path: Path, echo_server: str) -> None:
    wf = tmp_path / "small.toml"
    wf.write_text(SMALL)
    key = "sk-sekrit-json-456"
    p = servescope("run", "--url", echo_server, "-w", str(wf), "-c", "1", "-n", "2", "--sessions-dir",
                   str(tmp_path / "s"), "--telemetry-interval", "off", "--json", env={"OPENAI_API_KEY": key},
                   timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cells"] and out["cells"][0]["requests_failed"] == 2
    assert out["cells"][0]["errors"] and "401" in json.dumps(out["cells"][0]["errors"])
    assert_nowhere([key], tmp_path / "s", p.stdout, p.stderr)
