"""Probe a target server: served models, max length, version, /metrics; plus its tokenizer."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

import httpx

from servescope.core import llamacpp
from servescope.core.client import async_client
from servescope.core.errors import ServescopeError, error_text
from servescope.core.secrets import redact_url as redact_url  # (re-exported: core.probe uses it from here)
from servescope.core.textsafe import clean_secret_text, clean_text, redact
from servescope.core.tls import TlsSettings, cert_problem, current, measure_handshakes


def normalize_url(url: str) -> str:
    url = url.strip()
    if not re.match(r"^https?://", url):
        raise ServescopeError(f"bad URL {url!r}: give one like http://127.0.0.1:8000 (or sim://tiny for the simulator)")
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    return url


@dataclass
class ModelInfo:
    id: str
    max_model_len: int | None = None
    parent: str | None = None  # a LoRA adapter's base model (vLLM lists its adapters with their base as parent)


@dataclass
class TargetInfo:
    url: str
    models: list[ModelInfo] = field(default_factory=list)
    version: str | None = None
    metrics_available: bool = False
    tokenize_available: bool = False
    raw_models: object = None  # /v1/models' `data` as the server sent it (session.toml keeps it as JSON)
    engine: str = "openai"  # "vllm" | "llamacpp" | "openai" (any other OpenAI-compatible server)
    slots: int | None = None  # llama.cpp: parallel slots (`--parallel`), each with max_model_len of context
    # how a new connection costs, measured apart from any request (core/tls.py measure_handshakes): TCP connect
    # and, over https, the TLS handshake, p50 of a few fresh connections in ms (None: not measured)
    connect_ms: float | None = None
    tls_handshake_ms: float | None = None
    tls_verify: bool | None = None  # https: whether the certificate was checked (False: --insecure); None: http
    tls_ca: str | None = None  # https with --ca-cert: the CA file's name

    @property
    def engine_text(self) -> str:
        """The engine and its version, for headers: `vLLM 0.32.0`, `llama.cpp b4512`, `OpenAI-compatible`."""
        name = {"vllm": "vLLM", "llamacpp": "llama.cpp"}.get(self.engine, "OpenAI-compatible server")
        return f"{name} {self.version}" if self.version else name

    def model(self, name: str | None) -> ModelInfo:
        if name is None:
            if len(self.models) == 1:
                return self.models[0]
            bases = [m for m in self.models if m.parent is None]
            if len(bases) == 1 and all(m.parent == bases[0].id for m in self.models if m is not bases[0]):
                return bases[0]  # a base model and its LoRA adapters: the base is the sweep's model
            if not self.models:
                raise ServescopeError(f"{self.url} serves no models (/v1/models is empty); check the server")
            raise ServescopeError(f"{self.url} serves several models ({model_list(self.models)}); choose one with "
                                  "--model")
        for m in self.models:
            if m.id == name:
                return m
        ids = model_list(self.models) or "none"
        raise ServescopeError(f"unknown model {name!r}; {self.url} serves: {ids}")


MODELS_SHOWN = 6  # a message names this many served models, then says how many more
MODEL_ID_SHOWN = 80  # characters of one model id in a message


def model_list(models: list[ModelInfo], shown: int = MODELS_SHOWN) -> str:
    """The served models for a one-line message: the first `shown` ids (each cleaned and cut to
    `MODEL_ID_SHOWN` characters: server text is data), then "and N more" (1,000 models once made a 6,000-character
    line)."""
    ids = [_short_id(m.id) for m in models[:shown]]
    more = len(models) - len(ids)
    return ", ".join(ids) + (f" and {more:,} more" if more > 0 else "")


def _short_id(model_id: str) -> str:
    text = clean_text(model_id)
    return text if len(text) <= MODEL_ID_SHOWN else text[: MODEL_ID_SHOWN - 3] + "..."


def request_failed(where: str, e: httpx.HTTPError, detail: str, timeout_text: str) -> ServescopeError:
    """One line for a request to `where` that got no answer (`detail`: the error's text, already cleaned); a
    certificate the client does not trust names the problem and --ca-cert / --insecure."""
    bad_cert = cert_problem(where, e)
    if bad_cert is not None:
        return bad_cert
    if isinstance(e, httpx.ConnectError):
        return ServescopeError(f"cannot connect to {where} ({detail or 'connection refused'}); is the server running? "
                               "check --url")
    if isinstance(e, httpx.TimeoutException):
        return ServescopeError(f"{where} {timeout_text}")
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        # the server was reached and then dropped the connection: the URL is right, the server is not well
        why = detail if detail and str(e).strip() else "the connection was closed mid-answer"
        return ServescopeError(f"{where} dropped the connection ({why}); is the server "
                               "restarting or overloaded? check its log, then run again")
    return ServescopeError(f"cannot talk to {where}: {detail or error_text(e)}; check --url")


def key_refused(where: str, status: int) -> ServescopeError:
    return ServescopeError(f"{where} refused the API key (HTTP {status}); set it with --api-key-env NAME or --api-key")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def probe(url: str, api_key: str | None = None, timeout_s: float = 10.0, engine: str = "auto",
                tls: TlsSettings | None = None) -> TargetInfo:
    """What the server at `url` serves, and which engine it is (`engine` "auto": recognised from its answers);
    over https with `tls` (else this process's setting: core/tls.py), whose new connections' cost (TCP connect,
    TLS handshake) is measured apart."""
    url = normalize_url(url)
    info = TargetInfo(url=redact_url(url))
    settings = tls or current()
    async with async_client(base_url=url, headers=_headers(api_key), timeout=timeout_s, tls=settings) as c:
        try:
            r = await c.get("/v1/models")
        except httpx.HTTPError as e:
            raise request_failed(info.url, e, clean_text(str(e)),
                                 f"did not answer within {timeout_s:g} s; check --url and the server") from None
        if r.status_code in (401, 403):
            raise key_refused(info.url, r.status_code)
        try:
            body = r.json()
            data = body["data"]
            assert isinstance(data, list)
        except Exception:
            raise ServescopeError(
                f"{info.url} is not an OpenAI-compatible server (GET /v1/models gave HTTP {r.status_code}); check --url"
            ) from None
        info.raw_models = data
        if url.startswith("https://"):
            info.tls_verify, info.tls_ca = settings.verify, settings.ca_cert and settings.ca_cert.rsplit("/", 1)[-1]
        hs = await measure_handshakes(url, settings)
        if hs is not None:
            info.connect_ms, info.tls_handshake_ms = hs.connect_ms_p50, hs.tls_handshake_ms_p50
        for m in data:
            if isinstance(m, dict) and "id" in m:
                mml = m.get("max_model_len")
                ok_len = isinstance(mml, int) and not isinstance(mml, bool) and 0 < mml < 2**31
                parent = m.get("parent")
                info.models.append(ModelInfo(str(m["id"]), mml if ok_len else None,
                                             parent if isinstance(parent, str) and parent else None))
        props = await _props(c) if engine in ("auto", "llamacpp") else None
        if engine == "llamacpp" or (engine == "auto" and llamacpp.is_llamacpp(data, props)):
            info.engine = "llamacpp"
            info.version = llamacpp.build_version(props)
            info.slots = llamacpp.slots(props)
            n_ctx = llamacpp.slot_context(props, data)
            for m in info.models:
                m.max_model_len = m.max_model_len or n_ctx
        else:
            try:
                v = await c.get("/version")
                if v.status_code == 200:
                    info.version = clean_text(str(v.json().get("version")))
                    info.engine = "vllm" if engine == "auto" else engine
            except Exception:
                pass
            if engine in ("vllm", "openai"):
                info.engine = engine
        try:
            mt = await c.get("/metrics")
            info.metrics_available = mt.status_code == 200 and ("vllm:" in mt.text or "llamacpp:" in mt.text)
            if info.engine == "openai" and engine == "auto" and "vllm:" in mt.text:
                info.engine = "vllm"
        except Exception:
            pass
    return info


async def _props(c: httpx.AsyncClient) -> object:
    """llama.cpp's /props, as it answered (None from other servers)."""
    try:
        r = await c.get("/props")
        return r.json() if r.status_code == 200 else None
    except Exception:
        return None


class Tokenizer(Protocol):
    exact: bool
    name: str

    async def encode(self, text: str) -> list[int]: ...
    async def decode(self, ids: list[int]) -> str: ...
    async def count_prompt(self, text: str) -> int: ...
    async def count_chat(self, text: str) -> int: ...


class ServerTokenizer:
    """vLLM's /tokenize and /detokenize: the exact tokenizer and chat template the server uses. What they answer
    is checked: anything but a count, a list of token ids or a text is one ServescopeError (never a
    ValueError halfway through building prompts)."""

    exact = True
    name = "server /tokenize"

    def __init__(self, http: httpx.AsyncClient, model: str, secret: str | None = None) -> None:
        self.http = http
        self.model = model
        self.secret = secret  # the API key: masked in any text of the server's that ends up in an error

    def _where(self, path: str) -> str:
        return redact_url(str(self.http.base_url).rstrip("/")) + path

    def _garbage(self, path: str, what: str, value: object) -> ServescopeError:
        return ServescopeError(f"{self._where(path)} answered {_show(value, self.secret)} where {what} belongs; "
                               "fix the server or pass --tokenizer PATH (a local tokenizer)")

    async def _post(self, path: str, body: Mapping[str, object]) -> dict[str, object]:
        r = await self.http.post(path, json={"model": self.model, **body})
        if r.status_code != 200:
            raise ServescopeError(f"{path} failed (HTTP {r.status_code}): "
                                  f"{clean_secret_text(r.text[:4096], self.secret, 200)}")
        try:
            out = r.json()
        except ValueError:
            raise self._garbage(path, "a JSON object", redact(r.text[:60], self.secret)) from None
        if not isinstance(out, dict):
            raise self._garbage(path, "a JSON object", out)
        obj: dict[str, object] = out  # its entries are checked where read
        return obj

    async def _tok(self, body: Mapping[str, object]) -> dict[str, object]:
        return await self._post("/tokenize", body)

    def _count(self, out: Mapping[str, object]) -> int:
        c = out.get("count")
        if not is_count(c):
            raise self._garbage("/tokenize", "a token count", c)
        return c

    async def encode(self, text: str) -> list[int]:
        tokens = (await self._tok({"prompt": text, "add_special_tokens": False})).get("tokens")
        if not isinstance(tokens, list) or not all(is_count(t) for t in tokens):
            raise self._garbage("/tokenize", "a list of token ids", tokens)
        return list(tokens)

    async def decode(self, ids: list[int]) -> str:
        text = (await self._post("/detokenize", {"tokens": ids})).get("prompt")
        if not isinstance(text, str):
            raise self._garbage("/detokenize", "a text", text)
        return text

    async def count_prompt(self, text: str) -> int:
        return self._count(await self._tok({"prompt": text}))

    async def count_chat(self, text: str) -> int:
        body = {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
        return self._count(await self._tok(body))


MAX_TOKENS = 2**31 - 1


def is_count(v: object) -> TypeGuard[int]:
    """A token count or id: an integer from 0 to 2**31 - 1 (not a bool, a float or a string)."""
    return type(v) is int and 0 <= v <= MAX_TOKENS


def _show(v: object, secret: str | None = None) -> str:
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    text = clean_secret_text(text, secret, 10_000)
    return text if len(text) <= 60 else text[:57] + "..."


class LocalTokenizer:
    """A local Hugging Face tokenizer (`--tokenizer PATH`), for servers without /tokenize."""

    exact = True

    def __init__(self, path: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ServescopeError("--tokenizer needs the transformers package: pip install transformers") from None
        try:
            self.tok = AutoTokenizer.from_pretrained(path)
        except Exception as e:
            raise ServescopeError(f"cannot load tokenizer {path!r}: {clean_text(str(e))[:200]}") from None
        self.name = f"local {path}"

    async def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    async def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))

    async def count_prompt(self, text: str) -> int:
        return len(self.tok.encode(text))

    async def count_chat(self, text: str) -> int:
        ids = self.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # newer transformers return a BatchEncoding (a mapping) here
            ids = ids["input_ids"]
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
        return len(ids)


class EstimateTokenizer:
    """No tokenizer available: one token per word. Inputs are then approximate; every cell reports
    the requested vs measured (usage.prompt_tokens) lengths, so the mismatch is visible."""

    exact = False
    name = "estimate (1 token per word)"

    def __init__(self) -> None:
        self._vocab: list[str] = []
        self._ids: dict[str, int] = {}

    async def encode(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            i = self._ids.get(w)
            if i is None:
                i = self._ids[w] = len(self._vocab)
                self._vocab.append(w)
            out.append(i)
        return out

    async def decode(self, ids: list[int]) -> str:
        return " ".join(self._vocab[i] for i in ids)

    async def count_prompt(self, text: str) -> int:
        return len(text.split())

    async def count_chat(self, text: str) -> int:
        return len(text.split())


COUNT_PROBE = " ".join(["the cache of the server"] * 40)  # 200 words: counted beside "hello" by `has_tokenize`


def counted_text(a: int, few: int, b: int, many: int) -> str:
    """What a tokenizer answered for texts of `few` and `many` words, for `not_counting`."""
    if a == b:
        return f"answered {a:,} tokens for texts of {few:,} to {many:,} words"
    return f"answered {a:,} tokens for {few:,} words and {b:,} for {many:,}"


def not_counting(tok: Tokenizer, what: str) -> ServescopeError:
    """The one line for a tokenizer whose counts do not follow the text (`what` it answered)."""
    who = "the server's /tokenize" if tok.name == ServerTokenizer.name else f"the tokenizer ({tok.name})"
    return ServescopeError(f"{who} {what}: it is not counting this model's tokens; use --tokenizer PATH (a local "
                           "tokenizer of the served model)")


async def has_tokenize(http: httpx.AsyncClient, model: str, secret: str | None = None) -> bool:
    """Whether the server has a usable /tokenize. No answer, an error or a body without a "count": False (input
    lengths are then estimated). A 200 whose count or tokens are not counts (`{"count": "many"}`), or whose count
    for 200 words is no more than for "hello" (a /tokenize that always answers 3), raises one ServescopeError
    before anything starts: such a server cannot be trusted to size prompts."""
    try:
        r = await http.post("/tokenize", json={"model": model, "prompt": "hello"})
        body = r.json() if r.status_code == 200 else None
    except Exception:
        return False
    if not isinstance(body, dict) or "count" not in body:
        return False
    tok = ServerTokenizer(http, model, secret)
    tok._count(body)
    tokens = body.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or not all(is_count(t) for t in tokens)):
        raise tok._garbage("/tokenize", "a list of token ids", tokens)
    a = tok._count(body)
    b = await tok.count_prompt(COUNT_PROBE)  # a count that does not grow with the text sizes no prompt
    if b <= a:
        raise not_counting(tok, counted_text(a, 1, b, len(COUNT_PROBE.split())))
    return True
