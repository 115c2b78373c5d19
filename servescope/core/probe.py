"""The quality probe's HTTP side: greedy generations with their top-k log probabilities, greedy answers, and the
log probability of each token of a text (for perplexity), over a server's /v1/completions.

The caller owns the `httpx.AsyncClient` (its timeout, its `Authorization` header); `base_url` is the server's
root (`http://127.0.0.1:8000`; a trailing `/v1` is dropped) and the paths are added here.

What the servers answer (non-streamed /v1/completions):

    greedy           vLLM (OpenAI legacy):  choices[0].logprobs = {"tokens": [str], "token_logprobs": [float],
                                                "top_logprobs": [{token: logprob}], "text_offset": [int]}
                     llama.cpp (chat-style): choices[0].logprobs = {"content": [{"id", "token", "bytes", "logprob",
                                                "top_logprobs": [{"id", "token", "bytes", "logprob"}]}]}
                     no logprobs (null or absent): ServescopeError, divergence cannot be measured
    prompt_logprobs  vLLM: `"prompt_logprobs": 0, "return_token_ids": true` gives choices[0].prompt_logprobs =
                     [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...], one entry per prompt token (the
                     first has no context), each holding only the prompt's own token (with k > 0 the top-k follow
                     it), and choices[0].prompt_token_ids, which names the token to read at each position.
                     llama.cpp ignores the parameter (no `prompt_logprobs` in its answer): None.

Errors are one ServescopeError line; what a server wrote is cleaned (control characters, the API key) and cut
to 200 characters before it is shown. A prompt longer than the server's context is `ContextTooLong`, so the
caller can split the text (`split_text`) and try again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import httpx

from servescope.core.errors import ServescopeError, error_text
from servescope.core.quality import Trace
from servescope.core.target import _show, key_refused, redact_url, request_failed
from servescope.core.textsafe import clean_secret_text

__all__ = ["ContextTooLong", "answer", "greedy", "prompt_logprobs", "split_text"]

PATH = "/v1/completions"
FLOOR_LOGPROB = -9999.0  # what vLLM writes for a log probability of -inf; non-finite values become this


class ContextTooLong(ServescopeError):
    """The prompt does not fit the server's context (max_model_len, llama.cpp's slot size)."""


# --------------------------------------------------------------------------------------------------------
# requests
# --------------------------------------------------------------------------------------------------------


def _root(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _secret(client: httpx.AsyncClient) -> str | None:
    """The API key the caller put on the client (masked in anything the server echoes back)."""
    auth = client.headers.get("authorization", "")
    m = re.match(r"(?i)bearer\s+(\S+)", auth)
    return m.group(1) if m else (auth or None)


def _server_message(r: httpx.Response, secret: str | None) -> str:
    """The error message a server wrote: {"error": {"message"}} (vLLM, llama.cpp, OpenAI), {"error": "..."},
    {"detail": ...} (FastAPI), {"message": ...}, else the body's text; cleaned and cut to 200 characters."""
    text = r.text[:4096]
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = err["message"]
        elif isinstance(err, str):
            text = err
        elif isinstance(body.get("detail"), str):
            text = body["detail"]
        elif isinstance(body.get("message"), str):
            text = body["message"]
    return clean_secret_text(text[:4096], secret, 200) or "(no message)"


def _too_long(r: httpx.Response) -> bool:
    """vLLM: "This model's maximum context length is N tokens..." (param input_tokens); llama.cpp: type
    exceed_context_size_error ("request (N tokens) exceeds the available context size")."""
    text = r.text[:4096].lower()
    return r.status_code in (400, 413, 422) and ("maximum context length" in text or "exceed_context_size" in text
                                                  or "exceeds the available context size" in text)


