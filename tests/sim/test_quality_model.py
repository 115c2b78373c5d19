"""The simulator's answers for the quality probe: the toy model's log-probabilities in vLLM 0.32's shapes, prompt
log-probabilities, exact-answer tasks, a profile's degradation, and the fast path left as it was."""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from servescope.sim import tasks
from servescope.sim.launcher import SimHandle, start_sim
from servescope.sim.model import NUM_LISTED, ToyModel
from servescope.sim.profile import PROFILES_DIR, ProfileError, QualitySpec, list_profiles, load_profile
from servescope.sim.tokenizer import BOS_ID, Tokenizer
from tests.sim.sse import stream

try:
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

DEGRADED = {"error_rate": 0.2, "long_context_error_per_16k": 0.5, "logit_noise": 0.3, "seed": 11}
PROMPTS = [
    "The history of the city begins with a small settlement on the river",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a kingdom far away, there lived",
    "The three most important ideas in thermodynamics are",
]


def _profile_file(directory: Path, quality: dict[str, Any]) -> Path:
    data = tomllib.loads((PROFILES_DIR / "tiny.toml").read_text(encoding="utf-8"))
    data["quality"] = quality
    path = directory / "tiny-degraded.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with start_sim(str(_profile_file(tmp_path_factory.mktemp("profile"), DEGRADED))) as handle:
        yield handle


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _greedy(url: str, prompt: str, n: int = 24, k: int = 5) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": k, "ignore_eos": True}
    choice: dict[str, Any] = _post(url, "/v1/completions", body)["choices"][0]
    return choice


# --- vLLM's shapes ------------------------------------------------------------------------------------------


def test_completion_logprobs_shape(sim: SimHandle) -> None:
    choice = _greedy(sim.url, PROMPTS[0], n=16, k=5)
    lp = choice["logprobs"]
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    tokens, chosen, tops, offsets = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]
    assert len(tokens) == len(chosen) == len(tops) == len(offsets) == 16
    assert "".join(tokens) == choice["text"]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(16)]
    assert choice["finish_reason"] == "length" and choice["prompt_logprobs"] is None
    for tok, c, top in zip(tokens, chosen, tops, strict=True):
        assert len(top) == 5  # greedy: the chosen token is in the top 5, so no sixth entry
        values = list(top.values())
        assert values == sorted(values, reverse=True)
        assert max(top, key=top.__getitem__) == tok and top[tok] == c  # greedy = the argmax
        assert all(v <= 0 for v in values) and sum(math.exp(v) for v in values) <= 1.0


def test_logprobs_zero_lists_the_chosen_token_alone(sim: SimHandle) -> None:
    lp = _greedy(sim.url, PROMPTS[1], n=4, k=0)["logprobs"]
    assert all(list(top) == [tok] for top, tok in zip(lp["top_logprobs"], lp["tokens"], strict=True))


