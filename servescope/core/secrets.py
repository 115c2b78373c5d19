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
- `redact_url(url)`: a URL without `user:password@` and with the values of secret-named query parameters
  (`?api_key=`, `&token=`) as ••••.
- `redact_meta(meta)`: a session's session.toml table with every string redacted as a command (`--api-key x`,
  `VLLM_API_KEY=x`, wherever a launch line, a server variant, a serve line or an event's text holds one) and
  every URL as above. The store writes session.toml only through it (servescope.sessions.store), so no path
  that fills the table (run, resume, tune and its cells and probes, quality) can put a secret on disk.
- `redact_log(text, secrets)`: the one filter for what a child process writes to a log the session keeps (a
  launched server's `server-N.log`, a detached runner's `runner.log`): each known secret, `Bearer <token>`, the
  command forms above, and a secret-named field of a printed dict or namespace (vLLM logs
  `non-default args: {'api_key': ['sk-...'], ...}`): `api_key='x'`, `"api_key": "x"`, `api_key=['x']`.
  `LogRedactor` applies it to a byte stream, line by line (a secret split across two reads of a pipe is
  still one line); `start_log_pump(log, secrets)` starts the process that does it (`python -m
  servescope.core.secrets`): the child writes into the pipe it returns, never into the log itself.
- `env_secrets(env)`: the secret values an environment holds (`VLLM_API_KEY`, `HF_TOKEN`...).

A redacted command cannot be run again: `is_redacted()` tells, and callers ask for the command in full.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from servescope.core.textsafe import MASK as REDACTED  # one mask for every secret, wherever it is hidden
from servescope.core.textsafe import redact

__all__ = ["REDACTED", "LogRedactor", "command_secrets", "env_secrets", "is_redacted", "redact_command", "redact_log",
           "redact_meta", "redact_sweep_table", "redact_text", "redact_url", "start_log_pump"]


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


_QUERY_SECRET = re.compile(r"(?i)(?P<name>[^=&;?#]*(?:api[-_]?key|token(?!iz|s)|secret|passw(?:or)?d|sig(?:nature)?)"
                           r"[^=&;#]*=)(?P<value>[^&;#]*)")


def redact_url(url: str) -> str:
    """`url` without `user:password@` and with the values of secret-named query parameters (`api_key`, `token`,
    `secret`, `password`, `sig`) as ••••; a text that is not a URL is returned as it is."""
    if not url or "://" not in url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:  # user:password@host: the credentials go (urlsplit keeps the host's own spelling)
        netloc = netloc.rpartition("@")[2]
    query = _QUERY_SECRET.sub(lambda m: m.group("name") + (REDACTED if m.group("value") else ""), parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")  # a URL inside a text (an event's, an error's)


def _redact_string(key: str, value: str) -> str:
    if "://" in value:
        value = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), value)
    if _HINT.search(value):
        value = redact_command(value)
    return value



