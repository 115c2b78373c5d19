"""Bad input on the command line, every subcommand (issue 44): exit 2 and exactly one line on stderr, naming the
command (`servescope run: error: ...`), never argparse's usage; a mistyped flag's line names the closest valid
flag; and the checks that ran after a simulator started, or after the app took the terminal, run first.

The parser runs in-process (servescope.__main__.main, as the console script calls it): no simulator starts for
any case here, which the `started the simulator` assertions also check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.__main__ import _parser, main
from servescope.sessions.live import RunnerLock
from tests.support.tlscerts import make_certs

ROOT = Path(__file__).resolve().parents[1]
S = "/nonexistent/session"  # a session argument: every case below fails before a session is read

# command -> (a wrong flag, a wrong value, (a mistyped flag, the flag it names)); the argv after `servescope`
CASES: dict[str, tuple[list[str], list[str], tuple[list[str], str]]] = {
    "run": (["run", "--no-such-flag"], ["run", "--requests", "abc"], (["run", "--concurency", "1,4"], "--concurrency")),
    "resume": (["resume", S, "--no-such-flag"], ["resume", S, "--recover-timeout", "abc"],
               (["resume", S, "--recover-timout", "5s"], "--recover-timeout")),
    "workloads": (["workloads", "--no-such-flag"], ["workloads", "/nonexistent/w.toml"],
                  (["workloads", "--hlep"], "--help")),
    "sim": (["sim", "--no-such-flag"], ["sim", "--error-rate", "2"], (["sim", "--eror-rate", "0.1"], "--error-rate")),
    "demo": (["demo", "--no-such-flag"], ["demo", "--profile", "nope"], (["demo", "--profle", "tiny"], "--profile")),
    "sessions": (["sessions", "--no-such-flag"], ["sessions", "--sessions-dir", "/nonexistent/sessions"],
                 (["sessions", "--sesions-dir", "x"], "--sessions-dir")),
    "compare": (["compare", S, S, "--no-such-flag"], ["compare", S, S, "--min-effect", "-1"],
                (["compare", S, S, "--min-efect", "3"], "--min-effect")),
    "gate": (["gate", S, S, "--no-such-flag"], ["gate", S, S, "--fail-on", "bogus"],
             (["gate", S, S, "--fail-onn", "output_tok_s:-5%"], "--fail-on")),
    "report": (["report", S, "--no-such-flag"], ["report", S, "--format", "xml"],
               (["report", S, "--fromat", "md"], "--format")),
    "import": (["import", "x.json", "--no-such-flag"], ["import", "x.json", "--tag", "novalue"],
               (["import", "x.json", "--worklaod", "w"], "--workload")),
    "export": (["export", S, "--format", "llmd-report", "-o", "x", "--no-such-flag"],
               ["export", S, "--format", "csv", "-o", "x"],
               (["export", S, "--fromat", "llmd-report", "-o", "x"], "--format")),
    "quality": (["quality", "--no-such-flag"], ["quality", "--top-k", "50"],
                (["quality", "--contxt", "1024"], "--context")),
    "twin": (["twin", "fit", S, "--no-such-flag"], ["twin", "fit", S, "--server-max-num-seqs", "0"],
             (["twin", "fit", S, "--model-confg", "c.json"], "--model-config")),
    "whatif": (["whatif", S, "--no-such-flag"], ["whatif", S, "--gpu-memory-utilization", "2"],
               (["whatif", S, "--capacty"], "--capacity")),
    "tune": (["tune", "--no-such-flag"], ["tune", "--budget", "abc"], (["tune", "--budgett", "3"], "--budget")),
    "watch": (["watch", "--no-such-flag"], ["watch", "--sessions-dir", "/nonexistent/sessions"],
              (["watch", "--sesions-dir", "x"], "--sessions-dir")),
    "attach": (["attach", "--no-such-flag"], ["attach", "--sessions-dir", "/nonexistent/sessions"],
               (["attach", "--sesions-dir", "x"], "--sessions-dir")),
    "tui": (["tui", "--no-such-flag"], ["tui", "--url", "ftp://x"], (["tui", "--ulr", "http://127.0.0.1:9"], "--url")),
}


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run `servescope ARGV` in-process: exit 2, nothing on stdout, exactly one line on stderr, returned."""
    assert main(list(argv)) == 2, argv
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, (argv, err)
    assert out == "" and "usage:" not in err and "Traceback" not in err, (argv, out, err)
    assert "started the simulator" not in err and "fitting" not in err, (argv, err)
    return lines[0]


