"""The one log filter (servescope.core.secrets): what a child process writes to a log the session keeps loses
every secret servescope knows of and every secret-looking form, whatever the pipe's chunks (issue 32, item 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.secrets import REDACTED, LogRedactor, env_secrets, redact_log, start_log_pump

KEY = "sk-live-7f3Qa9Zx"  # the key servescope knows (given to --api-key, or read from the environment)
OTHER = "sk-unknown-42Bq"  # a key it does not know: only its form gives it away

FORMS = [
    "--api-key {k}",
    "--api-key={k}",
    "--api_key {k}",
    "api_key='{k}'",
    '"api_key": "{k}"',
    "'api_key': '{k}'",
    "Authorization: Bearer {k}",
    "authorization: bearer {k}",
    "VLLM_API_KEY={k}",
    "x-api-key: {k}",
    "INFO 12-06 09:00:01 [utils.py:233] non-default args: {{'model_tag': 'm', 'api_key': ['{k}'], 'port': 8000}}",
    "args: Namespace(host='127.0.0.1', port=8000, api_key=['{k}', 'sk-second-key9'], max_num_seqs=4)",
    'main: server params {{"hf_token": "{k}", "n_ctx": 4096}}',
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("key", [KEY, OTHER])
def test_every_form_is_redacted(form: str, key: str) -> None:
    line = form.format(k=key)
    out = redact_log(line, [KEY])
    assert key not in out and "sk-second-key9" not in out and REDACTED in out


def test_a_known_key_is_redacted_as_a_bare_word() -> None:
    assert redact_log(f"echo {KEY}.", [KEY]) == f"echo {REDACTED}."
    assert OTHER in redact_log(f"echo {OTHER}", [KEY])  # an unknown bare word cannot be told from text


KEEP = [
    "INFO [kv_cache_utils.py:1087] GPU KV cache size: 1,234,560 tokens",
    "INFO [kv_cache_utils.py:1091] Maximum concurrency for 4,096 tokens per request: 301.41x",
    "non-default args: {'max_num_batched_tokens': 8192, 'api_key': None, 'max_tokens': 16}",
    "first token: 12 ms, skip_tokenizer_init=False, TOKENIZERS_PARALLELISM=false",
    "--ssl-keyfile /etc/key.pem --kv-cache-dtype fp8 --tokenizer-mode auto",
]


@pytest.mark.parametrize("line", KEEP)
def test_lines_without_secrets_are_unchanged(line: str) -> None:
    assert redact_log(line, [KEY]) == line


def test_redacting_twice_changes_nothing_more() -> None:
    text = "\n".join(f.format(k=KEY) for f in FORMS)
    once = redact_log(text, [KEY])
    assert redact_log(once, [KEY]) == once


STREAM = ("".join(f.format(k=KEY) + ("\r" if i % 3 == 0 else "\n") for i, f in enumerate(FORMS))
          + "GPU KV cache size: 4096 tokens\nno newline at the end " + KEY).encode()
PATTERN_ONLY = "".join(f.format(k=OTHER) + "\n" for f in FORMS).encode()


def _through(chunks: list[bytes], secrets: list[str], **kw: int) -> bytes:
    r = LogRedactor(secrets, **kw)
    return b"".join(r.feed(c) for c in chunks) + r.close()


def test_a_key_split_at_every_byte_between_two_reads() -> None:
    whole = redact_log(STREAM.decode(), [KEY]).encode()
    assert _through([STREAM], [KEY]) == whole
    for cut in range(1, len(STREAM)):
        out = _through([STREAM[:cut], STREAM[cut:]], [KEY])
        assert out == whole, cut
    for cut in range(1, len(PATTERN_ONLY)):  # a key servescope does not know, found by its form
        assert OTHER.encode() not in _through([PATTERN_ONLY[:cut], PATTERN_ONLY[cut:]], [])


def test_byte_by_byte_and_a_line_longer_than_the_buffer() -> None:
    assert _through([bytes([b]) for b in STREAM], [KEY]) == redact_log(STREAM.decode(), [KEY]).encode()
    long_line = (b"x " * 300 + b"--api-key " + OTHER.encode() + b" " + KEY.encode() + b" y" * 300)
    for cut in range(0, len(long_line), 7):  # pieces written before the newline comes: never a key
        out = _through([long_line[:cut], long_line[cut:], b"\n"], [KEY], max_line=128, keep=64)
        assert KEY.encode() not in out and OTHER.encode() not in out and out.endswith(b" y\n")


def test_bytes_that_are_not_utf8_pass_unchanged() -> None:
    data = b"\xff\xfe binary \xe2\x82 half a character\n"
    assert _through([data[:3], data[3:]], [KEY]) == data


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12, unique=True))
def test_fuzz_any_chunking_gives_the_same_log(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    out = _through(chunks, [KEY])
    assert out == redact_log(STREAM.decode(), [KEY]).encode() and KEY.encode() not in out


def test_env_secrets_are_the_secret_named_variables() -> None:
    env = {"OPENAI_API_KEY": "sk-env-12345678", "HF_TOKEN": "hf_abcdefgh123", "VLLM_API_KEY": "short",
           "HF_TOKEN_PATH": "/root/.cache/hf/token", "TOKENIZERS_PARALLELISM": "falsefalse", "PATH": "/usr/bin:/bin"}
    assert sorted(env_secrets(env)) == ["hf_abcdefgh123", "sk-env-12345678"]


def test_the_pump_process_writes_the_log_redacted(tmp_path: Path) -> None:
    log = tmp_path / "server-0.log"
    with open(log, "ab") as f:
        pump, w = start_log_pump(f, [KEY])
    try:
        cmdline = Path(f"/proc/{pump.pid}/cmdline").read_bytes()
        assert KEY.encode() not in cmdline  # the secrets travel over the pipe, never on a command line
        data = STREAM + b"\n"
        for cut in range(0, len(data), 5):  # many small writes: the pump sees the key split between reads
            os.write(w, data[cut:cut + 5])
    finally:
        os.close(w)
    assert pump.wait(timeout=30) == 0
    text = log.read_bytes()
    assert KEY.encode() not in text and OTHER.encode() not in text
    assert b"GPU KV cache size: 4096 tokens\n" in text and text.endswith(f"at the end {REDACTED}\n".encode())
