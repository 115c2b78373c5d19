from servescope.core.sse import SSEParser

STREAM = (
    b'data: {"choices":[{"text":"a"}]}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"text":"\xc3\xa9"}]}\r\n\r\n'
    b"event: ignored\n"
    b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = [
    b'{"choices":[{"text":"a"}]}',
    b'{"choices":[{"text":"\xc3\xa9"}]}',
    b'{"choices":[],"usage":{"completion_tokens":2}}',
    b"[DONE]",
]


def test_whole_stream() -> None:
    p = SSEParser()
    assert p.feed(STREAM) + p.flush() == EXPECTED


def test_split_at_every_byte_offset() -> None:
    for i in range(len(STREAM) + 1):
        p = SSEParser()
        got = p.feed(STREAM[:i]) + p.feed(STREAM[i:]) + p.flush()
        assert got == EXPECTED, f"split at {i}"


def test_split_into_three_pieces_everywhere() -> None:
    n = len(STREAM)
    for i in range(0, n, 3):
        for j in range(i, n, 5):
            p = SSEParser()
            got = p.feed(STREAM[:i]) + p.feed(STREAM[i:j]) + p.feed(STREAM[j:]) + p.flush()
            assert got == EXPECTED, (i, j)


def test_one_byte_at_a_time() -> None:
    p = SSEParser()
    got = []
    for b in STREAM:
        got += p.feed(bytes([b]))
    assert got + p.flush() == EXPECTED


def test_final_line_without_newline() -> None:
    p = SSEParser()
    assert p.feed(b"data: [DONE]") == []
    assert p.flush() == [b"[DONE]"]


def test_data_without_space() -> None:
    p = SSEParser()
    assert p.feed(b"data:{}\n\n") == [b"{}"]


# ---- line ends as the SSE specification says: CRLF, LF or a lone CR (issue 32) ------------------------------------
CR_ONLY = STREAM.replace(b"\r\n", b"\n").replace(b"\n", b"\r")


def test_lone_cr_line_ends_read_as_lf_ones() -> None:
    p = SSEParser()
    assert p.feed(CR_ONLY) + p.flush() == EXPECTED
    for i in range(len(CR_ONLY) + 1):
        p = SSEParser()
        assert p.feed(CR_ONLY[:i]) + p.feed(CR_ONLY[i:]) + p.flush() == EXPECTED, f"split at {i}"


def test_a_crlf_split_between_two_pieces_is_one_line_end() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == [b"a"]
    assert p.feed(b"\ndata: b\r") == [b"b"]  # the LF ends no line of its own: "data: b" is whole
    assert p.feed(b"\n\r\n") == [] and p.pending == 0
    assert p.feed(b"data: c\r\r") == [b"c"] and p.flush() == []


def test_cr_then_cr_is_two_line_ends_and_lf_after_other_bytes_still_ends_a_line() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == [b"a"]
    assert p.feed(b"\rdata: b") == []  # a CR first: a blank line, not a CRLF
    assert p.feed(b"\n") == [b"b"]


def test_the_one_event_shortcut_stands_aside_for_a_cr() -> None:
    p = SSEParser()
    assert p.one(b"data: a\rdata: b\n\n") is None  # two lines: the general parse reads both
    assert p.feed(b"data: a\rdata: b\n\n") == [b"a", b"b"]
    p.feed(b"data: c\r")
    assert p.one(b"\n\n") is None