async def _post(client: httpx.AsyncClient, base_url: str, body: Mapping[str, object],
                unsupported: tuple[str, ...] = ()) -> dict[str, object] | None:
    """POST `body` to /v1/completions and return the answer's first choice (as the server sent it: its entries
    are checked where read). A 4xx whose message names one of `unsupported` (a parameter the server rejects)
    returns None."""
    root = _root(base_url)
    where = redact_url(root) + PATH
    secret = _secret(client)
    for attempt in (1, 2):
        try:
            r = await client.post(root + PATH, json={**body, "stream": False})
            break
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
            # the connection went before any answer (a pooled one the server had just closed): once more, on a
            # new one; a probe is a plain completion, safe to ask again
            if attempt == 2:
                raise request_failed(where, e, clean_secret_text(error_text(e), secret, 200),
                                     "") from None
        except httpx.HTTPError as e:
            raise request_failed(where, e, clean_secret_text(str(e), secret, 200),
                                 "did not answer in time; check the server, or give it a longer timeout") from None
    if r.status_code in (401, 403):
        raise key_refused(where, r.status_code)
    if r.status_code >= 400:
        msg = _server_message(r, secret)
        if 400 <= r.status_code < 500 and any(p in r.text[:4096] for p in unsupported):
            return None
        if _too_long(r):
            raise ContextTooLong(f"the prompt does not fit the server's context ({where}, HTTP {r.status_code}: "
                                 f"{msg}); split the text or serve a longer context")
        raise ServescopeError(f"{where} failed (HTTP {r.status_code}): {msg}")
    try:
        out = r.json()
    except ValueError:
        raise ServescopeError(f"{where} answered {_show(r.text[:60], secret)} where a JSON completion belongs; "
                              "is it an OpenAI-compatible server? check --url") from None
    choices = out.get("choices") if isinstance(out, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServescopeError(f"{where} answered {_show(out, secret)} where a completion with choices belongs; "
                              "is it an OpenAI-compatible server? check --url")
    first: dict[str, object] = choices[0]
    return first


def _garbage(base_url: str, what: str, value: object, secret: str | None) -> ServescopeError:
    return ServescopeError(f"{redact_url(_root(base_url))}{PATH} answered {_show(value, secret)} where {what} "
                           "belongs; check the server")


def _text(choice: Mapping[str, object], base_url: str, secret: str | None) -> str:
    text = choice.get("text")
    if not isinstance(text, str):
        raise _garbage(base_url, "the completion's text", text, secret)
    return text


def _logprob(v: object) -> float | None:
    """A log probability as a float (-inf and other non-finite values as FLOOR_LOGPROB); None if not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else FLOOR_LOGPROB


# --------------------------------------------------------------------------------------------------------
# the three requests
# --------------------------------------------------------------------------------------------------------


async def greedy(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int,
                 top_k: int = 5) -> tuple[str, Trace]:
    """The greedy (temperature 0) completion of `prompt` and its `Trace`: the generated tokens and, at each
    position, the top-`top_k` {token: logprob} map (the chosen token always in it). A server that returns no
    logprobs raises ServescopeError."""
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": top_k}
    choice = await _post(client, base_url, body)
    assert choice is not None
    secret = _secret(client)
    text = _text(choice, base_url, secret)
    lp = choice.get("logprobs")
    if lp is None:
        raise ServescopeError(f"{redact_url(_root(base_url))} does not return logprobs on {PATH}, so the divergence "
                              "from a reference cannot be measured")
    tokens, top = _parse_logprobs(lp, base_url, secret)
    return text, Trace(prompt=prompt, tokens=tokens, top=top)


def _parse_logprobs(lp: object, base_url: str, secret: str | None) -> tuple[list[str], list[dict[str, float]]]:
    """The tokens and top-k maps of a choice's `logprobs`, in either format (see the module's docstring)."""
    if isinstance(lp, dict) and isinstance(lp.get("tokens"), list):  # vLLM, OpenAI legacy completions
        tokens, chosen, tops = lp["tokens"], lp.get("token_logprobs"), lp.get("top_logprobs")
        if (not all(isinstance(t, str) for t in tokens) or not isinstance(chosen, list) or not isinstance(tops, list)
                or len(chosen) != len(tokens) or len(tops) != len(tokens)):
            raise _garbage(base_url, "logprobs with tokens, token_logprobs and top_logprobs of one length", lp, secret)
        top: list[dict[str, float]] = []
        for tok, c, t in zip(tokens, chosen, tops, strict=True):
            if t is not None and not isinstance(t, dict):
                raise _garbage(base_url, "a {token: logprob} map", t, secret)
            m = _top_map((k, v) for k, v in (t or {}).items())
            _with_chosen(m, tok, _logprob(c))
            top.append(m)
        return list(tokens), top
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):  # llama.cpp, OpenAI chat-style
        tokens = []
        top = []
        for e in lp["content"]:
            if not isinstance(e, dict) or not isinstance(e.get("token"), str):
                raise _garbage(base_url, "a {token, logprob, top_logprobs} entry", e, secret)
            entries = e.get("top_logprobs") or []
            if not isinstance(entries, list) or not all(isinstance(x, dict) for x in entries):
                raise _garbage(base_url, "a list of {token, logprob}", entries, secret)
            m = _top_map((x.get("token"), x.get("logprob")) for x in entries)
            _with_chosen(m, e["token"], _logprob(e.get("logprob")))
            tokens.append(e["token"])
            top.append(m)
        return tokens, top
    raise _garbage(base_url, "logprobs (tokens/token_logprobs/top_logprobs or content)", lp, secret)


def _top_map(pairs: Iterable[tuple[object, object]]) -> dict[str, float]:
    """{token: logprob} from (token, logprob) pairs; two ids that decode to one text keep the larger value."""
    out: dict[str, float] = {}
    for tok, v in pairs:
        f = _logprob(v)
        if isinstance(tok, str) and f is not None and (tok not in out or f > out[tok]):
            out[tok] = f
    return out


def _with_chosen(m: dict[str, float], token: str, logprob: float | None) -> None:
    if logprob is not None and token not in m:
        m[token] = logprob


async def answer(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, max_tokens: int) -> str:
    """The greedy (temperature 0) completion of `prompt`, text only."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    choice = await _post(client, base_url, body)
    assert choice is not None
    return _text(choice, base_url, _secret(client))


