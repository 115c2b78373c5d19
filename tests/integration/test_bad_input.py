"""Bad input end to end (issue 11): real `servescope` processes, the simulator, and a tiny hostile server
that echoes the Authorization header. Every problem is one line with exit 2 and leaves no session behind;
secrets never reach a session directory, a server log, stdout/stderr or a report."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import tomli_w

from servescope.sessions.store import load_session
from tests.integration.helpers import servescope
from tests.support.meta import stored

# the --fast lane leaves this module out: 46 tests, ~49 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SMALL = '[workload]\nname = "small"\ninput_tokens = 32\noutput_tokens = 8\n'


def one_error_line(stderr: str) -> str:
    """The one line of stderr, "servescope COMMAND: error: ..." (the command named: `servescope run`, ...)."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and re.match(r"servescope( [a-z]+)+: error: ", lines[0]), stderr
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
    assert stored(s)["server"]["launch"] == "VLLM_API_KEY=•••• HF_TOKEN=•••• servescope sim --profile tiny"
    assert list(session.glob("server-*.log"))
    report = servescope("report", str(session), env=env, timeout=120)
    assert report.returncode == 0 and "•" not in report.stderr
    secrets = ["sekrit-launch", "sekrit-hf", "sekrit-key"]
    assert_nowhere(secrets, sessions, p.stdout, p.stderr, report.stdout)

    # interrupted after its first cell: resume refuses to launch ••••, and says how
    meta = dict(stored(s), status="interrupted")
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


