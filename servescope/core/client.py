"""Streaming OpenAI-compatible client.

One pooled client per cell (core/rawhttp.py's by default, aiohttp and httpx selectable) with as many keep-alive
connections as the cell has users (httpx and aiohttp both cap pools at 100 by default: ours are sized to the load), SSE
parsed incrementally and chunks decoded with msgspec, every token-carrying chunk stamped with
perf_counter_ns() as its bytes arrive.
Nothing here raises for a failed request: it ends up in the RequestRecord. Everything a server sends is data:
its token counts are checked (implausible ones make the record `bad_usage`), its text is cleaned, and the API
key is masked in any error text before it is stored.
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
import sys
import time
from collections.abc import AsyncIterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import httpx
import msgspec

from servescope.core import tokenstream
from servescope.core.errors import error_text
from servescope.core.rawhttp import RawClient, RawHTTPError, StaleConnection
from servescope.core.records import RETRY_STATUS, RequestRecord
from servescope.core.textsafe import clean_secret_text, clean_text
from servescope.core.tls import CONNECTIONS, ConnSample, TlsSettings
from servescope.core.tls import ssl_context as tls_context
from servescope.core.tokenstream import ERROR_BODY_LIMIT, _binary, _decompressed, _Stream, usage_bound

if TYPE_CHECKING:
    import aiohttp

    # the transports' clients (`make_http_client`): core/rawhttp.py's (the default), aiohttp's or httpx's
    HttpClient: TypeAlias = RawClient | aiohttp.ClientSession | httpx.AsyncClient

_perf = time.perf_counter_ns
# the per-token path's names (core/tokenstream.py), importable from here as before
USAGE_BOUND = tokenstream.USAGE_BOUND
reads = tokenstream.reads
_decode_chunk = tokenstream._decode_chunk
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send. `prompt` is the text for completions, or chat's one user message; `messages` (chat only),
    when set, is sent instead of that one message (a conversation's history and its new message).

    A turn of a conversation (core/conversation.py) says which (`conversation`, from 0 in the cell's pool), its
    place in it (`turn`, from 1) and the pause before it is sent (`think_s`, after the previous reply); its
    `prompt` is the new user message and `input_tokens` that message's own count."""

    api: str  # "completions" | "chat"
    prompt: str
    input_tokens: int
    output_tokens: int
    thinking: bool | None = None
    messages: tuple[dict[str, str], ...] | None = None
    conversation: int = -1  # -1: a single-turn request
    turn: int = 0
    think_s: float = 0.0
    model: str | None = None  # a LoRA adapter to name as the model (None: the sweep's model)
    temperature: float | None = None  # the workload's sampling temperature (None: the server's default)
    # speculative decoding: how predictable the workload's text is (the acceptance of drafted tokens), sent as
    # vllm_xargs.spec_acceptance, which the simulator models and vLLM passes on unused (None: not sent)
    spec_acceptance: float | None = None


@dataclass(slots=True)
class ClientOptions:
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0
    ignore_eos: bool = True
    continuous_usage: bool = True
    extra_body: dict[str, object] | None = None  # JSON merged into every request's body, as the user gave it
    transport: str = "raw"  # or "aiohttp", "httpx"
    max_model_len: int | None = None  # bounds the token counts a server's usage may plausibly say
    tls: TlsSettings | None = None  # --ca-cert / --insecure (core/tls.py); None: this process's setting
    # --retry-after: a 429 is sent again after its Retry-After, waiting at most this long (s) each time (core/load.py);
    # None: a 429 is recorded as `rate_limited` and never sent again (that would change the load's schedule)
    retry_after_max_s: float | None = None
    # why the server refused `ignore_eos` (its 400's text), once it did: the field is then dropped (ignore_eos False)
    ignore_eos_refused: str = ""


def build_body(spec: RequestSpec, opts: ClientOptions) -> bytes:
    stream_options = {"include_usage": True}
    if opts.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body: dict[str, object] = {
        "model": spec.model or opts.model,
        "stream": True,
        "max_tokens": spec.output_tokens,
        "stream_options": stream_options,
    }
    if opts.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.output_tokens
    if spec.api == "chat":
        body["messages"] = spec.messages if spec.messages is not None else [{"role": "user", "content": spec.prompt}]
        if spec.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": spec.thinking}
    else:
        body["prompt"] = spec.prompt
    if spec.temperature is not None:
        body["temperature"] = spec.temperature
    if spec.spec_acceptance is not None:
        body["vllm_xargs"] = {"spec_acceptance": spec.spec_acceptance}
    if opts.extra_body:
        body.update(opts.extra_body)
    return _encode(body)


