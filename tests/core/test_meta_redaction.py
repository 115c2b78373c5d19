"""The one redaction of a session's table (core.secrets.redact_meta), which the store applies to every write of
session.toml: a key anywhere in it (a tune's sweep table, a serve line, an event's text, a URL) is ••••."""

from __future__ import annotations

import tomllib
from pathlib import Path

from servescope.core.secrets import REDACTED, redact_meta, redact_url
from servescope.sessions.store import SessionWriter


def test_redact_url_drops_credentials_and_secret_query_values() -> None:
    assert redact_url("http://user:pw@host:8000/v1") == "http://host:8000/v1"
    assert redact_url("https://h/v1?api_key=sk-1&model=m") == f"https://h/v1?api_key={REDACTED}&model=m"
    assert redact_url("https://h/v1?token=abc;x=1") == f"https://h/v1?token={REDACTED};x=1"
    assert redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert redact_url("sharegpt") == "sharegpt"


def test_redact_meta_reaches_every_string_and_leaves_the_rest() -> None:
    meta = {
        "sweep": {"server": {"launch": "HF_TOKEN=sk-a vllm serve m --api-key sk-b", "variants": [{"args": "--api-key=sk-c"}]}},
        "tune": {"best": {"serve": "vllm serve m --api-key sk-d --max-num-seqs 8", "concurrency": 4}},
        "events": [{"kind": "x", "text": "relaunched: MY_SECRET=sk-e vllm serve"}],
        "target": {"url": "http://u:sk-f@h:1"},
        "message": "the server at https://h/?token=sk-g failed",
        "api_key_env": "OPENAI_API_KEY", "workloads": [{"name": "sharegpt", "input_tokens": 5}],
    }
    out = redact_meta(meta)
    text = repr(out)
    for s in ("sk-a", "sk-b", "sk-c", "sk-d", "sk-e", "sk-f", "sk-g"):
        assert s not in text, s
    assert out["api_key_env"] == "OPENAI_API_KEY" and out["workloads"] == meta["workloads"]
    assert out["tune"]["best"]["serve"] == f"vllm serve m --api-key {REDACTED} --max-num-seqs 8"  # type: ignore[index]
    assert redact_meta(out) == out
    assert "sk-a" in repr(meta)  # the caller's table is left as it was


def test_the_store_writes_session_toml_only_redacted(tmp_path: Path) -> None:
    w = SessionWriter.create(tmp_path / "s", {"kind": "tune", "sweep": {"server": {"launch": "vllm serve m --api-key sk-z1"}}})
    w.meta["tune"] = {"best": {"serve": "VLLM_API_KEY=sk-z2 vllm serve m"}}
    w.add_event("x", "--api-key=sk-z3")
    raw = (tmp_path / "s" / "session.toml").read_text()
    assert not any(s in raw for s in ("sk-z1", "sk-z2", "sk-z3")), raw
    assert tomllib.loads(raw)["sweep"]["server"]["launch"] == f"vllm serve m --api-key {REDACTED}"
