"""Trace readers (servescope.workloads.traces): each public format written by the test, auto-detection,
time_scale, the preview line, every bad input as one `FILE:LINE: ...` line, and prompts whose prefixes are
shared exactly where the trace's hash ids are, at exact lengths under a fake BPE-like tokenizer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.core.metrics import records_frame
from servescope.core.records import RequestRecord
from servescope.sessions.store import SessionWriter
from servescope.workloads.traces import Trace, TraceRequest, read_trace, trace_prompts
from tests.support.meta import meta_of

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


class FakeTok:
    """Words split on spaces, long words cut in 4-character pieces (so cutting text mid-word changes the
    count, as with BPE); one BOS token for completions, 7 template tokens for chat."""

    exact = True
    name = "fake"

    def __init__(self) -> None:
        self.vocab: list[str] = []
        self.ids: dict[str, int] = {}

    def _pieces(self, text: str) -> list[str]:
        return [w[i : i + 4] for w in text.split(" ") if w for i in range(0, len(w), 4)]

    async def encode(self, text: str) -> list[int]:
        out = []
        for p in self._pieces(text):
            if p not in self.ids:
                self.ids[p] = len(self.vocab)
                self.vocab.append(p)
            out.append(self.ids[p])
        return out

    async def decode(self, ids: list[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)

    async def count_prompt(self, text: str) -> int:
        return 1 + len(self._pieces(text))

    async def count_chat(self, text: str) -> int:
        return 7 + len(self._pieces(text))


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def mooncake(tmp_path: Path, rows: list[dict[str, object]], name: str = "trace.jsonl") -> str:
    return write(tmp_path / name, "".join(json.dumps(r) + "\n" for r in rows))


def error(path: str, fmt: str = "auto") -> str:
    with pytest.raises(ServescopeError) as e:
        read_trace(path, fmt)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---- parsing each format ----

def test_mooncake_values(tmp_path: Path) -> None:
    p = mooncake(tmp_path, [
        {"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 1100, "output_length": 0, "hash_ids": [0, 1, 2], "session_id": 7},
        {"timestamp": 4000, "input_length": 5, "output_length": 3},
    ])
    t = read_trace(p)
    assert t.format == "mooncake" and t.path == p and t.block_tokens == 512
    assert t.requests == (TraceRequest(0.0, 600, 20, (0, 1)), TraceRequest(0.5, 1100, 0, (0, 1, 2)),
                          TraceRequest(3.0, 5, 3, ()))
    assert t.duration_s == 3.0 and t.mean_rate == 1.0
    assert (t.max_input(), t.max_total()) == (1100, 1100)


def test_burstgpt_values_with_its_other_columns(tmp_path: Path) -> None:
    p = write(tmp_path / "burst.csv", BURST_HEADER
              + "5,ChatGPT,472,18,490,Conversation log\n"
              + "\n"  # a blank line is skipped, and line numbers still count it
              + "5,GPT-4,1000,0,1000,API log\n"
              + "45.5,ChatGPT,30,200,230,Conversation log\n")
    t = read_trace(p)
    assert t.format == "burstgpt"
    assert t.requests == (TraceRequest(0.0, 472, 18), TraceRequest(0.0, 1000, 0), TraceRequest(40.5, 30, 200))
    assert t.lines == (2, 4, 5)
    assert t.check_fits(1030) is None
    assert t.check_fits(999) == (f"{p}:4: this request needs 1,000 input + 0 output = 1,000 tokens, more than "
                                 "the model's max length 999; serve a longer context or drop the trace's "
                                 "longer requests")
    assert t.check_fits(489) == (f"{p}:2: this request needs 472 input + 18 output = 490 tokens, more than "
                                 "the model's max length 489; serve a longer context or drop the trace's "
                                 "longer requests")


def test_azure_values(tmp_path: Path) -> None:
    p = write(tmp_path / "AzureLLMInferenceTrace_conv.csv", AZURE_HEADER
              + "2023-11-16 18:15:46.6805900,374,44\n"
              + "2023-11-16 18:15:50.9951690,396,109\n"
              + "2023-11-16 18:17:46.6805900,879,20\n")
    t = read_trace(p)
    assert t.format == "azure" and len(t.requests) == 3
    assert [r.t_s for r in t.requests] == pytest.approx([0.0, 4.314579, 120.0])
    assert [(r.input_tokens, r.output_tokens) for r in t.requests] == [(374, 44), (396, 109), (879, 20)]


def write_session(tmp_path: Path) -> Path:
    d = tmp_path / "session"
    w = SessionWriter.create(d, meta_of(**{"name": "s", "cells": [{"index": 0, "status": "running"},
                                                        {"index": 1, "status": "running"}]}))

    def rec(i: int, warm: bool, nin: int, nout: int, at_s: float) -> RequestRecord:
        return RequestRecord(index=i, user=0, warmup=warm, input_tokens_requested=nin,
                             output_tokens_requested=nout, scheduled_ns=int(at_s * 1e9), sent_ns=int(at_s * 1e9) + 5)

    # stored in finish order, not in send order; the warmup request is not replayed
    w.write_cell({"index": 0, "status": "done"}, records_frame([
        rec(-1, True, 50, 50, 100.0), rec(1, False, 70, 7, 103.0), rec(0, False, 60, 6, 101.5)]), None)
    # the next cell ran later on the same clock: the gap between the cells is kept
    w.write_cell({"index": 1, "status": "done"}, records_frame([rec(0, False, 80, 8, 110.0)]), None)
    return d


def test_session_replays_measured_requests_in_time_order(tmp_path: Path) -> None:
    d = write_session(tmp_path)
    for path in (d, d / "session.toml"):
        t = read_trace(path)
        assert t.format == "session" and t.path == str(d)
        assert t.requests == (TraceRequest(0.0, 60, 6), TraceRequest(1.5, 70, 7), TraceRequest(8.5, 80, 8))
    assert read_trace(d, "session").requests == t.requests
    assert t.check_fits(87) == (f"{d}: request 3: this request needs 80 input + 8 output = 88 tokens, more than "
                                "the model's max length 87; serve a longer context or drop the trace's longer "
                                "requests")
    with pytest.raises(ServescopeError, match=r": a session, not a burstgpt file; use format = \"session\"$"):
        read_trace(d, "burstgpt")


def test_session_resumed_on_another_clock_follows_the_cell_before(tmp_path: Path) -> None:
    d = write_session(tmp_path)
    w = SessionWriter.open(d)
    w.write_cell({"index": 2, "status": "done"}, records_frame([
        RequestRecord(index=0, user=0, warmup=False, input_tokens_requested=90, output_tokens_requested=9,
                      scheduled_ns=2_000_000_000),
        RequestRecord(index=1, user=0, warmup=False, input_tokens_requested=91, output_tokens_requested=9,
                      scheduled_ns=2_250_000_000)]), None)
    t = read_trace(d)
    assert [r.t_s for r in t.requests] == [0.0, 1.5, 8.5, 8.5, 8.75]


def test_session_errors(tmp_path: Path) -> None:
    d = tmp_path / "empty-session"
    SessionWriter.create(d, meta_of(**{"name": "s"}))
    assert error(str(d)) == (f"{d}: the session has no measured requests to replay; choose a session that "
                             "finished a cell")
    f = write(tmp_path / "trace.csv", BURST_HEADER + "1,ChatGPT,3,1,4,API log\n")
    assert error(f, "session") == f"{f}: not a servescope session (no session.toml); give a session directory"
    assert error(str(tmp_path)) == f"{tmp_path}: not a servescope session (no session.toml); give a session directory"
    s = write_session(tmp_path)
    bad = s / "requests" / "cell-0002.parquet"
    bad.write_bytes(b"PAR1 not really")
    assert error(str(s)).startswith(f"{bad}: cannot be read (")
    assert error(str(s)).endswith("); the file is damaged: restore it from a copy")
    pl.DataFrame({"warmup": [False], "scheduled_ns": [1]}).write_parquet(bad)
    assert error(str(s)) == (f"{bad}: missing column input_tokens_requested, output_tokens_requested; a session's "
                             "request file has warmup, scheduled_ns, input_tokens_requested, output_tokens_requested, "
                             "this one has warmup, scheduled_ns")
    pl.DataFrame({"warmup": [False, False], "scheduled_ns": [1, 2], "input_tokens_requested": [5, 0],
                  "output_tokens_requested": [1, 1]}).write_parquet(bad)
    assert error(str(s)) == f"{bad}:2: input_tokens_requested is 0; it must be from 1 to 100,000,000; fix or drop that row"


# ---- detection, formats, scaling, preview ----

def test_auto_detects_by_content_not_only_extension(tmp_path: Path) -> None:
    m = mooncake(tmp_path, [{"timestamp": 0, "input_length": 3, "output_length": 1}], "m.txt")
    b = write(tmp_path / "b.log", BURST_HEADER + "1,ChatGPT,3,1,4,API log\n")
    a = write(tmp_path / "a", AZURE_HEADER + "2023-11-16 18:15:46.6805900,3,1\n")
    assert [read_trace(x).format for x in (m, b, a)] == ["mooncake", "burstgpt", "azure"]
    assert read_trace(b, "burstgpt").requests == read_trace(b).requests
    with pytest.raises(ServescopeError, match=r"unknown trace format 'sharegpt'; use one of mooncake, burstgpt, "
                                              r"azure, session or auto"):
        read_trace(m, "sharegpt")


def test_time_scale_multiplies_times(tmp_path: Path) -> None:
    t = read_trace(mooncake(tmp_path, [{"timestamp": t, "input_length": 10, "output_length": 1}
                                       for t in (0, 1000, 3000)]))
    fast = t.scaled(0.5)
    assert [r.t_s for r in fast.requests] == [0.0, 0.5, 1.5]
    assert [r.t_s for r in t.scaled(2).requests] == [0.0, 2.0, 6.0]
    assert fast.mean_rate == 2.0 and t.mean_rate == 1.0
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ServescopeError, match="must be a number above 0"):
            t.scaled(bad)


def test_preview_figures() -> None:
    # 200 requests: 150 in the first second, then one every 4 s; inputs 1..200, outputs 2 * that
    times = [i / 150 for i in range(150)] + [1 + 4 * i for i in range(50)]
    reqs = tuple(TraceRequest(t, i + 1, 2 * (i + 1), (0, 1, 1000 + i)) for i, t in enumerate(times))
    t = Trace("x.jsonl", "mooncake", reqs)
    assert t.duration_s == 197.0
    # blocks: 600 in all, 0 and 1 new once each, then seen 199 times each: 398 / 600 = 66%
    assert t.preview() == ("200 requests over 3 m 17 s (1.02 req/s mean, peak 150 req/s in a 1 s window); "
                           "input p50 100 / p99 198 tokens; output p50 200 / p99 396; 66% of prompt blocks shared")
    one = Trace("x.csv", "burstgpt", (TraceRequest(0.0, 1234, 5),))
    assert one.preview() == "1 request all at t = 0; input p50 1,234 / p99 1,234 tokens; output p50 5 / p99 5"
    assert one.mean_rate == 0.0
    short = Trace("x.csv", "burstgpt", (TraceRequest(0.0, 10, 5), TraceRequest(12.5, 10, 5)))
    assert short.preview().startswith("2 requests over 12.5 s (0.16 req/s mean, peak 1 req/s in a 1 s window)")
    long = Trace("x.csv", "burstgpt", (TraceRequest(0.0, 10, 5), TraceRequest(7530.0, 10, 5)))
    assert long.preview().startswith("2 requests over 2 h 5 m (")


# ---- bad input: one line each, with the file and line ----

def test_empty_traces(tmp_path: Path) -> None:
    e = write(tmp_path / "e.jsonl", "")
    assert error(e) == f"{e}:1: the file is empty (no requests); give a trace with at least one request"
    assert error(e, "mooncake") == f"{e}:1: the trace has no requests; give a file with at least one"
    h = write(tmp_path / "h.csv", BURST_HEADER)
    assert error(h) == f"{h}:1: the trace has no requests; give a file with at least one"


def test_unrecognised_format_names_what_was_tried(tmp_path: Path) -> None:
    p = write(tmp_path / "x.csv", "time,prompt,completion\n1,2,3\n")
    assert error(p) == (f"{p}:1: not a trace format servescope knows; tried mooncake (JSON lines with timestamp, "
                        "input_length, output_length), burstgpt (CSV with Timestamp, Request tokens, Response "
                        "tokens), azure (CSV with TIMESTAMP, ContextTokens, GeneratedTokens), session (a directory "
                        "with session.toml); set the format explicitly if the file is one of them")


def test_missing_and_unknown_columns(tmp_path: Path) -> None:
    p = write(tmp_path / "b.csv", "Timestamp,Model,Request tokens,Total tokens\n1,ChatGPT,3,4\n")
    assert error(p, "burstgpt") == (
        f"{p}:1: missing column 'Response tokens'; a burstgpt trace has the columns Timestamp, Request tokens, "
        "Response tokens (may also have Log Type, Model, Total tokens), this one has 'Timestamp', 'Model', "
        "'Request tokens', 'Total tokens'")
    q = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,Region\n2023-11-16 18:15:46,3,1,eu\n")
    assert error(q) == (f"{q}:1: unknown column 'Region'; a azure trace has the columns TIMESTAMP, ContextTokens, "
                        "GeneratedTokens, this one has 'TIMESTAMP', 'ContextTokens', 'GeneratedTokens', 'Region'")
    r = mooncake(tmp_path, [{"timestamp": 0, "input_length": 3, "output_length": 1},
                            {"timestamp": 5, "input": 3, "output_length": 1}])
    assert error(r) == (f"{r}:2: missing input_length; a Mooncake line needs timestamp, input_length, "
                        "output_length (and optionally hash_ids), found 'timestamp', 'input', 'output_length'")


def test_bad_values(tmp_path: Path) -> None:
    cases = [  # (row, message after "FILE:2: ")
        ("abc,ChatGPT,3,1,4,API log", "Timestamp is 'abc', not a number; fix or drop that row"),
        ("-1,ChatGPT,3,1,4,API log", "Timestamp is -1, a negative time; timestamps must be 0 or later"),
        ("1,ChatGPT,0,1,1,API log", "Request tokens is 0; it must be from 1 to 100,000,000; fix or drop that row"),
        ("1,ChatGPT,3.5,1,4,API log", "Request tokens is '3.5', not a whole number of tokens; fix or drop that row"),
        ("1,ChatGPT,3,-2,1,API log", "Response tokens is -2; it must be from 0 to 100,000,000; fix or drop that row"),
        ("1,ChatGPT,3,1,4", "5 fields where the header has 6; fix that row"),
    ]
    for i, (row, msg) in enumerate(cases):
        p = write(tmp_path / f"b{i}.csv", BURST_HEADER + row + "\n")
        assert error(p) == f"{p}:2: {msg}"
    a = write(tmp_path / "a.csv", AZURE_HEADER + "2023-11-16 18:15:46,3,1\nyesterday,3,1\n")
    assert error(a) == (f"{a}:3: TIMESTAMP is 'yesterday', not a date and time like 2023-11-16 18:15:46.6805900; "
                        "fix or drop that row")
    m = write(tmp_path / "m.jsonl", '{"timestamp": 0, "input_length": 3, "output_length": 1}\n{"timestamp": \n')
    assert error(m) == f"{m}:2: not JSON (Expecting value); each line of a Mooncake trace is one JSON object"
    h = mooncake(tmp_path, [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1, "x"]}], "h.jsonl")
    assert error(h) == f"{h}:1: hash_ids must be a list of integers (one per prompt block); fix or drop that row"
    z = mooncake(tmp_path, [{"timestamp": 0, "input_length": 0, "output_length": 1}], "z.jsonl")
    assert error(z) == f"{z}:1: input_length is 0; it must be from 1 to 100,000,000; fix or drop that row"


def test_unsorted_timestamps_name_both_lines(tmp_path: Path) -> None:
    m = mooncake(tmp_path, [{"timestamp": t, "input_length": 3, "output_length": 1} for t in (0, 2000, 1500)])
    assert error(m) == (f"{m}:3: time goes backwards: timestamp 1500 comes after 2000 on line 2; "
                        "sort the trace by its timestamps")
    b = write(tmp_path / "b.csv", BURST_HEADER + "10,ChatGPT,3,1,4,API log\n\n4,ChatGPT,3,1,4,API log\n")
    assert error(b) == (f"{b}:4: time goes backwards: Timestamp '4' comes after '10' on line 2; "
                        "sort the trace by its timestamps")
    a = write(tmp_path / "a.csv", AZURE_HEADER + "2023-11-16 18:15:46,3,1\n2023-11-16 18:15:45,3,1\n")
    assert error(a) == (f"{a}:3: time goes backwards: TIMESTAMP '2023-11-16 18:15:45' comes after "
                        "'2023-11-16 18:15:46' on line 2; sort the trace by its timestamps")


def test_missing_file(tmp_path: Path) -> None:
    p = str(tmp_path / "nope.jsonl")
    assert error(p) == f"{p}: cannot read it (No such file or directory); check the path"
    with pytest.raises(ServescopeError) as e:
        read_trace(p, where="sweep.toml: workload 'replay'")
    assert str(e.value) == f"sweep.toml: workload 'replay': {p}: cannot read it (No such file or directory); check the path"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list('{}[]":,0123456789.-e\nabTXsR \x00é')), max_size=120),
       header=st.sampled_from(["", BURST_HEADER, AZURE_HEADER, '{"timestamp": 0, "input_length": 3, '
                                                               '"output_length": 1}\n']),
       ext=st.sampled_from([".jsonl", ".csv", ".txt"]))
def test_fuzz_never_anything_but_one_line(tmp_path: Path, text: str, header: str, ext: str) -> None:
    p = write(tmp_path / f"fuzz{ext}", header + text)
    try:
        t = read_trace(p)
    except ServescopeError as e:
        assert "\n" not in str(e) and str(e).startswith(p)
        return
    assert t.requests and all(r.t_s >= 0 and r.input_tokens >= 1 and r.output_tokens >= 0 for r in t.requests)
    assert all(a.t_s <= b.t_s for a, b in zip(t.requests, t.requests[1:], strict=False))


def test_100k_rows_read(tmp_path: Path) -> None:
    p = write(tmp_path / "big.csv", BURST_HEADER + "".join(f"{i // 3},ChatGPT,{1 + i % 900},{i % 300},0,API log\n"
                                                           for i in range(100_000)))
    start = time.perf_counter()
    t = read_trace(p)
    # about 0.3 s on one core (benchmarks/loop_timings.py prints it); this ceiling only catches a read that
    # grew worse than linear, which would take far longer on 100k rows however busy the host
    assert time.perf_counter() - start < 60
    assert len(t.requests) == 100_000 and t.requests[-1].t_s == 33_333.0


# ---- prompts ----

async def test_prompts_share_prefixes_where_hash_ids_do() -> None:
    block = 8
    reqs = (TraceRequest(0.0, 30, 5, (1, 2, 3, 4)),  # 1 BOS + 3 full blocks + 5: the 4th id is the partial block
            TraceRequest(1.0, 29, 6, (1, 2, 5, 6)),  # 1 + 3 blocks + 4
            TraceRequest(2.0, 12, 7, (1, 7)),  # 1 + 1 block + 3
            TraceRequest(3.0, 25, 8, (1, 2, 3, 9)),  # 1 + 3 blocks + 0: a full last block, nothing after it
            TraceRequest(4.0, 40, 9))  # no hash ids: all its own
    t = Trace("t.jsonl", "mooncake", reqs, block_tokens=block)
    tok = FakeTok()
    ps = await trace_prompts(t, tok, seed=3)
    assert [p.input_tokens for p in ps] == [30, 29, 12, 25, 40]
    assert [await tok.count_prompt(p.text) for p in ps] == [30, 29, 12, 25, 40]
    assert [p.output_tokens for p in ps] == [5, 6, 7, 8, 9]
    ids = [await tok.encode(p.text) for p in ps]
    assert ids[0][:16] == ids[1][:16] and ids[0][16:24] != ids[1][16:24]  # blocks 1, 2 shared; 3 vs 5 not
    assert ids[0][:8] == ids[2][:8] and ids[0][8:16] != ids[2][8:16]  # block 1 shared; 2 vs 7 not
    assert ids[3][:24] == ids[0][:24]  # blocks 1, 2, 3 shared
    assert ps[3].text.startswith(ps[0].text[: len(ps[3].text) - 1])  # byte for byte
    assert ids[4][:4] != ids[0][:4]
    assert ids[0][24:] != ids[3][24:]  # the tail is the request's own
    again = await trace_prompts(t, FakeTok(), seed=3)
    assert [p.text for p in again] == [p.text for p in ps]
    other = await trace_prompts(t, FakeTok(), seed=4)
    assert other[0].text != ps[0].text


async def test_prompts_without_hash_ids_are_all_different_and_exact(tmp_path: Path) -> None:
    p = write(tmp_path / "a.csv", AZURE_HEADER + "".join(f"2023-11-16 18:15:{i:02d},{3 + 7 * i},{i}\n"
                                                         for i in range(60)))
    t = read_trace(p)
    tok = FakeTok()
    for chat, count, overhead in ((False, tok.count_prompt, 1), (True, tok.count_chat, 7)):
        ps = await trace_prompts(t, tok, seed=0, chat=chat)
        assert [await count(x.text) for x in ps] == [x.input_tokens for x in ps]  # what it says it is
        assert [x.input_tokens for x in ps if x.input_tokens > overhead] == \
            [r.input_tokens for r in t.requests if r.input_tokens > overhead]  # and what the trace asked
        firsts = [tuple((await tok.encode(x.text))[:3]) for x in ps if x.input_tokens >= 10]
        assert len(set(firsts)) == len(firsts)  # no two prompts start alike
    ps = await trace_prompts(t, tok, seed=0)
    assert [x.input_tokens for x in ps] == [r.input_tokens for r in t.requests]


class MarkTok(FakeTok):
    """Each decoded text starts with a mark that counts as a token: joined blocks count more than their ids."""

    async def decode(self, ids: list[int]) -> str:
        return "@ " + await super().decode(ids)


async def test_prompts_stay_exact_when_joined_blocks_count_more() -> None:
    reqs = (TraceRequest(0.0, 26, 1, (1, 2, 3, 4)),  # 3 blocks would be 27 tokens with their marks: shares 2
            TraceRequest(1.0, 40, 1, (1, 2, 3, 9)))  # room for all 3
    tok = MarkTok()
    ps = await trace_prompts(Trace("t.jsonl", "mooncake", reqs, block_tokens=8), tok, seed=0)
    assert [p.input_tokens for p in ps] == [26, 40]
    assert [await tok.count_prompt(p.text) for p in ps] == [26, 40]
    a, b = [await tok.encode(p.text) for p in ps]
    assert a[:18] == b[:18] and a[18:27] != b[18:27]  # two blocks of 8 and their marks shared, not the third
