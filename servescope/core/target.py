"""Probe a target server: served models, max length, version, /metrics; plus its tokenizer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text


def redact_url(url: str) -> str:
    """Drop user:password@ from a URL (sessions and logs never hold credentials)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        parts = parts._replace(netloc=host)
    return urlunsplit(parts)


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


@dataclass
class TargetInfo:
    url: str
    models: list[ModelInfo] = field(default_factory=list)
    version: str | None = None
    metrics_available: bool = False
    tokenize_available: bool = False
    raw_models: Any = None

    def model(self, name: str | None) -> ModelInfo:
        if name is None:
            if len(self.models) == 1:
                return self.models[0]
            if not self.models:
                raise ServescopeError(f"{self.url} serves no models (/v1/models is empty); check the server")
            ids = ", ".join(m.id for m in self.models)
            raise ServescopeError(f"{self.url} serves several models ({ids}); choose one with --model")
        for m in self.models:
            if m.id == name:
                return m
        ids = ", ".join(m.id for m in self.models) or "none"
        raise ServescopeError(f"unknown model {name!r}; {self.url} serves: {ids}")


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def probe(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> TargetInfo:
    url = normalize_url(url)
    info = TargetInfo(url=redact_url(url))
    from servescope.core.client import async_client

    async with async_client(base_url=url, headers=_headers(api_key), timeout=timeout_s) as c:
        try:
            r = await c.get("/v1/models")
        except httpx.ConnectError as e:
            raise ServescopeError(
                f"cannot connect to {info.url} ({clean_text(str(e)) or 'connection refused'}); is the server running? check --url"
            ) from None
        except httpx.TimeoutException:
            raise ServescopeError(f"{info.url} did not answer within {timeout_s:g} s; check --url and the server") from None
        except httpx.HTTPError as e:
            raise ServescopeError(f"cannot talk to {info.url}: {clean_text(str(e))}; check --url") from None
        if r.status_code in (401, 403):
            raise ServescopeError(
                f"{info.url} refused the API key (HTTP {r.status_code}); set it with --api-key-env NAME or --api-key"
            )
        try:
            body = r.json()
            data = body["data"]
            assert isinstance(data, list)
        except Exception:
            raise ServescopeError(
                f"{info.url} is not an OpenAI-compatible server (GET /v1/models gave HTTP {r.status_code}); check --url"
            ) from None
        info.raw_models = data
        for m in data:
            if isinstance(m, dict) and "id" in m:
                mml = m.get("max_model_len")
                info.models.append(ModelInfo(str(m["id"]), int(mml) if isinstance(mml, int) else None))
        try:
            v = await c.get("/version")
            if v.status_code == 200:
                info.version = clean_text(str(v.json().get("version")))
        except Exception:
            pass
        try:
            mt = await c.get("/metrics")
            info.metrics_available = mt.status_code == 200 and "vllm:" in mt.text
        except Exception:
            pass
    return info


class Tokenizer(Protocol):
    exact: bool
    name: str

    async def encode(self, text: str) -> list[int]: ...
    async def decode(self, ids: list[int]) -> str: ...
    async def count_prompt(self, text: str) -> int: ...
    async def count_chat(self, text: str) -> int: ...


class ServerTokenizer:
    """vLLM's /tokenize and /detokenize: the exact tokenizer and chat template the server uses."""

    exact = True
    name = "server /tokenize"

    def __init__(self, http: httpx.AsyncClient, model: str) -> None:
        self.http = http
        self.model = model

    async def _tok(self, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.http.post("/tokenize", json={"model": self.model, **body})
        if r.status_code != 200:
            raise ServescopeError(f"/tokenize failed (HTTP {r.status_code}): {clean_text(r.text)[:200]}")
        out: dict[str, Any] = r.json()
        return out

    async def encode(self, text: str) -> list[int]:
        return list((await self._tok({"prompt": text, "add_special_tokens": False}))["tokens"])

    async def decode(self, ids: list[int]) -> str:
        r = await self.http.post("/detokenize", json={"model": self.model, "tokens": ids})
        if r.status_code != 200:
            raise ServescopeError(f"/detokenize failed (HTTP {r.status_code}): {clean_text(r.text)[:200]}")
        return str(r.json()["prompt"])

    async def count_prompt(self, text: str) -> int:
        return int((await self._tok({"prompt": text}))["count"])

    async def count_chat(self, text: str) -> int:
        body = {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
        return int((await self._tok(body))["count"])


class LocalTokenizer:
    """A local Hugging Face tokenizer (`--tokenizer PATH`), for servers without /tokenize."""

    exact = True

    def __init__(self, path: str) -> None:
        try:
            from transformers import AutoTokenizer  # type: ignore[import-not-found]
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


async def has_tokenize(http: httpx.AsyncClient, model: str) -> bool:
    try:
        r = await http.post("/tokenize", json={"model": model, "prompt": "hello"})
        return r.status_code == 200 and "count" in r.json()
    except Exception:
        return False
