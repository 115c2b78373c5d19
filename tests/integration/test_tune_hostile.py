"""`servescope tune` against the simulator, as a hostile user or server would meet it (issue 44): a key in the launch
command never reaches any file of the tune session (item 14)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from servescope.core.secrets import REDACTED
from tests.integration.helpers import servescope
from tests.integration.test_log_secrets import assert_no_secret_in

SHORT = '[workload]\nname = "short"\ninput_tokens = 64\noutput_tokens = 8\n'


@pytest.mark.slow
@pytest.mark.parametrize("launch, secrets", [
    ("VLLM_API_KEY=sk-envword-Qa71 servescope sim --profile tiny --api-key sk-spaced-Wx93",
     ["sk-envword-Qa71", "sk-spaced-Wx93"]),
    ("HF_TOKEN=sk-hftoken-Pe40 servescope sim --profile tiny --api-key=sk-equals-Lk25",
     ["sk-hftoken-Pe40", "sk-equals-Lk25"]),
], ids=["space", "equals"])
def test_a_key_in_tunes_launch_command_reaches_no_file_of_the_session(tmp_path: Path, launch: str,
                                                                         secrets: list[str]) -> None:
    (tmp_path / "w.toml").write_text(SHORT)
    key = secrets[1]  # the simulator's --api-key: the client sends it too (from the environment, never stored)
    p = servescope("tune", "--launch", launch, "--api-key-env", "TUNE_TEST_KEY", "--search", "max-num-seqs=2|8",
                   "-w", str(tmp_path / "w.toml"), "-c", "2,4", "-n", "4", "--budget", "4",
                   "--sessions-dir", str(tmp_path / "sessions"), "--json",
                   env={"TUNE_TEST_KEY": key}, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    session = Path(json.loads(p.stdout.strip().splitlines()[-1])["session"])
    files = assert_no_secret_in(session, secrets)
    names = {f.relative_to(session).parts[0] for f in files}
    assert {"session.toml", "cells", "probes", "servers"} <= names, names  # every kind of file was looked at
    meta = tomllib.loads((session / "session.toml").read_text())
    assert REDACTED in meta["sweep"]["server"]["launch"], meta["sweep"]["server"]
    assert REDACTED in meta["tune"]["best"]["serve"]
    for s in secrets:
        assert s not in p.stdout + p.stderr


@pytest.mark.slow
def test_a_tune_sessions_report_states_the_loads_it_searched(tmp_path: Path) -> None:
    # its setup's load row said "each workload's defaults" (issue 44, item 12): a tune searches its loads
    (tmp_path / "w.toml").write_text(SHORT)
    p = servescope("tune", "--url", "sim://tiny", "-w", str(tmp_path / "w.toml"), "-c", "2,4", "-n", "4",
                   "--budget", "3", "--sessions-dir", str(tmp_path / "sessions"), "--json", timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    session = json.loads(p.stdout.strip().splitlines()[-1])["session"]
    rep = servescope("report", session)
    assert rep.returncode == 0, rep.stderr
    [row] = [line for line in rep.stdout.splitlines() if line.startswith("| load |")]
    assert row == "| load | searched: concurrency 2, 4 (the tune section's path says which cells ran) |", row