async def test_streamed_logprobs_are_the_full_ones(sim: SimHandle) -> None:
    full = _greedy(sim.url, PROMPTS[2], n=12, k=3)
    body = {"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0, "logprobs": 3, "ignore_eos": True,
            "stream": True}
    events, done, _ = await stream(sim.url, "/v1/completions", body)
    assert done and len(events) == 12
    merged: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for ev in events:
        lp = ev["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 1 and lp["tokens"][0] == ev["choices"][0]["text"]
        for key, values in lp.items():
            merged[key] += values
    assert merged == full["logprobs"]


async def test_chat_logprobs_shape(sim: SimHandle) -> None:
    body = {"messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 3, "ignore_eos": True}
    choice = _post(sim.url, "/v1/chat/completions", body)["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 8 and "".join(e["token"] for e in content) == choice["message"]["content"]
    for e in content:
        assert list(e) == ["token", "logprob", "bytes", "top_logprobs"]
        assert e["bytes"] == list(e["token"].encode())
        top = e["top_logprobs"]
        assert len(top) == 3 and all(list(t) == ["token", "logprob", "bytes"] for t in top)
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["token"] == e["token"] and top[0]["logprob"] == e["logprob"]
    events, done, _ = await stream(sim.url, "/v1/chat/completions", {**body, "stream": True})
    streamed = [c for ev in events[1:] for c in ev["choices"][0]["logprobs"]["content"]]
    assert done and streamed == content


def test_prompt_logprobs_shape(sim: SimHandle) -> None:
    body = {"prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2, "return_token_ids": True}
    choice = _post(sim.url, "/v1/completions", body)["choices"][0]
    plp, ids = choice["prompt_logprobs"], choice["prompt_token_ids"]
    assert ids == Tokenizer(add_bos_token=True).encode(PROMPTS[0], True)
    assert len(plp) == len(ids) and plp[0] is None
    for i, pos in enumerate(plp[1:], 1):
        assert str(ids[i]) == next(iter(pos))  # the prompt's own token first
        assert 2 <= len(pos) <= 3
        for entry in pos.values():
            assert list(entry) == ["logprob", "rank", "decoded_token"] and entry["logprob"] <= 0
        assert sorted(e["rank"] for e in pos.values() if e["rank"] <= 2) == [1, 2]  # the top 2, the prompt's or not
        best = next(e for e in pos.values() if e["rank"] == 1)
        assert best["logprob"] == max(e["logprob"] for e in pos.values())
    # k = 0: the prompt's token alone; the log-probabilities are the same
    alone = _post(sim.url, "/v1/completions", {**body, "prompt_logprobs": 0})["choices"][0]["prompt_logprobs"]
    assert [None if p is None else list(p) for p in alone] == [None] + [[str(t)] for t in ids[1:]]
    assert all(a[str(t)] == p[str(t)] for a, p, t in zip(alone[1:], plp[1:], ids[1:], strict=True))


def test_long_prompt_logprobs(sim: SimHandle) -> None:
    """Planned off the event loop (a long plan), the same answer as any other."""
    prompt = " ".join(PROMPTS) * 60
    body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0, "return_token_ids": True}
    choice = _post(sim.url, "/v1/completions", body)["choices"][0]
    plp, ids = choice["prompt_logprobs"], choice["prompt_token_ids"]
    assert len(ids) > 1000 and len(plp) == len(ids)
    lps = [pos[str(t)]["logprob"] for pos, t in zip(plp[1:], ids[1:], strict=True)]
    assert all(-40 < lp < 0 for lp in lps)
    model = ToyModel()
    assert lps[500] == model.dist_at(ids, 501).logprob(ids[501])


def test_chat_prompt_logprobs_at_the_top_level(sim: SimHandle) -> None:
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2, "prompt_logprobs": 1}
    out = _post(sim.url, "/v1/chat/completions", body)
    assert out["prompt_logprobs"][0] is None
    assert len(out["prompt_logprobs"]) == out["usage"]["prompt_tokens"]
    assert "prompt_logprobs" not in out["choices"][0]


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, "Requested sample logprobs of 32000"),
    ("/v1/completions", {"prompt": "x", "logprobs": -2}, "`logprobs` must be a positive value or -1."),
    ("/v1/completions", {"prompt": "x", "logprobs": "5"}, "`logprobs` must be an integer."),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 30}, "Requested prompt logprobs of 30"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     "when using `top_logprobs`, `logprobs` must be set to true."),
])
def test_bad_logprob_parameters_are_400(sim: SimHandle, path: str, body: dict[str, Any], message: str) -> None:
    r = httpx.post(sim.url + path, json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


# --- determinism and degradation -------------------------------------------------------------------------------


def test_two_requests_give_the_same_answer(sim: SimHandle) -> None:
    body = {"prompt": PROMPTS[1], "max_tokens": 20, "temperature": 0, "logprobs": 4, "prompt_logprobs": 1}
    a = _post(sim.url, "/v1/completions", body)["choices"][0]
    b = _post(sim.url, "/v1/completions", body)["choices"][0]
    assert a == b


def test_degraded_profile_differs(sim: SimHandle, degraded: SimHandle) -> None:
    diverged = 0
    kl = 0.0
    for prompt in PROMPTS:
        ref = _greedy(sim.url, prompt, n=48)["logprobs"]
        deg = _greedy(degraded.url, prompt, n=48)["logprobs"]
        assert ref["top_logprobs"][0] != deg["top_logprobs"][0]  # same context, other values
        first = next((i for i, (a, b) in enumerate(zip(ref["tokens"], deg["tokens"], strict=True)) if a != b), None)
        if first is not None:
            diverged += 1
        for p, q in zip(ref["top_logprobs"][:first], deg["top_logprobs"][:first], strict=True):
            kl += sum(math.exp(lp) * (lp - q.get(t, -30.0)) for t, lp in p.items())
    assert diverged >= 1 and kl > 0


def test_undegraded_profiles_agree_exactly(tmp_path: Path, sim: SimHandle) -> None:
    """The base model is one for all profiles: another with no noise answers exactly as tiny does."""
    with start_sim(str(_profile_file(tmp_path, {"seed": 99}))) as other:
        assert _greedy(other.url, PROMPTS[0])["logprobs"] == _greedy(sim.url, PROMPTS[0])["logprobs"]


# --- tasks -------------------------------------------------------------------------------------------------------


def _task_prompts(rng: random.Random) -> list[tuple[str, str, str]]:
    """(task, prompt, right answer), one of each format."""
    a, b = rng.randint(-999, 9999), rng.randint(2, 999)
    op = rng.choice("+-*")
    value = rng.randint(100000, 999999)
    key = f"k-{rng.getrandbits(24):06x}"
    lines = "".join(f"key k-{i:06x}: value {rng.randint(100000, 999999)}\n" for i in range(20))
    code = rng.randint(10000, 99999)
    n = rng.randint(-500, 5000)
    return [
        ("arithmetic", f"Question: What is {a} {op} {b}? Reply with the number only.\nAnswer:",
         str(a + b if op == "+" else a - b if op == "-" else a * b)),
        ("retrieval", f"Below is a list of keys and values.\n{lines}key {key}: value {value}\n{lines}"
         f"Question: What is the value of key {key}? Reply with the value only.\nAnswer:", str(value)),
        ("needle", f"It was a quiet day. The secret code is {code}. Nothing else happened.\n"
         "Question: What is the secret code? Reply with the code only.\nAnswer:", str(code)),
        ("json", f'Return a JSON object with the key "total" set to the integer {n} and nothing else.\nAnswer:',
         json.dumps({"total": n})),
    ]


def test_each_task_is_answered_right(sim: SimHandle) -> None:
    tok = Tokenizer()
    for task, prompt, right in _task_prompts(random.Random(5)):
        out = _post(sim.url, "/v1/completions", {"prompt": prompt, "max_tokens": 32, "temperature": 0})
        choice = out["choices"][0]
        assert choice["text"] == " " + right, task
        assert choice["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == len(tok.spans(right))
        chat = _post(sim.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                       "max_tokens": 32, "temperature": 0})
        assert chat["choices"][0]["message"]["content"] == right, task


async def test_task_answer_streams_with_its_logprobs(sim: SimHandle) -> None:
    prompt = 'Return a JSON object with the key "answer" set to the integer 1234 and nothing else.\nAnswer:'
    body = {"prompt": prompt, "max_tokens": 32, "temperature": 0, "logprobs": 2, "stream": True}
    events, done, _ = await stream(sim.url, "/v1/completions", body)
    assert done and "".join(ev["choices"][0]["text"] for ev in events) == ' {"answer": 1234}'
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    for ev in events:
        lp = ev["choices"][0]["logprobs"]
        top = lp["top_logprobs"][0]
        assert max(top, key=top.__getitem__) == lp["tokens"][0] and top[lp["tokens"][0]] > math.log(0.5)


def test_max_tokens_cuts_an_answer_and_ignore_eos_goes_on(sim: SimHandle) -> None:
    prompt = 'Return a JSON object with the key "answer" set to the integer 1234 and nothing else.\nAnswer:'
    cut = _post(sim.url, "/v1/completions", {"prompt": prompt, "max_tokens": 3})["choices"][0]
    assert cut["text"] == ' {"answer' and cut["finish_reason"] == "length"
    more = _post(sim.url, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "ignore_eos": True})
    assert more["choices"][0]["text"].startswith(' {"answer": 1234}') and more["usage"]["completion_tokens"] == 20


