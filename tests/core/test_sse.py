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
