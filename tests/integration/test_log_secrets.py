"""No secret in any file of a session (issue 32, item 1): what a launched server prints (vLLM logs its
non-default arguments, `--api-key` among them), what the real simulator prints when it refuses `--api-key`, and
what a detached runner writes to runner.log, all go through the one log filter. Each test walks every file of
the session directory (Parquet bytes, and their decoded cells, included)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from servescope.core.secrets import REDACTED
from tests.integration.helpers import servescope, wait_for
from tests.support.meta import stored

# the --fast lane leaves this module out: 1 tests, ~2 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SMALL = '[workload]\nname = "small"\ninput_tokens = 32\noutput_tokens = 8\n'
KEY = "sk-launch-Zq81xPw3"  # given to the server's --api-key
ENV_KEY = "sk-envvar-Jr52cLm7"  # VLLM_API_KEY= in the launch command
CLIENT_KEY = "sk-client-Hn64vTb9"  # the key servescope's client sends (OPENAI_API_KEY)
SECRETS = [KEY, ENV_KEY, CLIENT_KEY]

# a `vllm` that prints its arguments as vLLM does (and the other forms a server may use), each write a few bytes
# long, then becomes the real simulator
FAKE_VLLM = """#!{python}
import os, sys
args = sys.argv[1:]
opts = {{a: b for a, b in zip(args, args[1:]) if a.startswith("--")}}
key = opts["--api-key"]

def say(stream, text):
    for i in range(0, len(text), 3):
        stream.write(text[i:i + 3])
        stream.flush()

say(sys.stdout, "INFO [utils.py:233] non-default args: {{'model_tag': 'm', 'api_key': ['%s'], 'port': %s}}\\n"
    % (key, opts["--port"]))
say(sys.stderr, "args: Namespace(host='127.0.0.1', api_key='%s', model='m')\\n" % key)
say(sys.stdout, '{{"api_key": "%s"}} --api-key=%s --api-key %s\\nAuthorization: Bearer %s\\n' % (key, key, key, key))
say(sys.stderr, "env %s %s raw %s\\n" % (os.environ["VLLM_API_KEY"], os.environ["OPENAI_API_KEY"], key))
os.execv(sys.executable, [sys.executable, "-m", "servescope.sim", "--profile", "tiny", "--served-model-name", "m",
                          "--host", opts["--host"], "--port", opts["--port"]])
"""


def assert_no_secret_in(directory: Path, secrets: list[str]) -> list[Path]:
    """No secret in the bytes of any file under `directory`, nor in any string cell of its Parquet files."""
    import polars as pl

    files = [f for f in directory.rglob("*") if f.is_file()]
    assert files
    for f in files:
        blob = f.read_bytes()
        for s in secrets:
            assert s.encode() not in blob, f"{s!r} found in {f}"
        if f.suffix == ".parquet":
            df = pl.read_parquet(f)
            text = repr(df.rows()) + " ".join(df.columns)
            for s in secrets:
                assert s not in text, f"{s!r} found in a cell of {f}"
    return files


@pytest.mark.slow
def test_a_launched_servers_printed_arguments_never_reach_the_session(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(FAKE_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    (tmp_path / "w.toml").write_text(SMALL)
    session = tmp_path / "s"
    p = servescope("run", "--launch", f"VLLM_API_KEY={ENV_KEY} {script} serve m --api-key {KEY}",
                   "-w", str(tmp_path / "w.toml"), "-c", "1", "-n", "2", "--telemetry-interval", "off",
                   "--save", str(session), "--json", env={"OPENAI_API_KEY": CLIENT_KEY}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["cells"][0]["requests_ok"] == 2
    files = {f.name for f in assert_no_secret_in(session, SECRETS)}
    assert {"server-0.log", "session.toml", "events.jsonl", "cells.parquet"} <= files
    log = (session / "server-0.log").read_text()
    # every form is there, its value masked, and the rest of the log kept (servescope reads its KV budget)
    assert f"'api_key': ['{REDACTED}'], 'port':" in log and f"api_key='{REDACTED}', model='m'" in log
    assert f'{{"api_key": "{REDACTED}"}} --api-key={REDACTED} --api-key {REDACTED}' in log
    assert f"Authorization: Bearer {REDACTED}" in log and f"env {REDACTED} {REDACTED} raw {REDACTED}" in log
    assert "GPU KV cache size" in log
    for s in SECRETS:
        assert s not in p.stdout and s not in p.stderr


def test_a_server_refusing_the_clients_key_leaves_no_key_in_its_log(tmp_path: Path) -> None:
    """`servescope sim --api-key KEY` (as `vllm serve --api-key`) refuses the client's other key: the run stops
    with one line and neither key is shown; it measured nothing, so it leaves no session (issue 44, item 20), and
    nothing of it under the system's temporary directory holds a key either."""
    import shutil
    import tempfile

    session = tmp_path / "s"
    before = set(Path(tempfile.gettempdir()).glob("servescope-s-*"))
    p = servescope("run", "--launch", f"servescope sim --profile tiny --api-key {KEY}", "-c", "1", "-n", "1",
                   "--save", str(session), env={"OPENAI_API_KEY": CLIENT_KEY}, timeout=120)
    assert p.returncode != 0 and "refused the API key (HTTP 401)" in p.stderr, p.stderr
    assert KEY not in p.stderr and CLIENT_KEY not in p.stderr
    assert not session.exists()
    for kept in set(Path(tempfile.gettempdir()).glob("servescope-s-*")) - before:  # a log the error named, if any
        assert_no_secret_in(kept, SECRETS)
        shutil.rmtree(kept)