def _redact_tree(key: str, value: object) -> object:
    if isinstance(value, str):
        return _redact_string(key, value)
    if isinstance(value, Mapping):
        return {k: _redact_tree(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_tree(key, v) for v in value]
    return value


def redact_meta(meta: Mapping[str, object]) -> dict[str, object]:
    """A session's table (session.toml) with its secrets as ••••: every string redacted as a command (a launch
    line, a server variant, a serve line, an event's or a failure's text) and every URL without credentials. The
    one way a session's table reaches the disk; applying it twice changes nothing more."""
    return {k: _redact_tree(str(k), v) for k, v in meta.items()}


# ---- logs: what child processes write ----------------------------------------------------------------------
# a secret-named field of a printed dict, namespace or header: api_key='x', "api_key": "x", api_key=['x', 'y'],
# hf_token=x, x-api-key: x (the name's quotes, if any, match)
_FIELD = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<q>[\"']?)(?P<name>[A-Za-z0-9_.-]*?(?:api[-_]?key|token(?!iz|s)|secret|passw(?:or)?d)"
    r"[A-Za-z0-9_.-]*)(?P=q)(?P<sep>[ \t]*[:=][ \t]*)"
    r"(?P<value>\[[^\]\n]*\]|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[^\s\"',;)}\]]+)", re.I)
_HINT = re.compile(r"(?i)api[-_]?key|token(?!iz|s)|secret|passw")  # a line the patterns below may change
_FIELD_NAME_OK = re.compile(r"(?:file|path|dir|dtype|size|ids?|name|type|len|mode|count|num)$", re.I)
_QUOTED = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'")
_NOT_SECRET = re.compile(r"(?i)(?:none|null|true|false|-?[0-9][0-9.]*|\W*)$")  # api_key=None, token: 12 ms
ENV_SECRET_MIN_LEN = 8  # an environment's secret shorter than this is not looked for as a bare word (TOKEN=1)


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """The values of `env`'s variables whose names say secret (`VLLM_API_KEY`, `OPENAI_API_KEY`, `HF_TOKEN`), at
    least ENV_SECRET_MIN_LEN characters long: a server started in it may print them."""
    return [v for k, v in env.items() if len(v) >= ENV_SECRET_MIN_LEN and v != REDACTED
            and _ENV.fullmatch(f"{k}=x") is not None and not _FLAG_NAME_OK.search(k)]  # HF_TOKEN_PATH: a path


def _field(m: re.Match[str]) -> str:
    value = m.group("value")
    if _FIELD_NAME_OK.search(m.group("name")) or _NOT_SECRET.match(value):
        return m.group(0)
    if value.startswith("["):  # a list of keys (vLLM takes several --api-key values)
        value = _QUOTED.sub(lambda q: _quoted(q.group(0)), value)
    else:
        value = _quoted(value)
    return f"{m.group('q')}{m.group('name')}{m.group('q')}{m.group('sep')}{value}"


def redact_log(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Log text with every known secret, every `Bearer <token>`, the values of secret flags and env words
    (`--api-key x`, `--api-key=x`, `VLLM_API_KEY=x`) and of secret-named fields (`api_key='x'`,
    `"api_key": "x"`, `'api_key': ['x']`) replaced by ••••. Applying it twice changes nothing more."""
    if not text:
        return text
    text = redact_text(text, secrets)
    if not _HINT.search(text):  # most of a server's log: no line to look at twice
        return text
    return "\n".join(redact_command(_FIELD.sub(_field, line)) if _HINT.search(line) else line
                     for line in text.split("\n"))


class LogRedactor:
    """`redact_log` over a byte stream (a child's stdout and stderr): `feed(chunk)` returns the redacted bytes of
    the lines completed so far (a line ends at \\n or \\r), keeping the unfinished one, so a secret split
    across two reads is redacted whole; `close()` returns the rest. A line longer than `max_line` bytes is
    written in pieces, the last `keep` bytes (already redacted) held back for the next read."""

    def __init__(self, secrets: Iterable[str | None] = (), max_line: int = 1 << 16, keep: int = 4096) -> None:
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.max_line = max(max_line, 2 * keep)
        self.keep = keep
        self._pending = b""

    def _redact(self, data: bytes) -> bytes:
        text = data.decode("utf-8", "surrogateescape")  # any bytes round-trip unchanged
        return redact_log(text, self.secrets).encode("utf-8", "surrogateescape")

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        out, self._pending = (self._redact(buf[:end]) if end else b""), buf[end:]
        if len(self._pending) > self.max_line:  # a very long line: write all but its (redacted) tail
            red = self._redact(self._pending)
            cut = len(red) - self.keep
            space = max(red.rfind(b" ", 0, cut), red.rfind(b"\t", 0, cut))
            cut = space + 1 if space > cut - self.keep else cut
            out, self._pending = out + red[:cut], red[cut:]
        return out

    def close(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._redact(rest) if rest else b""


def start_log_pump(log: IO[bytes], secrets: Iterable[str | None]) -> tuple[subprocess.Popen[bytes], int]:
    """Start the process that writes a child's output to `log` (an open file) through `LogRedactor`; returns
    it and the write end of its pipe, to give the child as stdout and stderr (and then close). The secrets
    travel over that pipe, before any output, never on a command line. The pump ends when every process
    holding the write end has closed it (the child and its children are gone), after writing what was left;
    wait for it before reading the log's last lines."""
    header = json.dumps(sorted({s for s in secrets if s})).encode() + b"\n"
    r, w = os.pipe()
    try:
        pump = subprocess.Popen([sys.executable, "-m", "servescope.core.secrets"], stdin=r, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)  # own session: no terminal's signal ends it
    except OSError:
        os.close(w)
        raise
    finally:
        os.close(r)
    try:
        view = memoryview(header)
        while view:
            view = view[os.write(w, view):]
    except OSError:
        os.close(w)
        pump.kill()
        pump.wait()
        raise
    return pump, w


def _write_all(fd: int, data: bytes) -> bool:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return True
    except OSError:  # the disk is full or the log gone: keep draining, so the child never blocks on its output
        return False


def _pump_main() -> int:
    """stdin: a JSON list of secrets on the first line, then a child's output; stdout: that output, redacted."""
    head = b""
    while b"\n" not in head:
        chunk = os.read(0, 65536)
        if not chunk:
            return 0
        head += chunk
    line, rest = head.split(b"\n", 1)
    secrets = [s for s in json.loads(line) if isinstance(s, str)]
    redactor = LogRedactor(secrets)
    ok = True
    while True:
        out = redactor.feed(rest)
        if out and ok:
            ok = _write_all(1, out)
        rest = os.read(0, 65536)
        if not rest:
            break
    if ok:
        _write_all(1, redactor.close())
    return 0


if __name__ == "__main__":
    sys.exit(_pump_main())
