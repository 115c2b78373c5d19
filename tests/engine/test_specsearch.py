"""Speculative decoding as tune's searched setting and in the twin (engine/specsearch.py): the launch command's
--speculative-config rewritten per setting, the search refused in one line where it cannot run, the twin's
profile speculating with the acceptance a session measured."""

from __future__ import annotations

import json
import shlex

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.specsearch import (
    SPEC_TOKENS_FLAG,
    acceptance_from_rate,
    check_spec_search,
    spec_server_config,
    with_speculation,
)
from servescope.engine.tune import Setting, parse_search
from servescope.engine.tunemodel import apply_setting
from servescope.engine.tunerun import serve_line
from servescope.sim.profile import load_profile
from servescope.sim.specdecode import expected_accepted

LAUNCH = "vllm serve M --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' --port 9"


def test_a_setting_sets_the_configs_tokens() -> None:
    d = parse_search("num-speculative-tokens=1|2|4")
    assert d.flag == SPEC_TOKENS_FLAG and d.values == ("1", "2", "4")
    line = serve_line(LAUNCH, Setting(((SPEC_TOKENS_FLAG, "4"), ("--max-num-seqs", "64"))))
    words = shlex.split(line)
    assert SPEC_TOKENS_FLAG not in words and words[words.index("--max-num-seqs") + 1] == "64"
    assert json.loads(words[words.index("--speculative-config") + 1]) == {"method": "ngram", "num_speculative_tokens": 4}
    joined = serve_line("vllm serve M --speculative-config='{\"method\":\"eagle\",\"num_speculative_tokens\":2}'",
                        Setting(((SPEC_TOKENS_FLAG, "5"),)))
    assert json.loads(shlex.split(joined)[-1].split("=", 1)[1])["num_speculative_tokens"] == 5


@pytest.mark.parametrize("launch, values, says", [
    ("vllm serve M", ["2"], "add one, e.g. --speculative-config"),
    (LAUNCH, ["two"], "'two' is not a number of tokens"),
    ("vllm serve M --speculative-config '{\"method\": \"magic\", \"num_speculative_tokens\": 3}'", ["2"], "magic"),
])
def test_a_search_that_cannot_run_is_one_line(launch: str, values: list[str], says: str) -> None:
    with pytest.raises(ServescopeError) as e:
        check_spec_search(launch, values)
    assert says in e.value.message and "\n" not in e.value.message
    check_spec_search(LAUNCH, ["1", "4"])


def test_the_twins_profile_speculates_as_measured() -> None:
    for p in (0.3, 0.6, 0.9):
        rate = expected_accepted(p, 3) / 3
        assert acceptance_from_rate(rate, 3) == pytest.approx(p, abs=1e-6)
    base = load_profile("tiny")
    config = spec_server_config({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}'})
    assert config == spec_server_config(["--speculative-config", config or ""])
    prof, said = with_speculation(base, config, [expected_accepted(0.6, 3) / 3])
    e = prof.engine
    assert (e.speculative_method, e.num_speculative_tokens, e.spec_acceptance) == ("ngram", 3, pytest.approx(0.6, 1e-3))
    assert "measured" in said
    assert with_speculation(base, None, []) == (base, "")
    four, unknown = apply_setting(prof, Setting(((SPEC_TOKENS_FLAG, "4"),)))
    assert four.engine.num_speculative_tokens == 4 and unknown == []
    _, not_modelled = apply_setting(base, Setting(((SPEC_TOKENS_FLAG, "4"),)))  # no speculation to change
    assert not_modelled == [SPEC_TOKENS_FLAG]