BODIES_BUDGET = 64 * 2**20  # bytes of request bodies a cell encodes before it starts; later ones at their send


class Bodies:
    """Request bodies encoded before a cell starts (one per distinct request spec, up to `budget` bytes: a long
    trace's are encoded as they go), so that a send does no JSON encoding: `body(spec)` is the prepared one while
    `opts` still has the settings it was encoded with (a server that refused `ignore_eos` or continuous usage makes
    the rest be encoded afresh without them)."""

    __slots__ = ("opts", "flags", "by_id", "specs")

    def __init__(self, specs: Sequence[RequestSpec], opts: ClientOptions, budget: int = BODIES_BUDGET) -> None:
        self.opts = opts
        self.flags = (opts.ignore_eos, opts.continuous_usage)
        self.by_id: dict[int, bytes] = {}
        self.specs: list[RequestSpec] = []  # held: the ids above stay theirs
        size = 0
        for s in specs:
            if id(s) in self.by_id:
                continue
            if size >= budget:
                break
            body = self.by_id[id(s)] = build_body(s, opts)
            self.specs.append(s)
            size += len(body)

    def body(self, spec: RequestSpec) -> bytes:
        opts = self.opts
        if (opts.ignore_eos, opts.continuous_usage) == self.flags:
            got = self.by_id.get(id(spec))
            if got is not None:
                return got
        return build_body(spec, opts)


def endpoint(api: str) -> str:
    return "v1/chat/completions" if api == "chat" else "v1/completions"


def ssl_context(settings: TlsSettings | None = None) -> ssl.SSLContext:
    """The SSL context every client shares (one per TLS setting, core/tls.py: --ca-cert, --insecure, else the
    system's CAs): building one loads the CA bundle (~0.1 s of CPU), too much to pay per health check."""
    return tls_context(settings)


def async_client(*, base_url: str = "", headers: Mapping[str, str] | None = None,
                 timeout: float | httpx.Timeout = 5.0, limits: httpx.Limits | None = None,
                 http2: bool = False, tls: TlsSettings | None = None) -> httpx.AsyncClient:
    """An httpx.AsyncClient sharing the one SSL context (`tls`'s, else this process's setting), ignoring proxy
    variables (targets are direct), closing idle connections before the server does (`KEEPALIVE_S`, unless
    `limits` say otherwise). A plain-HTTP base URL loads no CA bundle at all. `timeout`: httpx's default (5 s)
    unless given."""
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, http2=http2, trust_env=False,
                             verify=False if base_url.startswith("http://") else ssl_context(tls),
                             limits=limits or httpx.Limits(keepalive_expiry=KEEPALIVE_S))


async def _log_aiohttp_connection(session: object, ctx: object, params: object) -> None:
    """aiohttp's trace: a connection made (TCP and TLS handshake together: aiohttp times them as one)."""
    t0 = getattr(ctx, "servescope_t0", None)
    if t0 is not None:
        CONNECTIONS.add(ConnSample((_perf() - t0) / 1e6))


async def _start_aiohttp_connection(session: object, ctx: object, params: object) -> None:
    ctx.servescope_t0 = _perf()  # type: ignore[attr-defined]  # aiohttp's trace context takes attributes


async def _trace_httpx(request: httpx.Request) -> None:
    """httpx's request hook: time the connection the request opens, if it opens one (TCP, TLS apart)."""
    stamps: dict[str, int] = {}

    async def trace(event: str, info: Mapping[str, object]) -> None:
        if event.startswith("connection.") and event.endswith((".started", ".complete")):
            stamps[event] = _perf()
            tcp0, tcp1 = stamps.get("connection.connect_tcp.started"), stamps.get("connection.connect_tcp.complete")
            if tcp0 is None or tcp1 is None:
                return
            if event == "connection.connect_tcp.complete" and request.url.scheme == "http":
                CONNECTIONS.add(ConnSample((tcp1 - tcp0) / 1e6))
            elif event == "connection.start_tls.complete":
                t0 = stamps.get("connection.start_tls.started", tcp1)
                CONNECTIONS.add(ConnSample((tcp1 - tcp0) / 1e6, (stamps[event] - t0) / 1e6))

    request.extensions["trace"] = trace