@pytest.mark.slow
def test_error_rate_over_many_prompts(sim: SimHandle, degraded: SimHandle) -> None:
    rng = random.Random(2024)
    items = [t for _ in range(50) for t in _task_prompts(rng)]  # 200 prompts, 50 of each task

    async def answers(url: str) -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            async def one(prompt: str) -> str:
                r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0})
                return str(r.json()["choices"][0]["text"]).strip()

            return list(await asyncio.gather(*(one(p) for _, p, _ in items)))

    ref = asyncio.run(answers(sim.url))
    assert ref == [right for _, _, right in items]
    deg = asyncio.run(answers(degraded.url))
    wrong = sum(a != right for a, (_, _, right) in zip(deg, items, strict=True))
    # error_rate 0.2, plus 0.5 per 16K tokens for the ~500-token retrieval prompts (+0.015 on a quarter)
    expected = 200 * 0.2 + 50 * 0.5 * 500 / 16384
    assert abs(wrong - expected) < 4 * math.sqrt(200 * 0.2 * 0.8), (wrong, expected)
    for a, (task, _, right) in zip(deg, items, strict=True):
        if a != right:  # wrong by one digit, never garbage
            if task == "json":
                a, right = str(json.loads(a)["total"]), str(json.loads(right)["total"])
            assert len(a) == len(right) and sum(x != y for x, y in zip(a, right, strict=True)) == 1


