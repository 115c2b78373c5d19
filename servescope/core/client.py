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
import json
import re
import ssl
import sys
import time
import zlib
from collections.abc import AsyncIterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import httpx
import msgspec

from servescope.core.errors import error_text
from servescope.core.rawhttp import RawClient, RawHTTPError, StaleConnection
from servescope.core.records import RETRY_STATUS, RequestRecord
from servescope.core.sse import SSEParser
from servescope.core.textsafe import clean_secret_text, clean_text
from servescope.core.tls import CONNECTIONS, ConnSample, TlsSettings
from servescope.core.tls import ssl_context as tls_context

if TYPE_CHECKING:
    import aiohttp

    # the transports' clients (`make_http_client`): core/rawhttp.py's (the default), aiohttp's or httpx's
    HttpClient: TypeAlias = RawClient | aiohttp.ClientSession | httpx.AsyncClient

# a usage's (prompt, completion, reasoning, cached) token counts, None where the server left one out
Counts: TypeAlias = tuple[int | None, int | None, int | None, int | None]

_perf = time.perf_counter_ns


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # newer vLLM / some servers name it so


class _Choice(msgspec.Struct, gc=False):
    text: str | None = None
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_tokens_details: _Details | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Timings(msgspec.Struct, gc=False):
    prompt_ms: float | None = None  # llama.cpp: the server's own prompt (prefill) time for this request


class _ErrorBody(msgspec.Struct, gc=False):
    message: str | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _ErrorBody | str | None = None
    timings: _Timings | None = None


# gc=False: a decoded chunk holds no cycles, so the garbage collector need not track (and walk) every one
_decode_chunk = msgspec.json.Decoder(_Chunk).decode
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


_GZIP = b"\x1f\x8b"


def _decompressed(raw: bytes, encoding: str) -> bytes:
    """`raw` undone from its Content-Encoding (gzip, deflate; a gzip body is known by its first bytes too), at most
    ERROR_BODY_LIMIT bytes of it (a small body can unpack to gigabytes); `raw` itself when it is not compressed,
    or not as it says."""
    enc = encoding.strip().lower()
    waves: tuple[int, ...]
    if enc in ("gzip", "x-gzip") or raw[:2] == _GZIP:
        waves = (16 + zlib.MAX_WBITS,)
    elif enc == "deflate":
        waves = (zlib.MAX_WBITS, -zlib.MAX_WBITS)  # zlib-wrapped, as the standard says, or raw as some servers send
    else:
        return raw
    for wbits in waves:
        try:
            return zlib.decompressobj(wbits).decompress(raw, ERROR_BODY_LIMIT)
        except zlib.error:
            continue
    return raw


def _binary(text: str) -> bool:
    """Text that is not meant to be read: a NUL, or more than a tenth control characters (tab and line ends
    apart)."""
    if "\x00" in text:
        return True
    ctrl = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\r\n" or 0x7F <= ord(ch) < 0xA0)
    return ctrl * 10 > len(text)


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


USAGE_BOUND = 10_000_000  # the most tokens a count may say when the model's max length is unknown
MAX_COUNT = 2**31 - 1  # and never more than this, whatever the server says its max length is
ERROR_BODY_LIMIT = 65536  # bytes of a failed response's body read for its error text
_HEAD = 256  # bytes of a 200 body kept to say what it was when it is not an event stream
MAX_LINE = 8 * 1024 * 1024  # an unfinished SSE line longer than this ends the request (memory, quadratic joins)
_reads = 0  # pieces of response bodies received by this process, ever (see `reads()`)


def reads() -> int:
    """How many pieces of streamed response bodies this process has received so far: a count that moves while
    a server is streaming, for the watchdog (a busy server can be slow to answer a health check and still be
    serving every request)."""
    return _reads


def usage_bound(max_model_len: int | None) -> int:
    """The largest plausible token count in a server's `usage`: the model's max length when it is known."""
    if isinstance(max_model_len, int) and not isinstance(max_model_len, bool) and max_model_len > 0:
        return min(max_model_len, MAX_COUNT)
    return USAGE_BOUND


