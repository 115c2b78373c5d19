"""A workload's LoRA adapters, speculation acceptance, temperature and prefix-cache target (workloads/adapters.py,
workloads/spec.py): the TOML forms, one-line errors, the draw of each prompt's adapter."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.workloads.spec import Workload, load_toml


def test_weights_and_the_base_model() -> None:
    w = Workload.from_dict({"name": "mix", "adapters": {"sql": 0.6, "chat": 0.3, "base": 0.1}})
    assert w.adapters is not None and w.adapters.adapters == ("sql", "chat")
    picks = w.adapters.assign(10_000, "cell0")
    counts = Counter(picks)
    assert counts["sql"] / 1e4 == pytest.approx(0.6, abs=0.02) and counts[None] / 1e4 == pytest.approx(0.1, abs=0.01)
    assert picks == w.adapters.assign(10_000, "cell0") and picks != w.adapters.assign(10_000, "cell1")
    assert "LoRA sql 60%, chat 30%, base 10%" in w.shape()
    assert Workload.from_dict(w.to_dict()) == w


def test_a_zipf_spread_over_n_adapters() -> None:
    w = Workload.from_dict({"name": "z", "adapters": {"zipf": 1.1, "count": 10}})
    a = w.adapters
    assert a is not None and a.names == tuple(f"lora-{k}" for k in range(1, 11))
    assert a.share("lora-1") / a.share("lora-2") == pytest.approx(2 ** 1.1)
    assert w.to_dict()["adapters"] == {"zipf": 1.1, "count": 10}
    named = Workload.from_dict({"name": "z", "adapters": {"zipf": 1.0, "count": 3, "prefix": "ft"}})
    assert named.adapters is not None and named.adapters.adapters == ("ft-1", "ft-2", "ft-3")
    assert Workload.from_dict(named.to_dict()) == named


@pytest.mark.parametrize("table, says", [
    ({"adapters": {}}, "give a table of weights"),
    ({"adapters": "sql"}, "give a table of weights"),
    ({"adapters": {"sql": -1}}, "a weight must be a number >= 0"),
    ({"adapters": {"sql": 0, "chat": 0}}, "every weight is 0"),
    ({"adapters": {"zipf": 1.1}}, "count must be a whole number"),
    ({"adapters": {"zipf": 1.1, "count": 3, "cuont": 2}}, "did you mean 'count'"),
    ({"adapters": {"zipf": -1, "count": 3}}, "zipf must be a number >= 0"),
    ({"adapters": {"sql": 1}, "kind": "conversation", "api": "chat"}, "adapters is only for kind = \"single\""),
    ({"spec_acceptance": 1.5}, "spec_acceptance: must be a number from 0 to 1"),
    ({"temperature": -1}, "temperature must be a number >= 0"),
    ({"prefix_cache_hit_rate": 1.0}, "must be below 1"),
    ({"prefix_cache_hit_rate": 0.5, "prefix_tokens": 10}, "not both"),
    ({"prefix_cache_hit_rate": 0.9, "input_tokens": {"dist": "uniform", "min": 10, "max": 1000}},
     "not below the shortest input"),
])
def test_bad_tables_are_one_line(table: dict[str, object], says: str) -> None:
    with pytest.raises(ServescopeError, match=None) as e:
        Workload.from_dict({"name": "w", **table}, "w.toml")
    assert says in e.value.message and "\n" not in e.value.message, e.value.message


def test_a_prefix_cache_target_sizes_the_shared_prefix(tmp_path: Path) -> None:
    f = tmp_path / "w.toml"
    f.write_text('[workload]\nname = "half"\ninput_tokens = 512\noutput_tokens = 32\nprefix_cache_hit_rate = 0.5\n'
                 'temperature = 0\nspec_acceptance = 0.7\n')
    [w] = load_toml(f)
    assert w.prefix_tokens == 256 and w.prefix_cache_hit_rate == 0.5
    assert (w.temperature, w.spec_acceptance) == (0.0, 0.7)
    d = w.to_dict()
    assert "prefix_tokens" not in d and d["prefix_cache_hit_rate"] == 0.5
    assert Workload.from_dict(d) == w


def test_the_docs_workloads_load(tmp_path: Path) -> None:
    """docs/speculation.md's workload files load as written."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "speculation.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    names = []
    for i, block in enumerate(blocks):
        f = tmp_path / f"w{i}.toml"
        f.write_text(block)
        names += [w.name for w in load_toml(f)]
    assert names == ["chat-spec", "one-adapter", "ten-adapters", "rag-half"]
