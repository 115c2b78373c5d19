import random
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.workloads.spec import PRESETS, LengthDist, load_toml, preset_names, resolve

SCHEMA = """
[workload]
name = "rag-1k"
api = "completions"            # or "chat"
input_tokens = { dist = "fixed", value = 1024 }
output_tokens = { dist = "uniform", min = 200, max = 300 }   # also "normal" (mean, std, min, max)
prefix_tokens = 0              # tokens shared by every prompt (prefix caching)
thinking = false
dataset = ""                   # optional ShareGPT-format JSON file: real prompts, real lengths
seed = 0
"""


def test_issue_schema_loads(tmp_path: Path) -> None:
    f = tmp_path / "rag.toml"
    f.write_text(SCHEMA)
    [w] = load_toml(f)
    assert w.name == "rag-1k" and w.api == "completions"
    assert w.input_tokens == LengthDist("fixed", value=1024)
    assert (w.output_tokens.min, w.output_tokens.max) == (200, 300)
    assert w.thinking is False and w.prefix_tokens == 0 and w.seed == 0


def test_distributions_deterministic_and_in_range() -> None:
    u = LengthDist("uniform", min=200, max=300)
    n = LengthDist("normal", mean=500, std=100, min=300, max=700)
    a = [u.sample(random.Random(1)) for _ in range(3)]
    assert a == [u.sample(random.Random(1)) for _ in range(3)]
    rng = random.Random(7)
    us = [u.sample(rng) for _ in range(2000)]
    ns = [n.sample(rng) for _ in range(2000)]
    assert min(us) == 200 and max(us) == 300
    assert min(ns) >= 300 and max(ns) <= 700
    assert abs(sum(ns) / len(ns) - 500) < 10


def test_toml_error_has_file_line_col(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('[workload]\nname = "x"\ninput_tokens = { dist = "fixed", value = }\n')
    with pytest.raises(ServescopeError) as e:
        load_toml(f)
    assert str(e.value).startswith(f"{f}:3:")


@pytest.mark.parametrize(
    "body, needle",
    [
        ('name = "x"\napi = "grpc"', "api must be"),
        ('name = "x"\ninput_tokens = { dist = "zipf" }', "unknown dist"),
        ('name = "x"\ninput_tokens = { dist = "uniform", min = 5 }', "needs the key 'max'"),
        ('name = "x"\ninput_tokens = 100\nprefix_tokens = 100', "prefix_tokens"),
        ('api = "chat"', "needs a name"),
    ],
)
def test_bad_workload_values(tmp_path: Path, body: str, needle: str) -> None:
    f = tmp_path / "w.toml"
    f.write_text("[workload]\n" + body + "\n")
    with pytest.raises(ServescopeError, match=needle):
        load_toml(f)


def test_presets_and_context_sweep() -> None:
    assert {"sharegpt", "balanced1k1k", "random", "longout", "longin", "sharegpt-think", "sustained-c32"} <= set(PRESETS)
    assert PRESETS["random"].input_tokens.value == 6000 and PRESETS["random"].output_tokens.value == 512
    assert PRESETS["sharegpt-think"].thinking is True
    ws = resolve("context-sweep")
    assert [w.input_tokens.value for w in ws] == [1024, 4096, 8192, 16384, 32768]
    assert "context-sweep" in preset_names()


def test_unknown_workload_lists_presets() -> None:
    with pytest.raises(ServescopeError) as e:
        resolve("sharegtp")
    assert "sharegpt" in str(e.value) and "sharegtp" in str(e.value)