async def prompt_logprobs(client: httpx.AsyncClient, base_url: str, model: str, text: str) -> list[float] | None:
    """log p(x_i | x_<i) for each token of `text` after the first (natural log), as the server tokenizes it; None
    when the server has no prompt_logprobs (it ignores the parameter, as llama.cpp does, or rejects it)."""
    body = {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0,
            "return_token_ids": True}
    choice = await _post(client, base_url, body, unsupported=("prompt_logprobs", "return_token_ids"))
    if choice is None or choice.get("prompt_logprobs") is None:
        return None
    secret = _secret(client)
    plp = choice["prompt_logprobs"]
    ids = choice.get("prompt_token_ids")
    if not isinstance(plp, list) or not plp:
        raise _garbage(base_url, "prompt_logprobs (a list, null first)", plp, secret)
    if ids is not None and (not isinstance(ids, list) or len(ids) != len(plp)):
        raise _garbage(base_url, f"prompt_token_ids for the {len(plp)} prompt_logprobs", ids, secret)
    id_list = ids if isinstance(ids, list) else None
    out: list[float] = []
    for i, pos in enumerate(plp):
        if pos is None and i == 0:
            continue
        if not isinstance(pos, dict) or not pos:
            raise _garbage(base_url, "a {token_id: {logprob, rank}} map", pos, secret)
        if id_list is not None:
            entry = pos.get(str(id_list[i]))
        elif len(pos) == 1:  # with prompt_logprobs 0 the map holds the prompt's token alone
            entry = next(iter(pos.values()))
        else:
            raise _garbage(base_url, "prompt_token_ids (to tell the prompt's token from the top-k)", None, secret)
        v = _logprob(entry.get("logprob")) if isinstance(entry, dict) else None
        if v is None:
            raise _garbage(base_url, f"the log probability of prompt token {i}", pos, secret)
        out.append(v)
    return out


# --------------------------------------------------------------------------------------------------------
# long texts
# --------------------------------------------------------------------------------------------------------

# each level splits a text into pieces that end at its boundary (the separator kept with the piece before it)
_LEVELS = (
    re.compile(r"[\s\S]*?(?:\n[ \t]*\n\s*|\Z)"),  # paragraphs: a blank line
    re.compile(r"[\s\S]*?(?:[.!?\u3002\uff01\uff1f]+[\"'\u201d\u2019)\]]*\s+|\n\s*|\Z)"),  # sentences (or lines)
    re.compile(r"\S*\s*"),  # words
)


def split_text(text: str, max_chars: int) -> list[str]:
    """`text` cut into pieces of at most `max_chars` characters, at paragraph boundaries where it can, else at
    sentence ends, else between words, else anywhere. The pieces, joined, give `text` back, less any piece that
    is only whitespace (dropped: there is nothing in it to score)."""
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    return [p for p in _split(text, max_chars, 0) if p.strip()]


def _split(text: str, max_chars: int, level: int) -> list[str]:
    if len(text) <= max_chars:
        return [text]
    if level >= len(_LEVELS):
        return [text[i:i + max_chars] for i in range(0, len(text), max_chars)]
    out: list[str] = []
    cur = ""
    for piece in (m.group(0) for m in _LEVELS[level].finditer(text)):
        if not piece:
            continue
        if len(cur) + len(piece) <= max_chars:
            cur += piece
            continue
        if cur:
            out.append(cur)
            cur = ""
        if len(piece) <= max_chars:
            cur = piece
        else:
            out.extend(_split(piece, max_chars, level + 1))
    if cur:
        out.append(cur)
    return out
