"""Workload files and datasets are validated when the sweep is built (issue 11, items 10 and 11): a key typo
is an error with a suggestion, lengths are whole and in range, and a dataset that is missing, not JSON or
not ShareGPT-shaped stops the sweep before any server or session exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.spec import SweepSpec
from servescope.workloads.spec import Workload, load_toml, read_sharegpt


def test_key_typo_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    f = tmp_path / "w.toml"
    f.write_text('[workload]\nname = "x"\ninput_tokns = 100\n')
    with pytest.raises(ServescopeError) as e:
        load_toml(f)
    assert e.value.message == f"{f}: unknown key 'input_tokns'; did you mean 'input_tokens'?"


def test_typo_inside_a_length_table(tmp_path: Path) -> None:
    f = tmp_path / "w.toml"
    f.write_text('[workload]\nname = "x"\ninput_tokens = { dist = "fixed", vaule = 3 }\n')
    with pytest.raises(ServescopeError, match="unknown key 'vaule'; did you mean 'value'"):
        load_toml(f)


@pytest.mark.parametrize("value, needle", [
    ("inf", "lengths must be integers"),
    ("nan", "lengths must be integers"),
    ("1.5", "lengths must be integers"),
    ('"12"', "lengths must be integers"),
    ("true", "expected a number of tokens"),
    ("0", "out of range"),
    ("-4", "out of range"),
    ("1000000000000", "out of range"),
    ('{ dist = "normal", mean = inf }', "finite number"),
    ('{ dist = "normal", mean = 100, std = -1 }', "finite number"),
    ('{ dist = "normal", mean = 1e30, std = 1 }', "must be between 1 and"),
    ('{ dist = "uniform", min = 10, max = 5 }', "max (5) is below min (10)"),
])
def test_lengths_are_whole_and_in_range(tmp_path: Path, value: str, needle: str) -> None:
    f = tmp_path / "w.toml"
    f.write_text(f'[workload]\nname = "x"\ninput_tokens = {value}\n')
    with pytest.raises(ServescopeError) as e:
        load_toml(f)
    assert needle in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("body, needle", [
    ('prefix_tokens = inf', "prefix_tokens: lengths must be integers"),
    ('seed = 1.5', "seed must be an integer"),
    ('dataset = 5', "dataset must be a path"),
    ('description = [1]', "description must be a text"),
])
def test_other_values(tmp_path: Path, body: str, needle: str) -> None:
    f = tmp_path / "w.toml"
    f.write_text(f'[workload]\nname = "x"\n{body}\n')
    with pytest.raises(ServescopeError, match=".") as e:
        load_toml(f)
    assert needle in e.value.message


def sharegpt(n: int = 3) -> list[dict[str, object]]:
    return [{"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
            for i in range(n)]


@pytest.mark.parametrize("content, needle", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    (json.dumps({"not": "sharegpt"}), "not ShareGPT-shaped"),
    (json.dumps([{"conversations": [{"from": "human", "value": "only one turn"}]}]), "not ShareGPT-shaped"),
    ("dir", "is a directory"),
])
def test_bad_dataset_fails_when_the_sweep_is_built(tmp_path: Path, content: str | None, needle: str) -> None:
    ds = tmp_path / "data.json"
    if content == "dir":
        ds.mkdir()
    elif content is not None:
        ds.write_text(content)
    wf = tmp_path / "w.toml"
    wf.write_text('[workload]\nname = "ds"\napi = "chat"\ndataset = "data.json"\n')
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('workloads = ["w.toml"]\n[target]\nurl = "http://127.0.0.1:9"\n')
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_toml(sweep)
    assert needle in e.value.message and "workload 'ds'" in e.value.message and "\n" not in e.value.message


def test_good_dataset_is_read_once_per_version(tmp_path: Path) -> None:
    ds = tmp_path / "d.json"
    ds.write_text(json.dumps(sharegpt(3)))
    w = Workload("d", "chat", dataset=str(ds)).check()
    assert len(read_sharegpt(w.dataset)) == 3
    ds.write_text(json.dumps(sharegpt(5)))  # changed on disk: read again
    assert len(read_sharegpt(str(ds))) == 5
