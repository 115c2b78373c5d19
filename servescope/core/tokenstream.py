"""One streamed response's bytes into its record: SSE events, chunks decoded with msgspec, stamps and counts.

Transport-independent (core/client.py's `stream_request` feeds it from any of the three transports). A token's
stamp is the perf_counter_ns() its read was handed over with. The usual read of a stream (vLLM writes each token
as its own event, one HTTP chunk each) is handled by `_Stream.whole` in one step, without the general SSE parse:
nearly every streamed token takes that path, so every step saved there is saved per token.
"""

from __future__ import annotations

import json
import zlib
from typing import TypeAlias

import msgspec

from servescope.core.records import RequestRecord
from servescope.core.sse import SSEParser
from servescope.core.textsafe import clean_secret_text, clean_text

# a usage's (prompt, completion, reasoning, cached) token counts, None where the server left one out
Counts: TypeAlias = tuple[int | None, int | None, int | None, int | None]


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


ERROR_BODY_LIMIT = 65536  # bytes of a failed response's body read for its error text

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


USAGE_BOUND = 10_000_000  # the most tokens a count may say when the model's max length is unknown
MAX_COUNT = 2**31 - 1  # and never more than this, whatever the server says its max length is
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
                 "bound", "secret", "bad", "events", "head", "heading", "overflow", "reply", "quick")

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
        # `whole` may take its one-step path: the head is kept, the parser holds nothing, no [DONE] yet, the usage
        # still plausible and no reply kept (set after each `feed`; cleared at [DONE] and bad usage)
        self.quick = False

    def feed(self, piece: bytes, now: int) -> None:
        global _reads
        _reads += 1
        if self.quick and piece.endswith(b"\n\n") and b"\r" not in piece:
            # several whole events in one read (a client that read late, a server that wrote them together), each
            # one `data: ` line: split at once, each event recorded in one step (all stamped with this read's time)
            events = piece[:-2].split(b"\n\n")
            n = len(events)
            # no line end but the events' own (each event one line), and each line a `data: ` one
            if (piece.count(b"\n") == 2 * n and piece.startswith(b"data: ")
                    and piece.count(b"\n\ndata: ") == n - 1):
                for e in events:
                    if self.quick:
                        self._quick(e[6:], now)
                    else:  # past [DONE], or the usage no longer plausible: the general steps
                        self._event(e[6:], now)
                return
        if self.heading:
            self.head += piece[: _HEAD - len(self.head)]
            self.heading = len(self.head) < _HEAD
        parser = self.parser
        for data in parser.feed(piece):
            self._event(data, now)
        if parser.pending > MAX_LINE:
            parser.reset()
            self.overflow = True
            self._error(f"the server sent more than {MAX_LINE // 2**20} MiB without a line end (not an event stream)")
        self.quick = (not self.heading and parser.idle and not self.done and not self.bad and self.reply is None)

    def whole(self, piece: bytes, now: int) -> bool:
        """A piece that is exactly one event with one data line (a server's usual write: one token) is handled at
        once, without the general parse; False when it is anything else (nothing consumed: then `feed`).

        The usual token (`quick`: nothing pending, the head kept, no reply kept, usage still plausible; a
        `data: ` line with one choice of text or content and no reasoning, a usage of two plausible counts and no
        details) is decoded and recorded here in one step, as `_event` and `_chunk` would record it: nearly every
        streamed token takes this path, and each step saved is saved per token."""
        global _reads
        if not self.quick:
            return self._whole(piece, now)
        last = len(piece) - 2
        if not piece.startswith(b"data: ") or piece.find(b"\n") != last or piece[-1] != 10 or b"\r" in piece:
            return self._whole(piece, now)  # another spelling or framing: the parser's rules decide
        _reads += 1
        self._quick(piece[6:last], now)
        return True

    def _quick(self, data: bytes, now: int) -> None:
        """One event's data, while `quick`: the usual token recorded in one step, anything else the general way."""
        try:
            ch = _decode_chunk(data)
        except msgspec.DecodeError:  # [DONE], not JSON, or a field of an unexpected type
            self._event(data, now)
            return
        self.events += 1
        choices, u = ch.choices, ch.usage
        if (u is None or choices is None or len(choices) != 1 or ch.error is not None or ch.timings is not None
                or u.completion_tokens_details is not None or u.prompt_tokens_details is not None):
            self._chunk(ch, now)
            return
        c = choices[0]
        d = c.delta
        prompt, completion = u.prompt_tokens, u.completion_tokens
        b = self.bound
        if ((d is not None and (d.reasoning_content or d.reasoning)) or type(prompt) is not int
                or type(completion) is not int or not 0 <= prompt <= b or not 0 <= completion <= b):
            self._chunk(ch, now)
            return
        rec = self.rec
        grew = completion - self.last_completion
        if grew > 0:  # continuous usage says the count grew: a token, even one that reads "" for now
            self.last_completion = completion
            ntok = grew
        elif c.text if d is None else d.content:
            ntok = 1
        else:
            ntok = 0
        if ntok:
            if not self.counted:  # no token recorded yet (each one adds at least 1)
                rec.first_token_ns = now
            if not rec.first_content_ns:
                rec.first_content_ns = now
            self.counted += ntok
            rec.chunk_ns.append(now)
            rec.chunk_tokens.append(ntok)
        rec.prompt_tokens = prompt
        rec.output_tokens = completion
        rec.usage_reported = True

    def _whole(self, piece: bytes, now: int) -> bool:
        """`whole` by the parser's rules (any `data:` spelling, a stream past [DONE], a kept reply, bad usage)."""
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
        self.quick = False
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
            self.quick = False
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