SITECUSTOMIZE = """
import atexit, os, sys

def _say():
    if not sys.argv[0].endswith(os.path.join("cli", "detach.py")):
        return  # only the detached runner
    key = os.environ["OPENAI_API_KEY"]
    for stream, text in ((sys.stdout, "runner says api_key='%s' and Bearer %s\\n" % (key, key)),
                         (sys.stderr, "raw %s --api-key %s\\n" % (key, key)),
                         (sys.stdout, "runner-output-done\\n")):
        for i in range(0, len(text), 4):
            stream.write(text[i:i + 4])
            stream.flush()

atexit.register(_say)
"""


@pytest.mark.slow
def test_a_detached_runners_output_reaches_runner_log_redacted(tmp_path: Path) -> None:
    """Whatever the runner process writes (here: the API key in three forms, at its exit) is filtered too."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "w.toml").write_text(SMALL)
    env = {"OPENAI_API_KEY": CLIENT_KEY, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    session = tmp_path / "s"
    p = servescope("run", "--url", "sim://tiny", "-w", str(tmp_path / "w.toml"), "-c", "1", "-n", "2",
                   "--telemetry-interval", "off", "--save", str(session), "--detach", env=env, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    runner_log = session / "runner.log"
    wait_for(lambda: runner_log.is_file() and "runner-output-done" in runner_log.read_text(), 180,
             "the runner to finish and its last output to reach runner.log")
    assert_no_secret_in(session, SECRETS)
    log = runner_log.read_text()
    assert f"api_key='{REDACTED}' and Bearer {REDACTED}" in log and f"raw {REDACTED} --api-key {REDACTED}" in log
    assert "cell 1/1" in log  # the runner's own output is all there


@pytest.mark.vllm
def test_the_real_vllm_logs_its_api_key_and_the_session_keeps_none(tmp_path: Path) -> None:
    """`vllm serve --api-key K` prints its non-default arguments at start-up (0.32 masks the key itself, as
    `'api_key': '***'`; earlier versions print `'api_key': ['K']`, which the fake vllm above does)."""
    import tempfile

    from tests.support import vllm_server

    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1")
    venv, models = vllm_server.setup()
    scratch = Path(tempfile.mkdtemp(prefix="ssv-"))  # vLLM's ipc socket paths must stay short
    env = vllm_server.vllm_env(scratch)
    env_words = " ".join(f"{k}={env[k]}" for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT",
                                                   "TMPDIR", "VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE"))
    (tmp_path / "w.toml").write_text(SMALL)
    session = tmp_path / "s"
    try:
        p = servescope("run", "--launch", f"{env_words} {venv}/bin/vllm serve {models}/dense --max-model-len 2048 "
                       f"--enforce-eager --api-key {KEY}", "-w", str(tmp_path / "w.toml"), "-c", "1", "-n", "2",
                       "--telemetry-interval", "off", "--save", str(session), "--json",
                       env={"OPENAI_API_KEY": KEY}, timeout=600)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["cells"][0]["requests_ok"] == 2  # the key was sent
    assert_no_secret_in(session, [KEY])
    log = (session / "server-0.log").read_text()
    assert "non-default args" in log and "'api_key': " in log and "KV cache size:" in log, log[:3000]
    from servescope.sessions.store import load_session

    assert stored(load_session(session))["kv_budget"]["kv_cache_tokens"] > 0  # read from the filtered log