# an idle pooled connection is closed by us before the server closes it: llama.cpp's server and uvicorn (vLLM)
# drop idle keep-alive connections after 5 s, and a request written into one the server just closed fails
# ("Can not write request body") instead of being measured
KEEPALIVE_S = 4.0


def _headers(opts: ClientOptions) -> dict[str, str]:
    """The load's request headers, for every transport."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    return headers


def make_http_client(opts: ClientOptions, connections: int, transport: str | None = None) -> HttpClient:
    """A pooled HTTP client holding up to `connections` keep-alive streams (one per user).

    `raw` (core/rawhttp.py) is the default: it handles each read in the protocol's callback, without waking a
    coroutine per piece, and streamed with less CPU per token than aiohttp, which streamed with 4-6x less than
    httpx (benchmarks/client_transport.py). aiohttp and httpx stay selectable (`--transport`)."""
    if (transport or opts.transport) == "raw":
        headers = _headers(opts)
        return RawClient(opts.base_url, headers, max(1, connections), KEEPALIVE_S,
                         ssl_context=functools.partial(ssl_context, opts.tls))
    if (transport or opts.transport) == "aiohttp":
        import aiohttp  # only when chosen: its import and SSL contexts cost ~0.2 s of start-up

        headers = _headers(opts)
        n = max(1, connections)
        conn = aiohttp.TCPConnector(limit=n, limit_per_host=n, keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=300,
                                    ssl=ssl_context(opts.tls) if opts.base_url.startswith("https") else False)
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_start.append(_start_aiohttp_connection)
        trace.on_connection_create_end.append(_log_aiohttp_connection)
        return aiohttp.ClientSession(base_url=opts.base_url.rstrip("/") + "/", connector=conn, headers=headers,
                                     trace_configs=[trace],
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
                                     trust_env=False)
    return _make_httpx_client(opts, connections)


def _make_httpx_client(opts: ClientOptions, connections: int) -> httpx.AsyncClient:
    headers = _headers(opts)
    n = max(1, connections)
    client = async_client(
        base_url=opts.base_url,
        headers=headers,
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=KEEPALIVE_S),
        timeout=httpx.Timeout(opts.timeout_s, connect=15.0),
        http2=False,
        tls=opts.tls,
    )
    client.event_hooks = {"request": [_trace_httpx], "response": []}  # the connections it opens, timed
    return client


STALE_RETRIES = 2  # sends of one request into pooled connections the server had closed, before it is an error


def _stale_connection(e: BaseException) -> bool:
    """The server closed a pooled keep-alive connection as the request was written into it (no response at
    all): aiohttp's "Can not write request body" / ServerDisconnected, httpx's "Server disconnected without
    sending a response"."""
    if isinstance(e, StaleConnection):
        return True
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(e, aiohttp.ServerDisconnectedError):
        return True
    if aiohttp is not None and isinstance(e, aiohttp.ClientOSError):
        return "write request body" in str(e) or getattr(e, "errno", None) in (32, 104)
    if isinstance(e, httpx.RemoteProtocolError):
        return "without sending a response" in str(e)
    return isinstance(e, (httpx.WriteError, httpx.ReadError)) and not str(e).strip()


def _request_errors() -> tuple[type[BaseException], ...]:
    """The transports' request errors; aiohttp's once it is in use (imported only for `--transport aiohttp`)."""
    aiohttp = sys.modules.get("aiohttp")
    base: tuple[type[BaseException], ...] = (httpx.HTTPError, RawHTTPError)
    return (*base, aiohttp.ClientError) if aiohttp is not None else base


def _rejects_usage_stats(error: str) -> bool:
    e = error.lower()
    return "continuous_usage_stats" in e or "stream_options" in e