# --- the fast path is unchanged ----------------------------------------------------------------------------------


def test_other_requests_keep_their_tokens(sim: SimHandle) -> None:
    """Saved from the simulator before the quality answers existed (same prompts, seeds and lengths)."""
    out = _post(sim.url, "/v1/completions", {"prompt": "hello world " * 50, "max_tokens": 32, "seed": 7})
    assert out["choices"][0]["text"] == (
        " biguwi bijoki bagago bigano beniro besazu bisomo baguka bavadu bobaji beradi bahape bapuno bahoka bipeza"
        " behumo beqayo betite bequlu")
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 19
    out = _post(sim.url, "/v1/completions", {"prompt": "What is the meaning of life?", "max_tokens": 40, "seed": 3,
                                             "temperature": 0})
    assert out["choices"][0]["text"].split()[:6] == ["bagimu", "bebori", "bobije", "baweru", "bajuno", "bayawe"]
    assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["logprobs"] is None
    out = _post(sim.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is the secret code? none"}],
                                                  "max_tokens": 25, "seed": 1})
    assert out["choices"][0]["message"]["content"].split()[:4] == ["bihaho", "batici", "biyaci", "bateju"]
    assert "prompt_logprobs" not in out and out["usage"]["completion_tokens"] == 25


# --- the pieces, without a server ----------------------------------------------------------------------------------


