"""A cell's output counts against what was streamed (issue 44, item 17; core.metrics.output_check), on hand-built
records: a usage of twice the tokens streamed, a usage above max_tokens, a stop before max_tokens with ignore_eos
sent, and the honest cases (several tokens per piece said by a running usage, a server without usage)."""

from __future__ import annotations

from array import array

from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord


def _rec(i: int, pieces: list[int], said: int | None, asked: int = 8) -> RequestRecord:
    r = RequestRecord(i, 0, False, 10, asked, scheduled_ns=1_000 * i, sent_ns=1_000 * i + 10, prompt_tokens=10)
    r.chunk_ns = array("q", [1_000 * i + 100 + k for k in range(len(pieces))])
    r.chunk_tokens = array("i", pieces)
    r.first_token_ns = r.first_content_ns = r.chunk_ns[0]
    r.end_ns = r.chunk_ns[-1] + 1
    r.output_tokens = said if said is not None else sum(pieces)
    r.usage_reported = said is not None
    return r


def _check(recs: list[RequestRecord], ignore_eos: bool = True):  # type: ignore[no-untyped-def]
    return summarize(records_frame(recs), 1.0, ignore_eos=ignore_eos).output_check


def test_a_usage_of_twice_the_pieces_is_said_with_its_numbers() -> None:
    c = _check([_rec(i, [1] * 8, 16) for i in range(4)])
    assert c is not None and (c.usage_vs_stream, c.said, c.streamed, c.over_max_tokens, c.short) == (4, 64, 32, 4, 0)
    assert c.notes[0].startswith("usage.completion_tokens differs from the tokens streamed on 4 of 4 requests: 64 "
                                 "said, 32 streamed (2.00x what was streamed)")
    assert c.notes[1].startswith("usage.completion_tokens is above max_tokens on 4 of 4 requests (up to 16 for 8 asked)")


def test_a_stop_before_max_tokens_is_said_only_when_ignore_eos_was_sent() -> None:
    recs = [_rec(i, [1, 1], 2) for i in range(3)]
    c = _check(recs)
    assert c is not None and c.short == 3 and c.usage_vs_stream == 0
    assert c.notes == ["3 of 3 requests ended before max_tokens although ignore_eos was sent (mean 2.0 of 8.0 tokens): "
                       "the server does not honour ignore_eos, so outputs are shorter than the workload asks"]
    assert _check(recs, ignore_eos=False) is None  # without it, a model may stop early


def test_honest_counts_say_nothing() -> None:
    assert _check([_rec(i, [1] * 8, 8) for i in range(4)]) is None
    assert _check([_rec(i, [2, 3, 3], 8) for i in range(4)]) is None  # a running usage said several per piece
    assert _check([_rec(i, [1] * 8, None) for i in range(4)]) is None  # no usage: the pieces are the count
    assert _check([_rec(i, [1] * 7, 8) for i in range(4)]) is None  # one piece that detokenized to "": within 2
    assert summarize(records_frame([_rec(0, [1] * 8, 8)]), 1.0).to_dict().get("output_check", "absent") == "absent"