def test_the_cases_cover_every_subcommand() -> None:
    """`servescope --help` lists the subcommands: each has its three cases."""
    subs = next(a for a in _parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert sorted(subs.choices) == sorted(CASES)  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", list(CASES))
def test_every_subcommand_refuses_bad_input_in_one_line_naming_itself(command: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    wrong_flag, wrong_value, (mistyped, near) = CASES[command]
    prog = "servescope twin fit" if command == "twin" else f"servescope {command}"
    for argv in (wrong_flag, wrong_value, mistyped):
        line = error_line(capsys, argv)
        assert line.startswith(f"{prog}: error: "), (argv, line)
    assert "unknown flag --no-such-flag" in error_line(capsys, wrong_flag)
    assert line.endswith(f"(did you mean {near}?)"), line  # the mistyped one, checked last


@pytest.mark.parametrize(("argv", "says"), [
    (["tune", "--budget", "abc"], "servescope tune: error: --budget 'abc': not a whole number"),
    (["tune", "--objective", "latency"], "servescope tune: error: --objective 'latency': not one of goodput, capacity"),
    (["compare", S, S, "--min-effect", "-1"], "servescope compare: error: --min-effect: '-1': give a percentage"),
    (["report", S, "--format", "htm"], "servescope report: error: --format 'htm': not one of md, csv, json, html "
                                       "(did you mean html?)"),
    (["sim", "--error-rate", "2"], "servescope sim: error: --error-rate: must be between 0 and 1, got 2"),
    (["comapre", S, S], "servescope: error: unknown command 'comapre' (did you mean compare?)"),
    (["report"], "servescope report: error: missing SESSION; see `servescope report --help`"),
    (["run", "--url"], "servescope run: error: --url needs a value"),
    (["run", "--detatch"], "servescope run: error: unknown flag --detatch (did you mean --detach?)"),
    (["run", "--requets=3"], "servescope run: error: unknown flag --requets (did you mean --requests?)"),
])
def test_argparse_errors_read_as_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's cases: argparse printed its whole usage before each, or the top-level usage and no suggestion."""
    assert error_line(capsys, argv).startswith(says)


def test_the_console_script_says_it_too() -> None:
    """The real program (one subprocess): the exit status and the one line reach a shell as they do in-process."""
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--concurency", "1,4"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == ["servescope run: error: unknown flag --concurency (did you mean --concurrency?)"]


# ---- checks that ran after the simulator started (item 6) -----------------------------------------------------
def test_quality_reads_its_task_files_context_and_reference_before_the_simulator(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"prompt": 1, "answer": "2"}\n')
    q = ["quality", "--url", "sim://tiny", "--sessions-dir", str(tmp_path / "s")]
    assert f"{bad}:1: \"prompt\" is a number" in error_line(capsys, [*q, "--task-file", str(bad)])
    assert "--context 100000 does not fit the model's max_model_len 8192" in error_line(
        capsys, [*q, "--context", "100000"])
    assert "no session '/nonexistent/ref'" in error_line(capsys, [*q, "--reference", "/nonexistent/ref"])
    assert not (tmp_path / "s").exists()


def test_run_or_tune_save_into_a_session_folder_is_refused_before_the_simulator(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "session.toml").write_text("x = 1\n")
    for argv in (["run", "--url", "sim://tiny", "-n", "1", "-c", "1", "--save", str(full)],
                 ["tune", "--url", "sim://tiny", "-c", "1,2", "--save", str(full)]):
        assert error_line(capsys, argv) == (f"servescope {argv[0]}: error: {full} already exists and is not empty; "
                                            "choose another --save directory")


def test_a_second_writer_of_a_running_session_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A live runner holds the session's lock (here this test process holds it, as a runner does): `run --save`
    and `quality --save` into it said so only after the simulator started, and quality wrote into it anyway."""
    live = tmp_path / "live"
    lock = RunnerLock.acquire(live)
    try:
        for argv in (["run", "--url", "sim://tiny", "-n", "1", "-c", "1", "--save", str(live)],
                     ["quality", "--url", "sim://tiny", "--save", str(live)]):
            line = error_line(capsys, argv)
            assert f"{live} is being written by a running sweep" in line and f"servescope attach {live}" in line
    finally:
        lock.release()
    assert sorted(p.name for p in live.iterdir()) == ["runner.lock"]


# ---- item 19 ---------------------------------------------------------------------------------------------------
def test_gate_markdown_under_a_missing_folder_is_refused_and_makes_none(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "no" / "sub" / "x.md"
    line = error_line(capsys, ["gate", S, S, "--fail-on", "output_tok_s:-5%", "--markdown", str(md)])
    assert line.startswith(f"servescope gate: error: --markdown {md}: {md.parent} is not a directory")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("argv", [
    ["run", "--url", "http://127.0.0.1:9", "--insecure"],
    ["run", "--url", "http://127.0.0.1:9", "--ca-cert", "CA"],
    ["run", "--insecure"],  # the simulator: plain HTTP too
    ["quality", "--url", "http://127.0.0.1:9", "--insecure"],
    ["quality", "--url", "http://127.0.0.1:9", "--ca-cert", "CA"],
])
def test_tls_flags_with_a_plain_http_url_are_bad_input(argv: list[str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """They were accepted silently: a user who meant https measured plain HTTP without a word."""
    ca = str(make_certs(tmp_path)[0])
    line = error_line(capsys, [ca if a == "CA" else a for a in argv])
    assert "says how an https:// server's certificate is checked" in line and "has no TLS" in line, line
    assert ("--insecure" in line) == ("--insecure" in argv) and ("--ca-cert" in line) == ("--ca-cert" in argv)


@pytest.mark.parametrize(("flag", "says"), [("--label", "--label: empty"), ("--figures", "--figures: empty"),
                                            ("-o", "-o: empty")])
def test_an_empty_report_flag_is_bad_input(flag: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert error_line(capsys, ["report", str(ROOT / "tests/sessions/old/v2/fp8"), flag, ""]).startswith(
        f"servescope report: error: {says}")


# ---- item 21 ---------------------------------------------------------------------------------------------------
def test_a_sessions_dir_that_does_not_exist_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = error_line(capsys, ["sessions", "--sessions-dir", str(tmp_path / "nope")])
    assert line.startswith(f"servescope sessions: error: --sessions-dir {tmp_path / 'nope'}: no such directory")
    assert main(["sessions", "--sessions-dir", str(tmp_path)]) == 0  # an empty one lists nothing, exit 0
    assert "no sessions in" in capsys.readouterr().out


@pytest.mark.parametrize(("seed", "says"), [("1e23", "'1e23' is not a whole number"),
                                            (str(10**23), f"{10**23} is out of range")])
def test_a_seed_toml_cannot_hold_is_bad_input(seed: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("run", "quality"):
        assert error_line(capsys, [cmd, "--seed", seed]).startswith(f"servescope {cmd}: error: --seed: {says}")


def test_two_workloads_of_one_name_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = tmp_path / "two.toml"
    w.write_text('[[workload]]\nname = "a"\ninput_tokens = 32\noutput_tokens = 8\n'
                 '[[workload]]\nname = "a"\ninput_tokens = 64\noutput_tokens = 8\n')
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('workloads = ["sharegpt"]\n[[workload]]\nname = "sharegpt"\ninput_tokens = 32\n'
                     'output_tokens = 8\n')
    assert "workload 2: named 'a' as workload 1 is" in error_line(capsys, ["run", "-w", str(w)])
    assert "workload 2: named 'a' as workload 1 is" in error_line(capsys, ["workloads", str(w)])
    assert "two workloads are named 'sharegpt'" in error_line(capsys, ["run", "--sweep", str(sweep)])
    assert "two workloads are named 'sharegpt'" in error_line(capsys, ["run", "-w", "sharegpt,sharegpt"])


def test_a_workload_name_never_reaches_the_terminal_raw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line break or an escape sequence in a workload's name was printed as it was (the KV line broke in two)."""
    w = tmp_path / "evil.toml"
    w.write_text('[workload]\nname = "evil\\nname\\u001b[31mRED"\ninput_tokens = 32\noutput_tokens = 8\n')
    for argv in (["run", "-w", str(w)], ["workloads", str(w)]):
        line = error_line(capsys, argv)
        assert "\x1b" not in line and "holds a line break, tab or control character" in line, line


def test_an_exception_reads_as_its_message_never_its_class() -> None:
    """`ValueError: HTTP 404` (a /metrics that answered 404) and `RawHTTPError: ...` (a cut stream) reached users."""
    from servescope.core.errors import error_text
    from servescope.core.rawhttp import RawHTTPError

    assert error_text(ValueError("HTTP 404")) == "HTTP 404"
    assert error_text(RawHTTPError("the server closed the connection mid-response (EOF)")) == (
        "the server closed the connection mid-response (EOF)")
    assert error_text(ConnectionResetError(104, "Connection reset by peer")) == "Connection reset by peer"
    assert error_text(TimeoutError()) == "timeout error"


def test_the_simulator_exits_2_on_an_address_it_cannot_listen_on() -> None:
    p = subprocess.run([sys.executable, "-m", "servescope", "sim", "--profile", "tiny", "--host", "999.1.1.1",
                        "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert re.match(r"servescope sim: error: --host 999\.1\.1\.1: not an address of this machine \(.+\); give e\.g\. "
                    r"127\.0\.0\.1", lines[0]), lines[0]


def test_the_app_checks_its_target_before_it_takes_the_terminal(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`tui --url ftp://x`, `demo --profile nope` opened the app on a target that could not work."""
    assert "--url: 'ftp://x' is not an http(s) URL" in error_line(capsys, ["tui", "--url", "ftp://x"])
    assert "--url sim://nope: unknown profile 'nope'" in error_line(capsys, ["tui", "--url", "sim://nope"])
    assert "--profile nope: unknown profile 'nope'" in error_line(capsys, ["demo", "--profile", "nope"])
    monkeypatch.setenv("SERVESCOPE_URL", "127.0.0.1:8000")
    assert "$SERVESCOPE_URL: '127.0.0.1:8000' is not an http(s) URL" in error_line(capsys, ["tui"])


def test_the_top_level_help_says_compare_and_report_write_html() -> None:
    """`servescope --help` said compare wrote "Markdown or JSON" and report "Markdown (or CSV/JSON)"."""
    text = " ".join(_parser().format_help().split())
    compare = text.split(" compare ", 1)[1].split(" gate ", 1)[0]
    report = text.split(" report ", 1)[1].split(" import ", 1)[0]
    assert "HTML" in compare and "HTML" in report, (compare, report)


@pytest.mark.parametrize("argv", [["sim", "--list"], ["workloads"]])
def test_a_reader_that_leaves_early_gets_no_traceback(argv: list[str]) -> None:
    """`servescope sim --list | head -1`: the reader has gone when the listing is written; the command stops as one
    killed by SIGPIPE does (exit 141), with nothing on stderr (it printed a BrokenPipeError traceback)."""
    p = subprocess.Popen([sys.executable, "-m", "servescope", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # no reader is left: the command's first write to stdout meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err
