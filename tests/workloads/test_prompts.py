"""Prompt lengths with a fake tokenizer (the boundary): a BPE-like tokenizer whose counts change when
text is cut mid-word, so the builder's adjust loop is exercised. Real tokenizers are covered by the
integration tests against vLLM."""

import json
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.workloads.prompts import build_prompts
from servescope.workloads.spec import LengthDist, Workload


class FakeTok:
    exact = True
    name = "fake"

    def __init__(self) -> None:
        self.vocab: list[str] = []
        self.ids: dict[str, int] = {}

    def _pieces(self, text: str) -> list[str]:
        out = []
        for w in text.split(" "):
            if not w:
                continue
            out += [w[i : i + 4] for i in range(0, len(w), 4)]  # long words split in 4-char pieces
        return out

    async def encode(self, text: str) -> list[int]:
        ids = []
        for p in self._pieces(text):
            if p not in self.ids:
                self.ids[p] = len(self.vocab)
                self.vocab.append(p)
            ids.append(self.ids[p])
        return ids

    async def decode(self, ids: list[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)

    async def count_prompt(self, text: str) -> int:
        return 1 + len(self._pieces(text))  # BOS

    async def count_chat(self, text: str) -> int:
        return 7 + len(self._pieces(text))  # template tokens


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_exact_lengths(api: str) -> None:
    w = Workload("t", api, LengthDist("uniform", min=20, max=400), LengthDist("fixed", value=9), seed=3)
    tok = FakeTok()
    ps = await build_prompts(w, 30, "cell0", tok)
    count = tok.count_chat if api == "chat" else tok.count_prompt
    for p in ps:
        assert p.input_tokens == await count(p.text)
        assert p.output_tokens == 9
    again = await build_prompts(w, 30, "cell0", FakeTok())
    assert [p.text for p in again] == [p.text for p in ps]  # deterministic
    other = await build_prompts(w, 30, "cell1", FakeTok())
    assert [p.text for p in other] != [p.text for p in ps]  # cells differ (no cross-cell prefix hits)
    lengths = [p.input_tokens for p in ps]
    assert min(lengths) >= 20 and max(lengths) <= 400 and len(set(lengths)) > 10


@pytest.mark.parametrize("inp, n", [(32, 400), (256, 200), (8192, 16)])
async def test_no_prompt_twice_in_a_cell(inp: int, n: int) -> None:
    # a repeated prompt is a prefix-cache hit the workload never asked for (short prompts, many requests: the
    # corpus once held too few windows for them)
    w = Workload("t", "completions", LengthDist("fixed", value=inp), LengthDist("fixed", value=9), seed=8)
    ps = await build_prompts(w, n, "cell0", FakeTok())
    assert len({p.text for p in ps}) == n
    assert len({p.text.split(" ")[0] + " " + " ".join(p.text.split(" ")[1:4]) for p in ps}) > 0.9 * n


async def test_shared_prefix() -> None:
    w = Workload("t", "completions", LengthDist("fixed", value=200), LengthDist("fixed", value=5), prefix_tokens=50)
    tok = FakeTok()
    ps = await build_prompts(w, 5, "cell0", tok)
    heads = {tuple((await tok.encode(p.text))[:50]) for p in ps}
    assert len(heads) == 1
    assert all(p.input_tokens == 200 for p in ps)


async def test_dataset(tmp_path: Path) -> None:
    data = [{"conversations": [{"from": "human", "value": f"question number {i} " * 3},
                               {"from": "gpt", "value": "answer " * (i + 2)}]} for i in range(5)]
    f = tmp_path / "d.json"
    f.write_text(json.dumps(data))
    w = Workload("d", "chat", dataset=str(f), output_from_dataset=True)
    ps = await build_prompts(w, 8, "c", FakeTok())
    assert all(p.text.startswith("question number") for p in ps)
    tok = FakeTok()
    for p in ps:
        i = int(p.text.split()[2])
        assert p.output_tokens == len(await tok.encode("answer " * (i + 2)))  # the reply's own length


async def test_dataset_errors(tmp_path: Path) -> None:
    w = Workload("d", "chat", dataset=str(tmp_path / "missing.json"))
    with pytest.raises(ServescopeError, match="no such file"):
        await build_prompts(w, 1, "c", FakeTok())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "sharegpt"}))
    with pytest.raises(ServescopeError, match="not ShareGPT-shaped"):
        await build_prompts(Workload("d", "chat", dataset=str(bad)), 1, "c", FakeTok())
