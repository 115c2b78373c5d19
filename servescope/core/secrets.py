"""Secrets never leave servescope: API keys and the secret values of launch commands are replaced by `••••`
before anything is printed, stored or reported.

- `redact_command("VLLM_API_KEY=k vllm serve M --api-key k2")` -> `VLLM_API_KEY=•••• vllm serve M --api-key ••••`:
  the values of `--api-key`/`--api_key` (and of any flag whose name says key, token, secret or password:
  `--hf-token`), and of env-style words whose name holds `API_KEY`, `TOKEN`, `SECRET` or `PASSWORD`
  (`HF_TOKEN=`, `MY_SECRET=`; `TOKENIZERS_PARALLELISM=` is not one).
- `redact_text(text, secrets)` for error text and anything a server sent back: every occurrence of each
  secret, and whatever follows `Bearer ` (a server that echoes the Authorization header), become `••••`.
- `command_secrets(command)`: the secret values a command holds (to mask them in logs and errors).
- `redact_sweep_table(table)`: a sweep table (the sweep-file format) with its `[server]` launch command and
  variants redacted, for session.toml.

A redacted command cannot be run again: `is_redacted()` tells, and callers ask for the command in full.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from servescope.core.textsafe import MASK as REDACTED  # one mask for every secret, wherever it is hidden
from servescope.core.textsafe import redact

__all__ = ["REDACTED", "command_secrets", "is_redacted", "redact_command", "redact_sweep_table", "redact_text"]


_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s\"']\S*)"
# an env-style word: NAME=VALUE, NAME holding API_KEY / TOKEN (not TOKENIZER/TOKENS) / SECRET / PASSWORD
_ENV = re.compile(
    r"(?<!\S)(?P<name>[A-Za-z_][A-Za-z0-9_]*?(?:API_?KEY|TOKEN(?!IZ|S)|SECRET|PASSW(?:OR)?D)[A-Za-z0-9_]*)="
    rf"(?P<value>{_VALUE})", re.I)
# a flag: --api-key VALUE, --api_key=VALUE, --hf-token VALUE, --client-secret VALUE, --password VALUE
_FLAG = re.compile(
    r"(?<!\S)(?P<flag>--?(?:[A-Za-z0-9]+[-_])*?(?:api[-_]?key|token(?!iz|s)|secret|passw(?:or)?d)"
    r"(?:[-_][A-Za-z0-9]+)*?)(?P<sep>=|\s+)"
    rf"(?P<value>(?!-){_VALUE})", re.I)
_FLAG_NAME_OK = re.compile(r"(?:file|path|dir|dtype|size|id|name|type|len|mode)$", re.I)  # a path or a number, not a secret
_BEARER = re.compile(r"(?i)(bearer\s+)([^\s\"',;}\]]+)")


def _quoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    return REDACTED


def redact_command(text: str | None) -> str:
    """`text` (a launch command, a server variant) with its secret values replaced by ••••."""
    if not text:
        return text or ""

    def env(m: re.Match[str]) -> str:
        return f"{m.group('name')}={_quoted(m.group('value'))}"

    def flag(m: re.Match[str]) -> str:
        if _FLAG_NAME_OK.search(m.group("flag")):  # --ssl-keyfile PATH, --kv-cache-dtype X
            return m.group(0)
        return f"{m.group('flag')}{m.group('sep')}{_quoted(m.group('value'))}"

    return _FLAG.sub(flag, _ENV.sub(env, text))


def command_secrets(text: str | None) -> list[str]:
    """The secret values `text` holds (unquoted), longest first."""
    if not text:
        return []
    out: list[str] = []
    for m in _ENV.finditer(text):
        out.append(m.group("value"))
    for m in _FLAG.finditer(text):
        if not _FLAG_NAME_OK.search(m.group("flag")):
            out.append(m.group("value"))
    vals = {v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v for v in out}
    return sorted((v for v in vals if v and v != REDACTED), key=len, reverse=True)


def redact_text(text: str | None, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every occurrence of each secret, and any `Bearer <token>`, replaced by ••••."""
    if not text:
        return text or ""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = redact(text, s)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


def is_redacted(text: str | None) -> bool:
    """Whether `text` holds a value servescope redacted (it cannot be run as it is)."""
    return bool(text) and REDACTED in str(text)


def redact_sweep_table(table: Mapping[str, object]) -> dict[str, object]:
    """A sweep table (sweep-file format) with `[server] launch` and every variant's `args` redacted."""
    out = dict(table)
    server = out.get("server")
    if isinstance(server, Mapping):
        srv = dict(server)
        if isinstance(srv.get("launch"), str):
            srv["launch"] = redact_command(srv["launch"])
        if isinstance(srv.get("variants"), list):
            srv["variants"] = [{**v, "args": redact_command(v["args"])} if isinstance(v, Mapping)
                               and isinstance(v.get("args"), str) else v for v in srv["variants"]]
        out["server"] = srv
    return out
