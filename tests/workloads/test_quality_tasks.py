"""The quality probe's task generator: formats the simulator will parse (its regexes written out here), answers
recomputed from the prompts, determinism, padding to the context, needle depths, a user's JSONL, the corpus."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.core.quality import TASKS, TaskItem, score
from servescope.workloads.quality import (
    CORPUS_SOURCE,
    DIVERGENCE_PROMPTS,
    build_tasks,
    corpus_text,
    estimate_tokens,
    load_user_tasks,
)

# what the simulator matches
ARITH = re.compile(r"What is (-?\d+) ([+*-]) (-?\d+)\? Reply with the number only\.")
KEY_Q = re.compile(r"What is the value of key (\S+)\?")
NEEDLE_Q = re.compile(r"What is the secret code\?")
NEEDLE = re.compile(r"The secret code is (\d+)\.")
JSON_Q = re.compile(r'Return a JSON object with the key "(\w+)" set to the integer (-?\d+)')

CONTEXTS = (256, 1000, 4096, 20000)


@pytest.fixture(scope="module")
def items() -> list[TaskItem]:
    return build_tasks(TASKS, CONTEXTS, n=20, seed=0)


def by(items: list[TaskItem], task: str, context: int | None = None) -> list[TaskItem]:
    return [i for i in items if i.task == task and (context is None or i.context == context)]


def expected(item: TaskItem) -> str:
    """The answer, worked out from the prompt alone the way the simulator will."""
    if item.task == "arithmetic":
        m = ARITH.search(item.prompt)
        assert m
        a, op, b = int(m[1]), m[2], int(m[3])
        return str(a + b if op == "+" else a - b if op == "-" else a * b)
    if item.task == "retrieval":
        m = KEY_Q.search(item.prompt)
        assert m
        values = re.findall(rf"key {re.escape(m[1])}: value (\d+)", item.prompt)
        assert len(values) == 1
        return values[0]
    if item.task == "needle":
        assert NEEDLE_Q.search(item.prompt)
        codes = NEEDLE.findall(item.prompt)
        assert len(codes) == 1
        return codes[0]
    m = JSON_Q.search(item.prompt)
    assert m
    return json.dumps({m[1]: int(m[2])})


def test_counts_and_order(items: list[TaskItem]) -> None:
    assert [i.task for i in items] == (["arithmetic"] * 20 + ["retrieval"] * 80 + ["needle"] * 80 + ["json"] * 20)
    assert {i.context for i in by(items, "arithmetic") + by(items, "json")} == {0}
    for task in ("retrieval", "needle"):
        assert [i.context for i in by(items, task)] == [c for c in CONTEXTS for _ in range(20)]


def test_formats_and_answers(items: list[TaskItem]) -> None:
    for item in items:
        assert item.answer == expected(item), item.prompt[-200:]
        assert item.prompt.endswith("\nAnswer:")
    for item in by(items, "arithmetic"):
        m = ARITH.search(item.prompt)
        assert m and item.prompt == f"Question: What is {m[1]} {m[2]} {m[3]}? Reply with the number only.\nAnswer:"
        a, op, b = int(m[1]), m[2], int(m[3])
        assert 2 <= a <= 9999 and 2 <= b <= (99 if op == "*" else 9999)
        assert (item.scorer, item.max_tokens) == ("exact", 8)
    assert {ARITH.search(i.prompt)[2] for i in by(items, "arithmetic")} == {"+", "-", "*"}  # type: ignore[index]
    for item in by(items, "json"):
        m = JSON_Q.search(item.prompt)
        assert m and item.prompt == (f'Return a JSON object with the key "{m[1]}" set to the integer {m[2]} and '
                                     "nothing else.\nAnswer:")
        assert m[1].islower() and 0 <= int(m[2]) <= 9999
        assert (item.scorer, item.max_tokens) == ("json", 16)
    for item in by(items, "retrieval"):
        head, *lines, question, answer = item.prompt.split("\n")
        assert head == "Below is a list of keys and values." and answer == "Answer:"
        assert re.fullmatch(r"Question: What is the value of key k-[0-9a-f]{6}\? Reply with the value only\.", question)
        pairs = [re.fullmatch(r"key (k-[0-9a-f]{6}): value (\d{6})", line) for line in lines]
        assert all(pairs)
        keys = [p[1] for p in pairs if p]
        assert len(set(keys)) == len(keys)
        assert all(100000 <= int(p[2]) <= 999999 for p in pairs if p)
        assert (item.scorer, item.max_tokens) == ("exact", 8)
    for item in by(items, "needle"):
        assert item.prompt.endswith("\nQuestion: What is the secret code? Reply with the code only.\nAnswer:")
        assert re.fullmatch(r"\d{7}", item.answer)
        assert (item.scorer, item.max_tokens) == ("exact", 8)


def test_score_right_and_wrong(items: list[TaskItem]) -> None:
    for item in items:
        assert score(item, item.answer)
        if item.scorer == "json":
            ((key, value),) = json.loads(item.answer).items()
            wrong = json.dumps({key: value + 1})
        else:
            wrong = str(int(item.answer) + 1)
        assert not score(item, wrong)


def test_deterministic_in_seed() -> None:
    a = build_tasks(TASKS, (512, 2048), n=5, seed=7)
    assert a == build_tasks(TASKS, (512, 2048), n=5, seed=7)
    b = build_tasks(TASKS, (512, 2048), n=5, seed=8)
    assert len(a) == len(b)
    for task in TASKS:
        assert [i.prompt for i in by(a, task)] != [i.prompt for i in by(b, task)]
    # an item depends on its own (seed, task, context, index), not on what else was asked for
    assert by(a, "needle", 2048) == by(build_tasks(["needle"], [2048], n=5, seed=7), "needle")
    assert [i.prompt for i in build_tasks(["json"], [], n=20)] == [i.prompt for i in build_tasks(["json"], [], n=20)]


def test_items_differ(items: list[TaskItem]) -> None:
    for task in TASKS:
        prompts = [i.prompt for i in by(items, task)]
        assert len(set(prompts)) >= len(prompts) - 1


@pytest.mark.parametrize("task", ["retrieval", "needle"])
def test_padded_to_the_context(items: list[TaskItem], task: str) -> None:
    for item in by(items, task):
        n = estimate_tokens(item.prompt)
        assert 0.9 * item.context <= n <= item.context, (item.context, n)


def test_padded_with_another_counter() -> None:
    def count(text: str) -> int:  # denser than the default: a token per 3 characters or per punctuation mark
        return len(re.findall(r"\w{1,3}|[^\w\s]", text))

    for item in build_tasks(["retrieval", "needle"], [300, 5000], n=6, count_tokens=count):
        assert 0.9 * item.context <= count(item.prompt) <= item.context
        assert item.answer == expected(item)


def test_needle_between_sentences_and_spread(items: list[TaskItem]) -> None:
    words = set(corpus_text().split())
    for context in (4096, 20000):
        depths = []
        for item in by(items, "needle", context):
            filler = item.prompt.removesuffix("\nQuestion: What is the secret code? Reply with the code only.\nAnswer:")
            m = NEEDLE.search(filler)
            assert m
            before, after = filler[: m.start()], filler[m.end() :]
            assert re.search(r"[.!?][\"')]* $", before), before[-80:]  # after the end of a filler sentence
            assert after.startswith(" ")  # and before the next one
            rest = (before + after[1:]).split()
            assert all(w in words for w in rest)  # filler is corpus text
            depths.append(len(before) / (len(before) + len(after)))
        assert all(0.03 <= d <= 0.97 for d in depths), depths
        assert min(depths) < 0.15 and max(depths) > 0.85
        assert sum(1 for d in depths if d < 0.5) >= 6 and sum(1 for d in depths if d > 0.5) >= 6


def test_needle_filler_cycles_the_corpus(items: list[TaskItem]) -> None:
    big = by(items, "needle", 20000)[0]
    assert len(big.prompt) > 2 * len(corpus_text())


def test_retrieval_probes_different_depths(items: list[TaskItem]) -> None:
    depths = []
    for item in by(items, "retrieval", 4096):
        key = KEY_Q.search(item.prompt)[1]  # type: ignore[index]
        keys = re.findall(r"key (k-[0-9a-f]{6}): value", item.prompt)
        depths.append(keys.index(key) / len(keys))
    assert min(depths) < 0.1 and max(depths) > 0.9
    assert len(set(depths)) == len(depths)


def test_unknown_task() -> None:
    with pytest.raises(ServescopeError) as e:
        build_tasks(["arithmetic", "trivia"], [1024])
    assert "trivia" in str(e.value) and all(t in str(e.value) for t in TASKS) and "\n" not in str(e.value)


def test_bad_arguments() -> None:
    with pytest.raises(ServescopeError, match="context"):
        build_tasks(["needle"], [])
    with pytest.raises(ServescopeError, match="too short"):
        build_tasks(["retrieval"], [10])
    with pytest.raises(ServescopeError, match="at least 1"):
        build_tasks(["json"], [], n=0)
    assert len(build_tasks(["arithmetic"], [], n=3)) == 3  # short tasks need no context


def test_divergence_prompts() -> None:
    assert len(DIVERGENCE_PROMPTS) == 16 and len(set(DIVERGENCE_PROMPTS)) == 16
    assert all(p == p.strip() and "\n" not in p and 3 <= len(p.split()) <= 30 for p in DIVERGENCE_PROMPTS)


def test_corpus() -> None:
    text = corpus_text()
    assert len(text.split()) >= 1500
    assert text.startswith("In Congress, July 4, 1776.")
    assert "Four score and seven years ago" in text and "shall not perish from the earth." in text
    assert "secret code" not in text and not re.search(r"\d{7}", text)
    assert "Declaration of Independence" in CORPUS_SOURCE and "public domain" in CORPUS_SOURCE
    assert (Path(__file__).parents[2] / "servescope/workloads/data/SOURCE.md").is_file()


# --------------------------------------------------------------------------------------------------------
# a user's JSONL
# --------------------------------------------------------------------------------------------------------


def test_user_tasks(tmp_path: Path) -> None:
    path = tmp_path / "mmlu.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n\n'
                    '{"prompt": "Pick one: A or B", "answer": "B", "scorer": "choice", "max_tokens": 4}\r\n'
                    '  \n{"prompt": "Name a colour", "answer": "(red|blue)", "scorer": "regex", "id": 3}\n',
                    encoding="utf-8")
    items = load_user_tasks(path)
    assert items == [
        TaskItem(task="mmlu", prompt="2+2?", answer="4", scorer="exact", max_tokens=16),
        TaskItem(task="mmlu", prompt="Pick one: A or B", answer="B", scorer="choice", max_tokens=4),
        TaskItem(task="mmlu", prompt="Name a colour", answer="(red|blue)", scorer="regex", max_tokens=16),
    ]
    assert score(items[1], "B) because") and score(items[2], "I like blue")
    assert load_user_tasks(str(path)) == items


@pytest.mark.parametrize(("line", "words"), [
    ('{"prompt": "x", "answer": ', "not valid JSON"),
    ('["x", "4"]', "expected a JSON object"),
    ('{"answer": "4"}', 'missing "prompt"'),
    ('{"prompt": "x"}', 'missing "answer"'),
    ('{"prompt": "", "answer": "4"}', '"prompt" is empty'),
    ('{"prompt": "x", "answer": "  "}', '"answer" is empty'),
    ('{"prompt": "x", "answer": 4}', '"answer": "4"'),
    ('{"prompt": "x", "answer": "4", "scorer": "fuzzy"}', "unknown scorer 'fuzzy'"),
    ('{"prompt": "x", "answer": "(4", "scorer": "regex"}', "not a valid regular expression"),
    ('{"prompt": "x", "answer": "4", "max_tokens": 0}', '"max_tokens"'),
    ('{"prompt": "x", "answer": "4", "max_tokens": "8"}', '"max_tokens"'),
])
def test_user_tasks_bad_line(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "ok", "answer": "1"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ServescopeError) as e:
        load_user_tasks(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: ") and words in msg and "; " in msg and "\n" not in msg, msg


def test_user_tasks_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ServescopeError, match="no such task file") as e:
        load_user_tasks(tmp_path / "nope.jsonl")
    assert str(tmp_path / "nope.jsonl") in str(e.value)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ServescopeError, match="no tasks") as e:
        load_user_tasks(empty)
    assert str(empty) in str(e.value)
    with pytest.raises(ServescopeError, match="cannot read"):
        load_user_tasks(tmp_path)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ServescopeError, match="UTF-8"):
        load_user_tasks(binary)


_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 40) | st.text(max_size=8),
                       lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                       max_leaves=6)
_objects = st.fixed_dictionaries({}, optional={"prompt": _values, "answer": _values | st.sampled_from(["(", "a+", "4"]),
                                               "scorer": _values | st.sampled_from(["exact", "choice", "regex", "json"]),
                                               "max_tokens": _values})
_lines = st.one_of(_objects.map(json.dumps), st.text(max_size=30))


@settings(max_examples=150, deadline=None)
@given(st.lists(_lines, max_size=4))
def test_user_tasks_never_crash(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    try:
        items = load_user_tasks(path)
    except ServescopeError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e)
        return
    assert items and all(i.task == "fuzz" and i.prompt.strip() and i.answer.strip() for i in items)
    assert all(i.scorer in ("exact", "choice", "regex") and i.max_tokens >= 1 for i in items)
