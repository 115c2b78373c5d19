"""Incremental Server-Sent Events parser.

Bytes arrive in arbitrary pieces; an event may be split at any byte. `feed()` returns the `data:`
payloads of every event completed by this piece, without copying the unread tail more than once.
Only the `data` field matters for OpenAI-compatible streams; comments (`:`) and other fields are skipped.
"""

from __future__ import annotations


class SSEParser:
    __slots__ = ("_buf", "_held", "_held_len")

    def __init__(self) -> None:
        self._buf = b""
        self._held: list[bytes] = []  # pieces with no line end, joined once one arrives (a long line that
        self._held_len = 0  # trickles in costs linear time, not quadratic)

    def feed(self, piece: bytes) -> list[bytes]:
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
            line_end = nl
            if line_end > start and buf[line_end - 1] == 13:  # \r\n
                line_end -= 1
            if line_end == start:
                start = nl + 1  # blank line: event boundary (we emit per data line)
                continue
            if buf.startswith(b"data:", start):
                s = start + 5
                if s < line_end and buf[s] == 32:
                    s += 1
                out.append(buf[s:line_end])
            start = nl + 1
        self._buf = buf[start:] if start < n else b""
        return out

    def one(self, piece: bytes) -> bytes | None:
        """The data of `piece` when it is exactly one event of one `data:` line ("data: ...\n\n") and nothing is
        pending (a server's usual write: one token); else None, and nothing is consumed (then `feed`)."""
        if (self._buf or self._held_len or not piece.startswith(b"data:") or not piece.endswith(b"\n\n")
                or piece.find(b"\n") != len(piece) - 2 or piece[-3] == 13):  # the first line end is the last
            return None
        return piece[6 if piece[5] == 32 else 5:-2]

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held until its end arrives."""
        return len(self._buf) + self._held_len

    def reset(self) -> None:
        self._buf = b""
        self._held, self._held_len = [], 0

    def flush(self) -> list[bytes]:
        """End of stream: a final line with no newline still counts."""
        rest, self._buf = self._buf + b"".join(self._held), b""
        self._held, self._held_len = [], 0
        rest = rest.rstrip(b"\r")
        if rest.startswith(b"data:"):
            s = 5
            if len(rest) > 5 and rest[5] == 32:
                s = 6
            return [rest[s:]]
        return []