def _show(v: object) -> str:
    """A raw value from a server, for an error text (short; a huge integer is not spelled out)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {len(str(v)) if v.bit_length() < 4000 else 'thousands of'} digits"
    if isinstance(v, float):
        return repr(v)  # nan and inf as such (JSON would say null)
    try:
        text = msgspec.json.encode(v).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _text(v: object) -> bool:
    return isinstance(v, str) and v != ""


def _loose_flags(choices: object) -> tuple[bool, bool]:
    """(content, reasoning) of a chunk decoded leniently (any JSON)."""
    has_content = has_reasoning = False
    if isinstance(choices, list):
        for c in choices:
            if not isinstance(c, dict):
                continue
            d = c.get("delta")
            if isinstance(d, dict):
                if _text(d.get("content")):
                    has_content = True
                if _text(d.get("reasoning_content")) or _text(d.get("reasoning")):
                    has_reasoning = True
            elif _text(c.get("text")):
                has_content = True
    return has_content, has_reasoning


def _loose_texts(choices: object) -> list[str]:
    """The content texts of a chunk decoded leniently (any JSON)."""
    out: list[str] = []
    for c in choices if isinstance(choices, list) else ():
        if isinstance(c, dict):
            d = c.get("delta")
            v = d.get("content") if isinstance(d, dict) else c.get("text")
            if isinstance(v, str) and v:
                out.append(v)
    return out


class _Stream:
    """Turns the bytes of one response into the record's stamps and counts. Transport-independent.

    Counts from the server are data: a `usage` whose counts are not integers from 0 to `bound` marks the
    record `bad_usage` (the raw value in its error) and is ignored from then on, while the chunks' content
    and timing are still measured (a chunk that msgspec's typed decoder refuses is decoded again leniently)."""

    __slots__ = ("rec", "parser", "last_completion", "counted", "reasoning_counted", "done", "done_ns", "after_done",
                 "bound", "secret", "bad", "events", "head", "heading", "overflow", "reply")

    def __init__(self, rec: RequestRecord, bound: int = USAGE_BOUND, secret: str | None = None,
                 reply: list[str] | None = None) -> None:
        self.rec = rec
        self.parser = SSEParser()
        self.last_completion = 0
        self.counted = 0
        self.reasoning_counted = 0
        self.done = False
        self.done_ns = 0  # when [DONE] arrived
        self.after_done = 0  # events the server sent after [DONE]: never counted, and the stream is not read further
        self.bound = bound
        self.secret = secret
        self.bad = False  # usage was not plausible: ignore it from then on
        self.events = 0  # data lines seen
        self.head = b""  # the body's first bytes
        self.heading = True  # len(head) < _HEAD: the reads go through `feed` until the head is kept
        self.overflow = False  # the server sent a line too long to hold: stop reading
        self.reply = reply  # when a list: the reply's content pieces are appended to it (a conversation's history)

    def feed(self, piece: bytes, now: int) -> None:
        global _reads
        _reads += 1
        if self.heading:
            self.head += piece[: _HEAD - len(self.head)]
            self.heading = len(self.head) < _HEAD
        for data in self.parser.feed(piece):
            self._event(data, now)
        if self.parser.pending > MAX_LINE:
            self.parser.reset()
            self.overflow = True
            self._error(f"the server sent more than {MAX_LINE // 2**20} MiB without a line end (not an event stream)")

    def whole(self, piece: bytes, now: int) -> bool:
        """A piece that is exactly one event with one data line (a server's usual write: one token) is handled at
        once, without the general parse; False when it is anything else (nothing consumed: then `feed`)."""
        global _reads
        if self.heading:
            return False
        data = self.parser.one(piece)
        if data is None:
            return False
        _reads += 1
        self._event(data, now)
        return True

    def close(self, now: int) -> None:
        for data in self.parser.flush():
            self._event(data, now)

    def _error(self, message: str) -> None:
        self.rec.status = "error"
        self.rec.error = clean_secret_text(message, self.secret) or "error"

    def _bad(self, what: str) -> None:
        self.bad = True
        if self.rec.status == "ok":
            self.rec.status = "bad_usage"
            self.rec.error = clean_secret_text(
                f"the server's usage is not a token count: {what} (expected an integer from 0 to {self.bound})",
                self.secret)

    def _usage(self, prompt: object, completion: object, reasoning: object, cached: object = None) -> Counts | None:
        """The counts when each is absent or an integer from 0 to the bound (cached: to the prompt's count);
        else None (and bad_usage). They may come decoded leniently (any JSON): one that is not an integer is bad
        usage too."""
        b = self.bound  # every chunk carries usage (continuous_usage_stats): the plausible case first, cheaply
        if ((prompt is None or (type(prompt) is int and 0 <= prompt <= b))
                and (completion is None or (type(completion) is int and 0 <= completion <= b))
                and (reasoning is None or (type(reasoning) is int and 0 <= reasoning <= b))
                and (cached is None or (type(cached) is int and 0 <= cached <= (b if prompt is None else prompt)))):
            return prompt, completion, reasoning, cached
        for name, v in (("prompt_tokens", prompt), ("completion_tokens", completion),
                        ("completion_tokens_details.reasoning_tokens", reasoning),
                        ("prompt_tokens_details.cached_tokens", cached)):
            if v is not None and (type(v) is not int or v < 0 or v > self.bound):
                self._bad(f"{name} = {_show(v)}")
                return None
        self._bad(f"prompt_tokens_details.cached_tokens = {_show(cached)} is more than prompt_tokens = {prompt}")
        return None

    def _event(self, data: bytes, now: int) -> None:
        if self.done:  # the stream ended at [DONE]: nothing after it counts (tokens, usage, errors, time)
            self.after_done += 1
            self.overflow = True  # stop reading (this connection is not reused)
            return
        self.events += 1
        if data == b"[DONE]":
            self.done = True
            self.done_ns = now
            return
        try:
            ch = _decode_chunk(data)
        except msgspec.DecodeError:  # not JSON, or a field of an unexpected type: decode it leniently
            self._loose(data, now)
            return
        # the usual token (one choice with text or content, no reasoning, a usage of two plausible counts and no
        # details) is recorded right here, as `_chunk` would record it, without its general steps: nearly every
        # streamed token takes this path, and each step saved is saved per token
        choices, u = ch.choices, ch.usage
        if (u is not None and choices is not None and len(choices) == 1 and ch.error is None and ch.timings is None
                and self.reply is None and not self.bad and u.completion_tokens_details is None
                and u.prompt_tokens_details is None):
            c = choices[0]
            d = c.delta
            prompt, completion = u.prompt_tokens, u.completion_tokens
            b = self.bound
            if ((d is None or not (d.reasoning_content or d.reasoning)) and type(prompt) is int
                    and type(completion) is int and 0 <= prompt <= b and 0 <= completion <= b):
                content = bool(c.text) if d is None else bool(d.content)
                rec = self.rec
                grew = completion - self.last_completion
                if grew > 0:  # continuous usage says the count grew: a token, even one that reads "" for now
                    self.last_completion = completion
                    content = True
                if content:
                    ntok = grew if grew > 0 else 1
                    self.counted += ntok
                    if not rec.chunk_ns:
                        rec.first_token_ns = now
                    if not rec.first_content_ns:
                        rec.first_content_ns = now
                    rec.chunk_ns.append(now)
                    rec.chunk_tokens.append(ntok)
                rec.prompt_tokens = prompt
                rec.output_tokens = completion
                rec.usage_reported = True
                return
        self._chunk(ch, now)

    def _chunk(self, ch: _Chunk, now: int) -> None:
        """A decoded chunk: its error, its tokens and its usage into the record."""
        if ch.error is not None:
            e = ch.error
            self._error(e if isinstance(e, str) else (e.message or "error"))
            return
        has_content = False
        has_reasoning = False
        if ch.choices:
            for c in ch.choices:
                d = c.delta
                if d is not None:
                    if d.content:
                        has_content = True
                    if d.reasoning_content or d.reasoning:
                        has_reasoning = True
                elif c.text:
                    has_content = True
            if self.reply is not None and has_content:
                self._keep(self.reply, ch.choices)
        t = ch.timings
        if t is not None and t.prompt_ms is not None and 0 <= t.prompt_ms < 1e9:
            self.rec.server_prompt_ms = float(t.prompt_ms)
        usage = None
        u = ch.usage
        if u is not None and not self.bad:
            det = u.completion_tokens_details
            pdet = u.prompt_tokens_details
            usage = self._usage(u.prompt_tokens, u.completion_tokens, det.reasoning_tokens if det is not None else None,
                                pdet.cached_tokens if pdet is not None else None)
        self._tokens(has_content, has_reasoning, bool(ch.choices), usage, now)

    @staticmethod
    def _keep(reply: list[str], choices: list[_Choice]) -> None:
        for c in choices:
            text = c.delta.content if c.delta is not None else c.text
            if text:
                reply.append(text)

    def _loose(self, data: bytes, now: int) -> None:
        try:
            obj = json.loads(data, strict=False)  # control characters inside strings too
        except (ValueError, RecursionError):
            return  # not JSON: not a chunk
        if not isinstance(obj, dict):
            return
        err = obj.get("error")
        if err is not None:
            msg = err.get("message") if isinstance(err, dict) else err
            self._error(msg if isinstance(msg, str) else _show(msg))
            return
        choices = obj.get("choices")
        timings = obj.get("timings")
        pm = timings.get("prompt_ms") if isinstance(timings, dict) else None
        if isinstance(pm, (int, float)) and not isinstance(pm, bool) and 0 <= pm < 1e9:
            self.rec.server_prompt_ms = float(pm)
        has_content, has_reasoning = _loose_flags(choices)
        usage = None
        raw = obj.get("usage")
        if raw is not None and not self.bad:
            if not isinstance(raw, dict):
                self._bad(f"usage = {_show(raw)}")
            else:
                det = raw.get("completion_tokens_details")
                pdet = raw.get("prompt_tokens_details")
                if det is not None and not isinstance(det, dict):
                    self._bad(f"completion_tokens_details = {_show(det)}")
                elif pdet is not None and not isinstance(pdet, dict):
                    self._bad(f"prompt_tokens_details = {_show(pdet)}")
                else:
                    usage = self._usage(raw.get("prompt_tokens"), raw.get("completion_tokens"),
                                        det.get("reasoning_tokens") if det is not None else None,
                                        pdet.get("cached_tokens") if pdet is not None else None)
        if self.reply is not None and has_content:
            self.reply.extend(_loose_texts(choices))
        self._tokens(has_content, has_reasoning, isinstance(choices, list) and bool(choices), usage, now)

    def _tokens(self, has_content: bool, has_reasoning: bool, has_choices: bool,
                usage: Counts | None, now: int) -> None:
        rec = self.rec
        completion = usage[1] if usage is not None else None
        # a chunk carries tokens when it has text, or when continuous usage says the count grew
        # (a token can detokenize to "" until the next one completes a character)
        grew = 0
        if completion is not None and has_choices:
            grew = completion - self.last_completion
            if grew > 0:
                self.last_completion = completion
                if not has_reasoning:
                    has_content = True
        if has_content or has_reasoning:
            ntok = grew if grew > 0 else 1
            self.counted += ntok
            if has_reasoning and not has_content:
                self.reasoning_counted += ntok
            if not rec.chunk_ns:
                rec.first_token_ns = now
            if has_content and not rec.first_content_ns:
                rec.first_content_ns = now
            rec.chunk_ns.append(now)
            rec.chunk_tokens.append(ntok)
        if usage is not None:
            prompt, completion, reasoning, cached = usage
            if cached is not None:
                rec.cached_tokens = cached
            if prompt is not None:
                rec.prompt_tokens = prompt
            if completion is not None:
                rec.output_tokens = completion
                rec.usage_reported = True
            if reasoning is not None:
                rec.reasoning_tokens = reasoning

    def finish(self, http_status: int, content_type: str) -> None:
        """The response ended: counts the server never reported (or reported wrongly) are the counted chunks,
        and a 200 stream without [DONE] is `cut`, or `error` when it was no event stream at all (HTML)."""
        rec = self.rec
        if self.after_done and self.done_ns:
            # the request ended at [DONE]; what came after is said in the record (an ok one keeps it as a note)
            rec.end_ns = self.done_ns
            if rec.status == "ok":
                rec.error = (f"ignored {self.after_done} event{'s' if self.after_done > 1 else ''} the server sent "
                             "after [DONE] (the stream ends there)")
        if not rec.usage_reported or self.bad:
            rec.output_tokens = self.counted
        if not rec.reasoning_tokens and self.reasoning_counted:
            rec.reasoning_tokens = self.reasoning_counted
        if rec.status == "ok" and self.done and not rec.chunk_ns:
            # a 200 stream with no token before [DONE]: nothing was served, so it is no measured request
            rec.status = "error"
            rec.error = ("empty stream: no token before [DONE] (the server answered with no output; "
                         "check --model and that the server generates)")
        if rec.status == "ok" and not self.done:
            why = self.not_a_stream(content_type) if http_status == 200 else ""
            if why:
                rec.status = "error"
                rec.error = why
            else:
                rec.status = "cut"
                rec.error = "stream ended before [DONE]"

    def not_a_stream(self, content_type: str) -> str:
        """Why a 200 response that ended without [DONE] was not a stream at all ("" when it had events)."""
        if self.events:
            return ""
        text = _decompressed(self.head, "").decode("utf-8", "replace")  # (a gzip body is known by its first bytes)
        head = "binary data, not text" if _binary(text) else clean_secret_text(text, self.secret, 120)
        body = f"; it starts: {head}" if head else "; the body was empty"
        if "event-stream" not in content_type.lower():
            return (f"the server answered HTTP 200 with Content-Type {clean_text(content_type)[:80] or '(none)'}, "
                    f"not an event stream (is --url the inference server?){body}")
        return f"the server's event stream ended without any event{body}"


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
