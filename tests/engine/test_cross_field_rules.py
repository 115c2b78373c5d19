"""The rules across a sweep's options live in SweepSpec.check alone: one bad combination gets one message from
`servescope run` flags, from a sweep file (`--sweep FILE.toml`) and from the app's Compose form (which shows
it under the field it names; tests/tui/test_compose_rules.py types it there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servescope.__main__ import main
from servescope.engine.spec import SweepConflict, SweepSpec
from servescope.workloads.spec import PRESETS

SHAREGPT = [PRESETS["sharegpt"]]
# the form as the Compose screen fills it: every field it shows, as typed
FORM = {"concurrency": "", "rates": "", "requests": "", "duration_s": "", "variants": "", "launch": "",
        "url": "sim://", "api_key_env": "OPENAI_API_KEY"}

# (flags, the same sweep as a file, the same as the form's fields, the field the form's error is under, the rule)
CASES = [
    (["-c", "1,4", "--rate", "2"], "[load]\nconcurrency = [1, 4]\nrates = [2.0]\n",
     {"concurrency": "1,4", "rates": "2"}, "rates",
     "give concurrency (closed loop) or rates (open loop), not both"),
    (["--server-variant", "--max-num-seqs 4"], '[server]\nvariants = [{args = "--max-num-seqs 4"}]\n',
     {"variants": "--max-num-seqs 4"}, "variants",
     "server variants need a launch command: servescope can only relaunch a server it started"),
    (["--launch", "vllm serve m", "--server-variant", "--port x"],
     '[server]\nlaunch = "vllm serve m"\nvariants = [{args = "--port x"}]\n',
     {"launch": "vllm serve m", "variants": "--port x"}, "variants",
     "the server variant's --port 'x' is not a number"),
    (["--rate", "2", "--pattern", "1x for 5s, 4x", "--arrival", "constant", "--burstiness", "2"],
     '[load]\nrates = [2.0]\npattern = "1x for 5s, 4x"\narrival = "constant"\nburstiness = 2.0\n',
     {"rates": "2", "pattern": "1x for 5s, 4x", "arrival": "constant", "burstiness": "2"}, "burstiness",
     "burstiness shapes gamma arrivals, but arrival is 'constant'; add arrival = \"gamma\" (--arrival gamma) or "
     "drop burstiness"),
]


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What `servescope ARGV` prints on stderr when it refuses (before any server starts)."""
    assert main(list(argv)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(("flags", "toml", "form", "field", "rule"), CASES, ids=["conc-rates", "variants",
                                                                                  "bad-variant", "burstiness"])
def test_one_bad_combination_one_message(flags: list[str], toml: str, form: dict[str, str], field: str, rule: str,
                                         tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVESCOPE_URL", raising=False)
    # the CLI's flags
    assert cli_error(capsys, "run", "-n", "1", *flags) == f"servescope run: error: flags: {rule}"
    # a sweep file, run as it is
    path = tmp_path / "bad.toml"
    path.write_text('workloads = ["sharegpt"]\n' + toml)
    assert cli_error(capsys, "run", "--sweep", str(path)) == f"servescope run: error: {path}: {rule}"
    with pytest.raises(SweepConflict) as e:
        SweepSpec.from_toml(path)
    assert e.value.rule == rule
    # the Compose form: the rule alone, under the field to change
    spec, errors = SweepSpec.from_form({**FORM, **form, "workloads": SHAREGPT})
    assert spec is None and errors == {field: rule}


def test_a_file_and_a_flag_that_conflict_say_so_as_the_form_does(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A file's open-loop pattern, then `-c 4` (which replaces the file's rates): the pattern has no rate left."""
    path = tmp_path / "spike.toml"
    path.write_text('workloads = ["sharegpt"]\n[load]\nrates = [2.0]\npattern = "1x for 5s, 4x"\n')
    rule = "a pattern multiplies an open loop's rate; give rates (--rate 2,5) or drop the pattern"
    assert cli_error(capsys, "run", "--sweep", str(path), "-c", "4") == f"servescope run: error: flags: {rule}"
    spec, errors = SweepSpec.from_form({**FORM, "concurrency": "4", "workloads": SHAREGPT},
                                       base=SweepSpec.from_toml(path))
    assert spec is None and errors == {"rates": rule}


def test_both_flags_with_a_file_are_refused_not_dropped(tmp_path: Path) -> None:
    """-c and --rate over a file each replace the file's other one; given together, check() refuses them."""
    import argparse

    from servescope.engine.spec import add_flags, add_workload_flag

    p = argparse.ArgumentParser()
    add_workload_flag(p)
    add_flags(p)
    path = tmp_path / "s.toml"
    path.write_text('workloads = ["sharegpt"]\n[load]\nconcurrency = [1]\n')
    with pytest.raises(SweepConflict, match=re.escape("not both")):
        SweepSpec.from_args(p.parse_args(["-c", "2", "--rate", "3"]), SweepSpec.from_toml(path))


def test_what_the_form_leaves_empty_means_what_a_missing_flag_means(monkeypatch: pytest.MonkeyPatch) -> None:
    """No concurrency and no rates, no requests and no duration: not an error in either, the same defaults."""
    import argparse

    from servescope.engine.spec import add_flags, add_workload_flag

    monkeypatch.delenv("SERVESCOPE_URL", raising=False)
    p = argparse.ArgumentParser()
    add_workload_flag(p)
    add_flags(p)
    flags = SweepSpec.from_args(p.parse_args([]))
    form, errors = SweepSpec.from_form({**FORM, "workloads": SHAREGPT})
    assert errors == {} and form is not None
    assert (form.concurrency, form.rates, form.requests, form.duration_s) == (None, None, None, None)
    assert (flags.concurrency, flags.rates, flags.requests, flags.duration_s) == (None, None, None, None)