def test_model_distributions_are_proper_and_seeded() -> None:
    base, same, noisy = ToyModel(), ToyModel(0.0, 5), ToyModel(0.3, 5)
    rng = random.Random(1)
    for _ in range(200):
        a, b, pos = rng.randrange(64, 32000), rng.randrange(64, 32000), rng.randrange(1, 10000)
        d = base.dist(a, b, pos)
        assert abs(d.total_prob() - 1.0) < 1e-9 and len(d.ids) == NUM_LISTED == len(set(d.ids))
        assert d.lps == sorted(d.lps, reverse=True) and d.lps[0] < 0
        assert d.rank(d.ids[0]) == 1 and d.rank(1) == NUM_LISTED + 1 and d.logprob(1) == d.tail_lp
        assert same.dist(a, b, pos).lps == d.lps
        assert noisy.dist(a, b, pos).lps != d.lps and abs(noisy.dist(a, b, pos).total_prob() - 1.0) < 1e-9
        forced = base.dist(a, b, pos, force=d.ids[3])
        assert forced.ids[0] == d.ids[3] and forced.lps[0] > math.log(0.9) and len(forced.ids) == NUM_LISTED
    # a leading BOS is no context: a profile that adds one scores a text as one that does not
    ids = Tokenizer().encode(PROMPTS[0])
    assert all(base.dist_at([BOS_ID, *ids], i + 1).lps == base.dist_at(ids, i).lps for i in range(len(ids) + 1))


def test_tasks_found_and_corrupted() -> None:
    assert tasks.find_task("What is 7 * -6? Reply with the number only.") == tasks.Task("arithmetic", "-42", "-42")
    assert tasks.find_task("What is the value of key a.b?") is None  # no such key line before it
    assert tasks.find_task("key a.b: value 12\nWhat is the value of key a.b?") == tasks.Task("retrieval", "12", "12")
    assert tasks.find_task("What is the secret code?\nThe secret code is 5.") is None  # the code comes after
    assert tasks.find_task("What is the meaning of life? Reply with the number only.") is None
    assert tasks.find_task('Return a JSON object with the key "x" set to the integer 007') == tasks.Task(
        "json", '{"x": 7}', "7", "x")
    rng = random.Random(3)
    for _ in range(500):
        n = str(rng.randint(-10**6, 10**6))
        wrong = tasks.corrupt(n, rng.getrandbits(64))
        assert int(wrong) != int(n) and len(str(int(wrong))) == len(n)


def test_long_context_raises_the_error_rate() -> None:
    task = tasks.Task("needle", "123", "123")
    for tokens, rate in ((0, 0.05), (16384, 0.15), (65536, 0.45)):
        wrong = sum(not tasks.answer(task, f"prompt {i}", tokens, 0.05, 0.1, 0)[1] for i in range(4000))
        assert abs(wrong / 4000 - rate) < 4 * math.sqrt(rate * (1 - rate) / 4000)
    short = tasks.Task("arithmetic", "4", "4")
    assert all(tasks.answer(short, f"p {i}", 65536, 0.0, 1.0, 0) == ("4", True) for i in range(100))


# --- profiles --------------------------------------------------------------------------------------------------


def test_quality_table_defaults_and_errors(tmp_path: Path) -> None:
    data = tomllib.loads((PROFILES_DIR / "tiny.toml").read_text(encoding="utf-8"))
    del data["quality"]
    path = tmp_path / "plain.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    assert load_profile(str(path)).quality == QualitySpec()
    for bad, why in (({"error_rte": 0.1}, "unknown key(s) error_rte"), ({"logit_noise": "high"}, "logit_noise must be"),
                     ({"error_rate": 1.5}, "error_rate must be at most 1"), ({"seed": 1.5}, "seed must be an integer"),
                     ({"long_context_error_per_16k": -1}, "must be a number >= 0")):
        with pytest.raises(ProfileError, match=r"\[quality\]: .*" + why.replace("(", r"\(").replace(")", r"\)")):
            load_profile(str(_profile_file(tmp_path, bad)))


def test_shipped_profiles_degrade_by_quantization() -> None:
    q = {name: load_profile(name).quality for name in list_profiles()}
    assert q["tiny"] == q["max-speed"] == QualitySpec()
    fp8 = [v for k, v in q.items() if "fp8" in k]
    int4 = [v for k, v in q.items() if "int4" in k or "awq" in k]
    assert fp8 and int4
    assert max(v.logit_noise for v in fp8) < min(v.logit_noise for v in int4)
    assert max(v.error_rate for v in fp8) < min(v.error_rate for v in int4)
