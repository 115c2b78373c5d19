"""llama.cpp's server (`llama-server`) as a target: how it is recognised, what its own endpoints say, and its
tokenizer. It speaks the OpenAI API like vLLM, but its extras differ:

- `/v1/models` lists the model with `owned_by: "llamacpp"` and a `meta` table (`n_ctx` is one slot's context);
  `/props` has `default_generation_settings.n_ctx` (per slot), `total_slots` (`--parallel`) and `build_info`.
  Its "KV budget" is `-c`, shared by the slots: past `total_slots` users, requests queue.
- `/tokenize` takes `{"content", "add_special"}` and answers `{"tokens": [...]}` (no count); `/detokenize`
  takes `{"tokens"}` and answers `{"content"}`; `/apply-template` renders chat messages with the model's
  template (`{"prompt"}`), which is what a chat request is tokenized as.
- `/metrics` (with `--metrics`) has `llamacpp:` counters (prompt_tokens_total, tokens_predicted_total,
  requests_processing, requests_deferred, ...), no KV-cache gauge.
- It closes an idle keep-alive connection after 5 s (so does vLLM's server): the client's pools expire idle
  connections before that (servescope.core.client)."""

from __future__ import annotations

import httpx

from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.textsafe import clean_secret_text, clean_text


def is_llamacpp(models: object, props: object) -> bool:
    """Recognised from `/v1/models` (`owned_by: "llamacpp"`) or `/props` (its generation settings); both as the
    server answered them (JSON of any shape)."""
    if isinstance(models, list) and any(isinstance(m, dict) and m.get("owned_by") == "llamacpp" for m in models):
        return True
    return isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict)


def slot_context(props: object, models: object) -> int | None:
    """One slot's context (the longest request), from /props or the model's `meta.n_ctx`."""
    if isinstance(props, dict):
        dgs = props.get("default_generation_settings")
        n = dgs.get("n_ctx") if isinstance(dgs, dict) else None
        if type(n) is int and 0 < n < 2**31:
            return n
    for m in models if isinstance(models, list) else []:
        meta = m.get("meta") if isinstance(m, dict) else None
        n = meta.get("n_ctx") if isinstance(meta, dict) else None
        if type(n) is int and 0 < n < 2**31:
            return n
    return None


def build_version(props: object) -> str | None:
    if isinstance(props, dict) and isinstance(props.get("build_info"), str):
        return clean_text(props["build_info"])[:60]
    return None


def slots(props: object) -> int | None:
    n = props.get("total_slots") if isinstance(props, dict) else None
    return n if type(n) is int and n > 0 else None


class LlamaCppTokenizer:
    """llama.cpp's own tokenizer through its server: /tokenize, /detokenize, and /apply-template for chat."""

    exact = True
    name = "llama.cpp /tokenize"

    def __init__(self, http: httpx.AsyncClient, secret: str | None = None, where: str = "") -> None:
        self.http = http
        self.secret = secret
        self.where = where  # the server's URL as shown (its credentials masked)

    async def _post(self, path: str, body: JsonObject, key: str) -> object:
        """The answer's `key`, as the server sent it (JSON of any shape: the caller checks it)."""
        r = await self.http.post(path, json=body)
        if r.status_code != 200:
            raise ServescopeError(f"{path} failed (HTTP {r.status_code}): "
                                  f"{clean_secret_text(r.text[:4096], self.secret, 200)}")
        try:
            out = r.json()
        except ValueError:
            out = None
        if not isinstance(out, dict) or key not in out:
            raise ServescopeError(f"{self.where}{path} answered without {key!r}; fix the server or pass "
                                  "--tokenizer PATH")
        return out[key]

    async def _ids(self, text: str, special: bool) -> list[int]:
        tokens = await self._post("/tokenize", {"content": text, "add_special": special}, "tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise ServescopeError("llama.cpp's /tokenize answered something other than token ids; pass "
                                  "--tokenizer PATH")
        return tokens

    async def encode(self, text: str) -> list[int]:
        return await self._ids(text, False)

    async def decode(self, ids: list[int]) -> str:
        text = await self._post("/detokenize", {"tokens": ids}, "content")
        if not isinstance(text, str):
            raise ServescopeError("llama.cpp's /detokenize answered something other than a text")
        return text

    async def count_prompt(self, text: str) -> int:
        return len(await self._ids(text, True))  # as /v1/completions tokenizes a prompt (BOS where the model has one)

    async def count_chat(self, text: str) -> int:
        prompt = await self._post("/apply-template", {"messages": [{"role": "user", "content": text}]}, "prompt")
        if not isinstance(prompt, str):
            raise ServescopeError("llama.cpp's /apply-template answered something other than a text")
        return len(await self._ids(prompt, True))
