"""Incremental Server-Sent Events parser.

Bytes arrive in arbitrary pieces; an event may be split at any byte. `feed()` returns the `data:`
payloads of every event completed by this piece, without copying the unread tail more than once.
Only the `data` field matters for OpenAI-compatible streams; comments (`:`) and other fields are skipped.
Lines end as the SSE specification says: CRLF, LF or a lone CR, in any mix; a CRLF split between two pieces
(CR at the end of one, LF at the start of the next) is one line end, not two.
"""

from __future__ import annotations


class SSEParser:
    __slots__ = ("_buf", "_held", "_held_len", "_after_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._held: list[bytes] = []  # pieces with no line end, joined once one arrives (a long line that
        self._held_len = 0  # trickles in costs linear time, not quadratic)
        self._after_cr = False  # the last piece ended with CR: an LF starting the next one ends no line

    def feed(self, piece: bytes) -> list[bytes]:
        if self._after_cr and piece:
            self._after_cr = False
            if piece[0] == 10:  # the LF of a CRLF split between two pieces
                piece = piece[1:]
        if b"\r" in piece:  # CR and CRLF line ends as LF (a CR is always a line end: no data holds one)
            self._after_cr = piece[-1] == 13
            piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in piece:
            if piece:
                self._held.append(piece)
                self._held_len += len(piece)
            return []
        if self._held:
            piece = b"".join(self._held) + piece
            self._held, self._held_len = [], 0
        buf = self._buf + piece if self._buf else piece
        out: list[bytes] = []
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if nl == start:
                start = nl + 1  # blank line: event boundary (we emit per data line)
                continue
            if buf.startswith(b"data:", start):
                s = start + 5
                if s < nl and buf[s] == 32:
                    s += 1
                out.append(buf[s:nl])
            start = nl + 1
        self._buf = buf[start:] if start < n else b""
        return out

    def one(self, piece: bytes) -> bytes | None:
        """The data of `piece` when it is exactly one event of one `data:` line ("data: ...\n\n") and nothing is
        pending (a server's usual write: one token); else None, and nothing is consumed (then `feed`)."""
        if (self._buf or self._held_len or self._after_cr or not piece.startswith(b"data:")
                or not piece.endswith(b"\n\n") or piece.find(b"\n") != len(piece) - 2  # the first line end is the last
                or b"\r" in piece):  # a CR anywhere is a line end too
            return None
        return piece[6 if piece[5] == 32 else 5:-2]

    @property
    def idle(self) -> bool:
        """Nothing held: no unfinished line, no CR whose LF may start the next piece (`one` would look at a piece)."""
        return not self._buf and not self._held_len and not self._after_cr

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held until its end arrives."""
        return len(self._buf) + self._held_len

    def reset(self) -> None:
        self._buf = b""
        self._held, self._held_len = [], 0
        self._after_cr = False

    def flush(self) -> list[bytes]:
        """End of stream: a final line with no line end still counts."""
        rest, self._buf = self._buf + b"".join(self._held), b""
        self._held, self._held_len = [], 0
        self._after_cr = False
        if rest.startswith(b"data:"):
            s = 5
            if len(rest) > 5 and rest[5] == 32:
                s = 6
            return [rest[s:]]
        return []