def _rejects_ignore_eos(error: str) -> bool:
    """A 400/422 that names the fields `ignore_eos` sends (vLLM's extensions an OpenAI API does not know)."""
    e = error.lower()
    return "ignore_eos" in e or "min_tokens" in e


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's wait in seconds: delta-seconds ("20", "1.5") or an HTTP date; None when absent or
    unreadable. Never negative (a date in the past is 0)."""
    if not value:
        return None
    v = value.strip()
    try:
        f = float(v)
    except ValueError:
        import email.utils

        try:
            when = email.utils.parsedate_to_datetime(v)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        f = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, f) if f == f and f != float("inf") else None


# a wait named in a 429's text: "Please try again in 20s", "retry after 350ms", "try again in 1.5 seconds"
_RETRY_HINT = re.compile(r"(?:try again|retry)(?: (?:in|after))? (\d+(?:\.\d+)?)\s*(ms\b|milliseconds?|s\b|secs?\b|"
                         r"seconds?|m\b|min\b|minutes?)?", re.IGNORECASE)


def retry_hint_s(text: str) -> float | None:
    """The wait a 429's error text names ("Please try again in 20s", "retry after 350ms"), for a server whose
    Retry-After header the transport did not keep; None when it names none."""
    m = _RETRY_HINT.search(text)
    if m is None:
        return None
    n, unit = float(m.group(1)), (m.group(2) or "s").lower()
    return n / 1000 if unit.startswith("ms") or unit.startswith("milli") else n * 60 if unit.startswith("m") else n


def _copy_into(dst: RequestRecord, src: RequestRecord) -> RequestRecord:
    for name in RequestRecord.__slots__:
        setattr(dst, name, getattr(src, name))
    return dst



def body_text(raw: bytes, encoding: str = "", content_type: str = "") -> str:
    """A response body as text to show in an error: undone from its Content-Encoding and decoded as UTF-8; a body
    that is still not text (an image, a compression servescope cannot undo, random bytes) is described by its
    size, type and encoding, never shown as bytes."""
    data = _decompressed(raw, encoding)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _binary(text):
        return text
    what = ", ".join(x for x in (f"Content-Type {clean_text(content_type)[:60]}" if content_type else "",
                                 f"Content-Encoding {clean_text(encoding)[:30]}" if encoding else "") if x)
    return f"a binary body of {len(raw):,} bytes{f' ({what})' if what else ''}, not text"


def _error_text(raw: bytes, secret: str | None = None, encoding: str = "", content_type: str = "") -> str:
    raw = _decompressed(raw, encoding)
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return clean_secret_text(body_text(raw, "", content_type) if raw else "", secret)
    msg: object = obj
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("message", obj.get("detail", obj)))
        msg = err.get("message", err) if isinstance(err, dict) else err
    return clean_secret_text(str(msg), secret)


async def _read_capped(chunks: AsyncIterable[bytes], limit: int = ERROR_BODY_LIMIT) -> bytes:
    """The first `limit` bytes of a body (a hostile server's error body can be endless)."""
    out = bytearray()
    async for piece in chunks:
        out += piece
        if len(out) >= limit:
            break
    return bytes(out[:limit])


def _hint(text: str) -> str:
    if "Too many open files" in text:
        return text + " (the client ran out of open files: lower --concurrency or raise `ulimit -n`)"
    return text


async def stream_request(
    http: HttpClient,
    opts: ClientOptions,
    spec: RequestSpec,
    rec: RequestRecord,
    reply: list[str] | None = None,
    _retries: int = 0,
    bodies: Bodies | None = None,
) -> RequestRecord:
    """Send one streaming request and fill `rec` in place. Never raises (except CancelledError).
    `http` is one of `make_http_client`'s: core/rawhttp.py's RawClient (the default), an aiohttp.ClientSession
    or an httpx.AsyncClient. With `reply` (a list),
    the reply's content text is appended to it piece by piece (a conversation resends it next turn). `bodies`: the
    cell's prepared request bodies (else the body is encoded here)."""
    body = bodies.body(spec) if bodies is not None else build_body(spec, opts)
    sent_eos, sent_usage = opts.ignore_eos, opts.continuous_usage  # what this body carries (another request may
    # drop a field from `opts` while this one is in flight: its 400 is then sent again all the same)
    secret = opts.api_key
    st = _Stream(rec, usage_bound(opts.max_model_len), secret, reply)
    status = 0
    ctype = ""
    raw_error = b""
    retry_after = ""  # the response's Retry-After header (a 429's)
    encoding = ""  # its Content-Encoding (the raw transport leaves a body as sent; httpx and aiohttp undo it)
    try:
        async with asyncio.timeout(opts.timeout_s):
            if isinstance(http, RawClient):
                rec.sent_ns = _perf()
                heads: dict[str, str] = {}
                status, ctype, raw_error = await http.post_stream(endpoint(spec.api), body, st, ERROR_BODY_LIMIT,
                                                                  heads, fresh=_retries > 0)
                rec.http_status = status
                retry_after = heads.get("retry-after", "")
                encoding = heads.get("content-encoding", "")
            elif isinstance(http, httpx.AsyncClient):
                rec.sent_ns = _perf()
                async with http.stream("POST", endpoint(spec.api), content=body) as resp:
                    status = rec.http_status = resp.status_code
                    ctype = resp.headers.get("content-type", "")
                    retry_after = resp.headers.get("retry-after", "")
                    if status != 200:
                        raw_error = await _read_capped(resp.aiter_bytes())
                    else:
                        async for piece in resp.aiter_raw():
                            st.feed(piece, _perf())
                            if st.overflow:
                                break
            else:
                rec.sent_ns = _perf()
                async with http.post(endpoint(spec.api), data=body) as resp:
                    status = rec.http_status = resp.status
                    ctype = resp.headers.get("Content-Type", "")
                    retry_after = resp.headers.get("Retry-After", "")
                    if status != 200:
                        raw_error = await _read_capped(resp.content.iter_any())
                    else:
                        async for piece in resp.content.iter_any():
                            st.feed(piece, _perf())
                            if st.overflow:
                                break
            rec.end_ns = _perf()
            st.close(rec.end_ns)
            if status == RETRY_STATUS:  # a rate limit: the server's policy, not a failure (core/records.py)
                rec.status = "rate_limited"
                rec.error = f"HTTP {status}: {_error_text(raw_error, secret, encoding, ctype)}"
                rec.retry_after_s = retry_after_s(retry_after)
                if rec.retry_after_s is None:
                    rec.retry_after_s = retry_hint_s(rec.error)
                return rec
            if status != 200:
                rec.status = "error"
                rec.error = f"HTTP {status}: {_error_text(raw_error, secret, encoding, ctype)}"
                if status in (400, 422) and sent_eos and _rejects_ignore_eos(rec.error):
                    # a server (an OpenAI API) that refuses vLLM's ignore_eos/min_tokens: drop them and send again
                    opts.ignore_eos = False
                    opts.ignore_eos_refused = opts.ignore_eos_refused or rec.error
                    fresh = RequestRecord(rec.index, rec.user, rec.warmup, rec.input_tokens_requested,
                                          rec.output_tokens_requested, rec.scheduled_ns,
                                          conversation=rec.conversation, turn=rec.turn, turns=rec.turns)
                    return _copy_into(rec, await stream_request(http, opts, spec, fresh, reply))
                if status in (400, 422) and sent_usage and _rejects_usage_stats(rec.error):
                    # a server that does not know continuous_usage_stats: drop it and send again
                    opts.continuous_usage = False
                    fresh = RequestRecord(rec.index, rec.user, rec.warmup, rec.input_tokens_requested,
                                          rec.output_tokens_requested, rec.scheduled_ns,
                                          conversation=rec.conversation, turn=rec.turn, turns=rec.turns)
                    return _copy_into(rec, await stream_request(http, opts, spec, fresh, reply))
                return rec
    except TimeoutError:
        rec.end_ns = _perf()
        rec.status = "timeout"
        rec.error = f"no complete response within {opts.timeout_s:g} s (raise --timeout)"
    except _request_errors() as e:
        rec.end_ns = _perf()
        if not status and not rec.chunk_ns and _stale_connection(e) and _retries < STALE_RETRIES:
            # written into a pooled connection the server had just closed: it never saw the request. Send it
            # again (a fresh connection); its time waiting for that shows as client queueing, not as TTFT
            fresh = RequestRecord(rec.index, rec.user, rec.warmup, rec.input_tokens_requested,
                                  rec.output_tokens_requested, rec.scheduled_ns,
                                  conversation=rec.conversation, turn=rec.turn, turns=rec.turns)
            return _copy_into(rec, await stream_request(http, opts, spec, fresh, reply, _retries + 1, bodies))
        rec.status = "cut" if rec.chunk_ns else "error"
        rec.error = clean_secret_text(_hint(error_text(e)), secret)
    except OSError as e:
        rec.end_ns = _perf()
        rec.status = "error"
        rec.error = clean_secret_text(_hint(error_text(e)), secret)
    st.finish(status, ctype)
    return rec