# ---- issue 32: values accepted silently, or refused with argparse's words or a traceback -------------------
@pytest.fixture(scope="module")
def small_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished session of the tiny simulator, without a twin (a what-if that fits would write twin/)."""
    d = tmp_path_factory.mktemp("bad-input")
    (d / "small.toml").write_text(SMALL)
    p = servescope("run", "--url", "sim://tiny", "-w", str(d / "small.toml"), "-c", "1", "-n", "2",
                   "--telemetry-interval", "off", "--save", str(d / "s"), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return d / "s"


RUN_CASES = [  # run's flags, and what the one line says: the value, then what to give
    (["-c", "1,,4"], ["--concurrency: '1,,4' has an empty item", "give positive integers"]),
    (["-c", "1,4,"], ["--concurrency: '1,4,' has an empty item", "give positive integers"]),
    (["--rate", "2,,5"], ["--rate: '2,,5' has an empty item", "give request rates"]),
    (["-w", ""], ["--workload: empty", "give a value"]),
    (["--launch", ""], ["--launch: empty", "give a value"]),
    (["--launch", "servescope sim --profile tiny", "--server-variant", ""],
     ["--server-variant: variant 1 is empty", "give the server's extra arguments"]),
    (["--api-key", ""], ["--api-key: empty", "give a value"]),
    (["--model", ""], ["--model: empty", "give a value"]),
    (["--ray-nodes", "10.0.0.2"], ["ray nodes place Ray workers", "--ray auto"]),
    (["--ray", "auto", "--ray-nodes", ""], ["--ray-nodes: empty", "give a value"]),
    (["--rate", "2", "--ramp", "-5s"], ["--ramp: the duration must be above 0, not -5s", "e.g. 10s"]),
    (["--duration", "-1s"], ["--duration: the duration must be above 0, not -1s", "e.g. 10s"]),
    (["--telemetry-interval", "-1s"], ["--telemetry-interval: the duration must be above 0, not -1s"]),
    (["--timeout", "-.5"], ["--timeout: the duration must be above 0, not -.5"]),
    (["--duration", "1e308s"], ["--duration: 1e308s is too long", "give at most 2592000s (30 days)"]),
    (["--rate", "2", "--ramp", "1e308s"], ["--ramp: 1e308s is too long", "give at most 2592000s (30 days)"]),
    (["--url", "http://[::1"], ["--url: 'http://[::1' is not a URL", "give e.g. http://127.0.0.1:8000"]),
    (["--url", "http://127.0.0.1:99999"], ["--url: 'http://127.0.0.1:99999' is not a URL",
                                           "give e.g. http://127.0.0.1:8000"]),
]


@pytest.mark.parametrize("argv, says", RUN_CASES, ids=[" ".join(a) or "empty" for a, _ in RUN_CASES])
def test_run_refuses_a_bad_value_in_one_line(tmp_path: Path, argv: list[str], says: list[str]) -> None:
    wf = tmp_path / "small.toml"
    wf.write_text(SMALL)
    base = ["run", "-n", "2", "--sessions-dir", str(tmp_path / "s"), "--telemetry-interval", "off"]
    if "-w" not in argv:
        base += ["-w", str(wf)]
    if not {"-c", "--rate"} & set(argv):
        base += ["-c", "1"]
    p = servescope(*base, *argv, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    line = one_error_line(p.stderr)
    assert all(s in line for s in says), line
    assert not (tmp_path / "s").exists()
    assert "started the simulator" not in p.stdout + p.stderr


def test_a_minus_value_reaches_its_flags_check() -> None:
    """argparse took `--ramp -5s` for a flag without its value; `--ramp=-5s` and `--ramp -5s` read alike."""
    for argv in (["--ramp", "-5s"], ["--ramp=-5s"]):
        p = servescope("run", "--rate", "2", *argv, timeout=60)
        assert p.returncode == 2 and "expected one argument" not in p.stderr
        assert "--ramp: the duration must be above 0, not -5s" in one_error_line(p.stderr)


BAD_SLOS = ["ttft_ms=nan", "ttft_ms=-5", "tpot_ms=0", "", ",", "ttft_ms=3000,,tpot_ms=50", "e2e_ms=inf"]


@pytest.mark.parametrize("slo", BAD_SLOS)
def test_every_command_reads_slos_alike(small_session: Path, slo: str) -> None:
    """One SLO parser for run, report, compare, gate and whatif: each refuses what run refuses, with the same
    line (report, compare, gate and whatif took ttft_ms=nan, -5 and tpot_ms=0, and report took "")."""
    s = str(small_session)
    commands = {
        "run": ["run", "--url", "sim://tiny", "-c", "1", "-n", "1", "--sessions-dir", str(small_session.parent / "x")],
        "report": ["report", s],
        "compare": ["compare", s, s],
        "gate": ["gate", s, s, "--fail-on", "output_tok_s:-5%"],
        "whatif": ["whatif", s, "--capacity"],
    }
    lines = {}
    for name, argv in commands.items():
        p = servescope(*argv, "--slo", slo, timeout=120)
        assert p.returncode == 2, (name, p.stderr[-2000:])
        lines[name] = one_error_line(p.stderr).removeprefix(f"servescope {name}: error: ")
    assert len(set(lines.values())) == 1, lines
    line = lines["run"]
    assert line.startswith("--slo: ")
    assert (repr(slo) if "," in slo else slo.partition("=")[2] or "empty") in line, line
    assert "e.g." in line or "give a value" in line, line
    assert not (small_session / "twin").exists()


WHATIF_CASES = [
    (["--gpu-memory-utilization", "2"], ["--gpu-memory-utilization 2: must be above 0 and at most 1"]),
    (["--gpu-memory-utilization", "-0.5"], ["--gpu-memory-utilization -0.5: must be above 0"]),
    (["--model-config", "/nonexistent/config.json"], ["--model-config /nonexistent/config.json: no such file",
                                                      "give the model's Hugging Face config.json"]),
    (["--server-max-num-batched-tokens", "0"], ["--server-max-num-batched-tokens 0: must be 1 or more"]),
    (["--server-max-num-seqs", "-3"], ["--server-max-num-seqs -3: must be 1 or more"]),
    (["--max-num-seqs", "0"], ["--max-num-seqs 0: must be 1 or more"]),
    (["--kv-cache-dtype", "fp3"], ["--kv-cache-dtype 'fp3': unknown", "use one of"]),
    (["-c", "1,,4"], ["--concurrency: '1,,4' has an empty item"]),
    (["-w", ""], ["--workload: empty", "give a value"]),
    (["--api-key", ""], ["--api-key: empty", "give a value"]),
]


@pytest.mark.parametrize("argv, says", WHATIF_CASES, ids=[" ".join(a) for a, _ in WHATIF_CASES])
def test_whatif_checks_its_flags_before_fitting(small_session: Path, argv: list[str], says: list[str]) -> None:
    """Checked before anything is read or fitted: --model-config and --server-max-num-batched-tokens were read
    only by a fit, --gpu-memory-utilization only after a fit that wrote SESSION/twin/."""
    p = servescope("whatif", str(small_session), *argv, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    line = one_error_line(p.stderr)
    assert all(s in line for s in says), line
    assert "fitting" not in p.stderr and not (small_session / "twin").exists()


def test_quality_refuses_a_bad_url_and_an_empty_key_in_one_line(tmp_path: Path) -> None:
    for argv, says in ((["--url", "http://[::1"], "--url: 'http://[::1' is not a URL"),
                       (["--api-key", ""], "--api-key: empty")):
        p = servescope("quality", *argv, "--sessions-dir", str(tmp_path / "s"), timeout=120)
        assert p.returncode == 2 and says in one_error_line(p.stderr)
        assert not (tmp_path / "s").exists()


def test_import_refuses_an_empty_workload_name(tmp_path: Path) -> None:
    data = Path(__file__).resolve().parents[1] / "sessions" / "data" / "vllm-bench-c1-detailed.json"
    p = servescope("import", str(data), "--workload", "", "--sessions-dir", str(tmp_path / "s"), timeout=120)
    assert p.returncode == 2
    line = one_error_line(p.stderr)
    assert "--workload: empty" in line and "give a workload name" in line
    assert not (tmp_path / "s").exists()


SIM_CASES = [
    (["--port", "99999"], "--port 99999: a port is 0 to 65535 (0 picks a free port)"),
    (["--port", "-1"], "--port -1: a port is 0 to 65535"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0: must be 1 or more"),
    (["--kv-cache-tokens", "-5"], "--kv-cache-tokens -5: must be 1 or more"),
    (["--max-model-len", "0"], "--max-model-len 0: must be 1 or more"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens 0: must be 1 or more"),
    (["--exit-at", "-1"], "--exit-at -1: must be 0 (never) or a number of seconds above 0"),
    (["--exit-after-requests", "-2"], "--exit-after-requests -2: must be 0 (never) or more"),
    (["--served-model-name", " "], "--served-model-name: empty"),
]


@pytest.mark.parametrize("argv, says", SIM_CASES, ids=[" ".join(a) for a, _ in SIM_CASES])
def test_the_simulator_refuses_a_bad_flag_in_one_line(argv: list[str], says: str) -> None:
    """Exit 2 and one line, before it listens (--port 99999 listened on 34463; --max-num-seqs 0 took requests
    that waited until --timeout; --port -1 exited 1)."""
    p = servescope("sim", "--profile", "tiny", "--port", "0", *argv, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines == [f"servescope sim: error: {says}"] or (len(lines) == 1 and lines[0].startswith(
        f"servescope sim: error: {says}")), p.stderr
    assert "listening" not in p.stdout


def test_the_simulator_refuses_a_binary_profile_in_one_line(tmp_path: Path) -> None:
    prof = tmp_path / "weights.toml"
    prof.write_bytes(bytes(range(256)) * 4)
    p = servescope("sim", "--profile", str(prof), "--port", "0", timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and str(prof) in lines[0] and "not UTF-8 text" in lines[0], p.stderr
    assert "servescope sim --list" in lines[0]
