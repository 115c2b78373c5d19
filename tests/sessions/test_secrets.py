"""Secrets (issue 11, item 9a): launch-command secrets are replaced by •••• before anything is stored or
reported; a redacted command is never launched, and resume asks for it in full."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from servescope.__main__ import main
from servescope.core.errors import ServescopeError
from servescope.core.launchspec import parse_launch, with_variant
from servescope.core.secrets import REDACTED, command_secrets, redact_command, redact_text
from servescope.engine.spec import SweepSpec
from servescope.reports.report import render_report
from servescope.sessions.store import load_session, toml_clean
from tests.engine.test_runner_fakes import FakeServer, FakeTarget, _ctx, _run, _spec


@pytest.mark.parametrize("command, expected", [
    ("VLLM_API_KEY=abc123 servescope sim --profile tiny", "VLLM_API_KEY=•••• servescope sim --profile tiny"),
    ("vllm serve M --api-key K9 --max-num-batched-tokens 8192", "vllm serve M --api-key •••• --max-num-batched-tokens 8192"),
    ("vllm serve M --api_key=K9 --tokenizer-mode auto", "vllm serve M --api_key=•••• --tokenizer-mode auto"),
    ("HF_TOKEN='a b' vllm serve M --hf-token hf_x --ssl-keyfile /k.pem", "HF_TOKEN='••••' vllm serve M --hf-token •••• --ssl-keyfile /k.pem"),
    ("MY_SECRET=s3cr TOKENIZERS_PARALLELISM=false vllm serve M", "MY_SECRET=•••• TOKENIZERS_PARALLELISM=false vllm serve M"),
    ("A_PASSWORD=pw99 vllm serve M --enforce-eager --api-key --port 8000", "A_PASSWORD=•••• vllm serve M --enforce-eager --api-key --port 8000"),
    ("vllm serve Qwen/Qwen3-8B --max-num-seqs 16", "vllm serve Qwen/Qwen3-8B --max-num-seqs 16"),
])
def test_redact_command(command: str, expected: str) -> None:
    assert redact_command(command) == expected
    assert redact_command(expected) == expected  # idempotent
    for s in command_secrets(command):
        assert s not in redact_command(command)


def test_redact_text_masks_secrets_and_bearer_tokens() -> None:
    body = '{"error": "bad Authorization: Bearer sk-live-1 (key sk-live-1)", "x": "Bearer other-token"}'
    out = redact_text(body, ["sk-live-1", None, ""])
    assert "sk-live-1" not in out and "other-token" not in out and out.count(REDACTED) == 3


def test_a_redacted_command_is_never_launched() -> None:
    with pytest.raises(ServescopeError, match="holds •••• where a secret was"):
        parse_launch("vllm serve M --api-key ••••")
    spec = parse_launch("vllm serve M --port 8000")
    with pytest.raises(ServescopeError, match="holds ••••"):
        with_variant(spec, "--api-key ••••")
    assert "K9" not in parse_launch("vllm serve M --api-key K9 --port 1").shell_line()


SECRETS = ("sekrit-env", "sekrit-flag", "sekrit-var", "sekrit-hf")


async def test_stored_session_and_report_hold_no_launch_secret(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeServer(url="")
    launch = "VLLM_API_KEY=sekrit-env vllm serve M --api-key sekrit-flag --hf-token=sekrit-hf --max-num-seqs 2"
    spec = _spec(url="sim://", launch=launch, variants=("--max-num-seqs 1 --api-key sekrit-var", "--max-num-seqs 4"))
    await _run(spec, _ctx(tmp_path / "s", url=""), server, FakeTarget(server))
    s = load_session(tmp_path / "s")
    table = s.info.to_table()
    assert table["server"]["launch"] == ("VLLM_API_KEY=•••• vllm serve M --api-key •••• --hf-token=•••• "
                                         "--max-num-seqs 2")
    assert table["sweep"]["server"]["launch"] == table["server"]["launch"]
    assert table["sweep"]["server"]["variants"][0]["args"] == "--max-num-seqs 1 --api-key ••••"
    texts = [f.read_bytes() for f in (tmp_path / "s").rglob("*") if f.is_file()]
    texts += [render_report(s, fmt=fmt).encode() for fmt in ("md", "csv", "json")]
    for t in texts:
        for secret in SECRETS:
            assert secret.encode() not in t

    # resume of that session: refused with how to do it; with --launch in full it passes the check
    meta = dict(table, status="interrupted")
    meta["cells"] = [dict(c, status="planned") if c["index"] == 3 else c for c in meta["cells"]]
    (s.path / "session.toml").write_text(tomli_w.dumps(toml_clean(meta)))
    assert main(["resume", str(s.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stored with its secrets replaced by ••••" in err
    assert f"servescope resume {s.path} --launch" in err and "sekrit" not in err
    # a sweep file made from the session reads as it is, but running it asks for the command too
    assert SweepSpec.from_toml(s.path / "session.toml").launch == table["server"]["launch"]
    assert main(["run", "--sweep", str(s.path / "session.toml"), "--sessions-dir", str(tmp_path / "x")]) == 2
    assert "give it in full" in capsys.readouterr().err
