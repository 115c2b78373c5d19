"""Multi-turn workloads: the `[workload] kind = "conversation"` / `"agent"` schema (round trip, bad input in one
line), the presets, the context check, how a cell's turns fall into conversations, and their prompts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from servescope.__main__ import main
from servescope.core.client import RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.load import Load
from servescope.engine.plan import Cell, fits, pool_size
from servescope.workloads.conversation import layout, mark_turns
from servescope.workloads.prompts import build_prompts
from servescope.workloads.spec import PRESETS, LengthDist, SecondsDist, Workload, from_saved, load_toml
from tests.workloads.test_prompts import FakeTok

CONTRACT = """
[workload]
name = "chat5"
kind = "conversation"          # or "agent", "trace"; absent = today's single-turn workloads
turns = { dist = "fixed", value = 5 }
input_tokens = { dist = "uniform", min = 200, max = 500 }   # new user tokens per turn
output_tokens = { dist = "fixed", value = 256 }
think_time_s = { dist = "fixed", value = 0 }
prefix_tokens = 0
"""


def _load(tmp_path: Path, body: str) -> Workload:
    f = tmp_path / "w.toml"
    f.write_text(body)
    [w] = load_toml(f)
    return w


def test_the_contract_loads_and_round_trips(tmp_path: Path) -> None:
    w = _load(tmp_path, CONTRACT)
    assert (w.kind, w.api, w.turns, w.input_tokens) == ("conversation", "chat", LengthDist("fixed", value=5),
                                                        LengthDist("uniform", min=200, max=500))
    assert w.think_time_s == SecondsDist("fixed", value=0.0) and w.prefix_tokens == 0 and w.multi_turn
    assert Workload.from_dict(w.to_dict()) == w
    assert from_saved(w.to_dict()) == w
    assert w.shape() == "5 turns x in 200-500 (uniform) new / out 256, think 0 s (conversation)"


def test_an_agent_round_trips_and_says_its_shape(tmp_path: Path) -> None:
    w = _load(tmp_path, '[workload]\nname = "a"\nkind = "agent"\ncontext_tokens = 8192\ncalls = 12\n'
                        'tool_result_tokens = { dist = "uniform", min = 50, max = 400 }\noutput_tokens = 32\n'
                        'think_time_s = { dist = "uniform", min = 0.5, max = 2 }\n')
    assert (w.kind, w.context_tokens, w.calls.value, w.rounds.value, w.shared_tokens) == ("agent", 8192, 12, 12, 8192)
    assert Workload.from_dict(w.to_dict()) == w and "prefix_tokens" not in w.to_dict()
    assert w.shape() == ("context 8192 + task 256, 12 calls x tool result 50-400 (uniform) / out 32, "
                         "think 0.5-2 s (uniform) (agent)")


def test_single_turn_workloads_are_unchanged() -> None:
    d = PRESETS["sharegpt"].to_dict()
    assert "kind" not in d and "turns" not in d and not PRESETS["sharegpt"].multi_turn


def test_the_presets_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert PRESETS["chat-multiturn"].kind == "conversation" and PRESETS["chat-multiturn"].turns.value == 5
    assert PRESETS["coding-agent"].kind == "agent" and 8192 <= PRESETS["coding-agent"].context_tokens <= 32768
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    assert "chat-multiturn" in out and "coding-agent" in out and "5 turns" in out


@pytest.mark.parametrize("body, message", [
    ('kind = "trace"', 'kind = "trace" needs trace = "FILE" (a Mooncake JSONL, BurstGPT or Azure CSV, or a session '
                       'directory)'),
    ('kind = "chat"', "unknown kind 'chat'; use one of single, conversation, agent, trace"),
    ("turns = 5", 'turns is only for kind = "conversation" workloads (this one is kind = "single")'),
    ('kind = "conversation"\ncalls = 3',
     'calls is only for kind = "agent" workloads (this one is kind = "conversation")'),
    ('kind = "agent"\nprefix_tokens = 10', 'prefix_tokens is only for kind = "single" or kind = "conversation" '
                                          'workloads (this one is kind = "agent")'),
    ('kind = "conversation"\napi = "completions"',
     'kind = "conversation" needs api = "chat" (each turn resends the history as chat messages)'),
    ('kind = "conversation"\nturns = 0', "turns: 0 is out of range; numbers of turns must be from 1 to 10,000"),
    ('kind = "conversation"\nturns = 2.5', "turns: must be a whole number of turns, not 2.5"),
    ('kind = "conversation"\nturns = 20000', "turns: 20000 is out of range; numbers of turns must be from 1 to 10,000"),
    ('kind = "agent"\ncalls = { dist = "normal", mean = 9000, std = 900 }', "calls (11700) must be at most 10,000"),
    ('kind = "conversation"\nthink_time_s = -1', "think_time_s: value: must be a finite number, at least 0"),
    ('kind = "conversation"\nthink_time_s = { dist = "uniform", min = 3, max = 1 }',
     "think_time_s: max (1) is below min (3)"),
    ('kind = "conversation"\nthink_time_s = "1s"', "think_time_s: expected a number of seconds or a table like "
                                                    '{ dist = "uniform", min = 1, max = 5 }'),
    ('kind = "conversation"\nturn = 5', "unknown key 'turn'; did you mean 'turns'?"),
])
def test_bad_input_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ServescopeError) as e:
        _load(tmp_path, f'[workload]\nname = "x"\n{body}\n')
    assert str(e.value) == f"{tmp_path / 'w.toml'}: {message}"
    assert "\n" not in str(e.value)


def test_a_dataset_brings_its_own_turns(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text("[]")
    with pytest.raises(ServescopeError, match="with a dataset, the turns are each conversation's own"):
        _load(tmp_path, '[workload]\nname = "x"\nkind = "conversation"\ndataset = "d.json"\nturns = 3\n')


def test_a_conversation_longer_than_the_context_is_refused_in_one_line() -> None:
    w = PRESETS["chat-multiturn"]
    assert fits(w, 8192) is None
    assert fits(w, 2048) == ("a conversation of up to 5 turns needs up to 3780 tokens (5 x (in 500 + out 256)), "
                             "more than the model's max length 2048")
    w = replace(w, prefix_tokens=1000)
    assert fits(w, 4096) == ("a conversation of up to 5 turns needs up to 4780 tokens (1000 shared + 5 x (in 500 + "
                             "out 256)), more than the model's max length 4096")
    assert fits(PRESETS["coding-agent"], 8192) == (
        "an agent session of up to 8 calls needs up to 24152 tokens (16384 shared + in 256 + 7 x in 1000 + 8 x "
        "out 64), more than the model's max length 8192")
    assert fits(PRESETS["coding-agent"], 32768) is None


def test_the_pool_has_room_for_a_conversation_the_warmup_began() -> None:
    cell = Cell(0, PRESETS["chat-multiturn"], Load(concurrency=2), 10, None, 0)
    assert pool_size(cell) == 10 and pool_size(replace(cell, warmup=2)) == 15


def test_turns_fall_into_conversations_the_same_way_every_time() -> None:
    w = replace(PRESETS["chat-multiturn"], turns=LengthDist("uniform", min=1, max=6),
                think_time_s=SecondsDist("uniform", min=1.0, max=2.0))
    sizes = layout(w, "cell0", 40)
    assert sum(sizes) == 40 and all(1 <= s <= 6 for s in sizes) and layout(w, "cell0", 40) == sizes
    specs = mark_turns(w, "cell0", [RequestSpec("chat", str(i), 5, 5) for i in range(40)])
    assert [s.prompt for s in specs] == [str(i) for i in range(40)]
    assert [s.turn for s in specs] == [t for n in sizes for t in range(1, n + 1)]
    assert [s.conversation for s in specs] == [c for c, n in enumerate(sizes) for _ in range(n)]
    assert all((s.think_s == 0) == (s.turn == 1) and s.think_s <= 2.0 for s in specs)
    assert mark_turns(w, "cell0", specs) == specs  # already marked
    single = [RequestSpec("chat", "x", 5, 5)]
    assert mark_turns(PRESETS["sharegpt"], "cell0", single) == single


async def test_turn_prompts_share_the_system_prompt_and_are_exact() -> None:
    w = replace(PRESETS["chat-multiturn"], prefix_tokens=40, input_tokens=LengthDist("uniform", min=20, max=60))
    tok = FakeTok()
    ps = await build_prompts(w, 12, "cell0", tok)
    sizes = layout(w, "cell0", 12)
    firsts = [t == 1 for n in sizes for t in range(1, n + 1)]
    heads = {tuple((await tok.encode(p.text))[:40]) for p, first in zip(ps, firsts, strict=True) if first}
    assert len(heads) == 1  # every conversation opens with the same system prompt
    for p, first in zip(ps, firsts, strict=True):
        new = p.input_tokens - 7 - (40 if first else 0)  # FakeTok's template is 7 tokens
        assert p.input_tokens == await tok.count_chat(p.text) and 20 <= new <= 60 and p.output_tokens == 256
    assert [p.text for p in await build_prompts(w, 12, "cell0", FakeTok())] == [p.text for p in ps]


async def test_no_turn_message_repeats_another_in_a_cell() -> None:
    # a conversation opening as another did is a prefix-cache hit past the shared system prompt
    w = replace(PRESETS["chat-multiturn"], prefix_tokens=0, input_tokens=LengthDist("fixed", value=32))
    ps = await build_prompts(w, 300, "cell0", FakeTok())
    assert len({p.text for p in ps}) == 300


async def test_a_sharegpt_dataset_gives_every_turn_in_order(tmp_path: Path) -> None:
    data = [{"conversations": [x for t in range(i + 1) for x in (
        {"from": "human", "value": f"conv {i} turn {t + 1}"}, {"from": "gpt", "value": "ok " * (t + 1)})]}
        for i in range(4)]
    f = tmp_path / "d.json"
    f.write_text(json.dumps(data))
    w = _load(tmp_path, f'[workload]\nname = "d"\nkind = "conversation"\ndataset = "{f}"\n')
    assert w.output_from_dataset and w.shape().startswith("as the dataset's conversations turns")
    ps = await build_prompts(w, 15, "cell0", FakeTok())
    specs = mark_turns(w, "cell0", [RequestSpec("chat", p.text, p.input_tokens, p.output_tokens) for p in ps])
    for s, p in zip(specs, ps, strict=True):
        conv, turn = int(p.text.split()[1]), int(p.text.split()[3])
        assert s.turn == turn and turn <= conv + 1 and p.output_tokens == turn  # the reply's own length
    for a, b in zip(specs, specs[1:], strict=False):
        if b.turn > 1:  # every turn of a conversation, in order
            assert b.conversation == a.conversation and b.turn == a.turn + 1
        else:
            assert a.turn == int(ps[specs.index(a)].text.split()[1]) + 1 or a is specs[-1]
