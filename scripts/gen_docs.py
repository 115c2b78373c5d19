"""Write the docs' generated parts from the code itself, so that they cannot drift from it:

- docs/reference/cli.md: every command's flags, from the real argparse parsers (servescope/cli/args.py);
- the preset table in docs/measuring.md, from the workload presets (servescope/workloads/spec.py);
- the metric table in docs/metrics.md, from the metric declarations (METRICS in servescope/core/results.py);
- the app's screenshots, docs/img/app-*.svg: the real app (make_app, as `servescope` builds it) opened on two
  sessions that a real simulator sweep recorded (docs/data/sessions/), each screen driven by its keys.

    .venv/bin/python scripts/gen_docs.py            # rewrite all of them
    .venv/bin/python scripts/gen_docs.py --check    # exit 1, naming the files, when one is out of date
    .venv/bin/python scripts/gen_docs.py --sweep    # first record the sessions again (about 2 minutes)

tests/test_docs.py runs the same functions into a temporary folder and compares (screenshots by their text)."""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DATA = DOCS / "data" / "sessions"
IMG = DOCS / "img"

# ---- the recorded sweeps -----------------------------------------------------------------------------------

# Two sessions of one model in two quantisations on the simulator: what the screenshots show. Short, so that
# recording them takes about two minutes; `--seed 0` as every sweep's default.
SWEEPS = {
    "qwen35-fp8": ("rtx-pro-6000/qwen3.5-35b-a3b-fp8", "FP8"),
    "qwen35-gptq-int4": ("rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4", "GPTQ-Int4"),
}
SWEEP_ARGS = ["-w", "sharegpt", "-c", "1,4,16", "-n", "24", "--warmup", "2", "--slo", "ttft_ms=3000,per_user_tok_s=20"]


def record_sweeps() -> None:
    """Run the simulator sweeps the screenshots are made from (replacing docs/data/sessions/)."""
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    for name, (profile, quant) in SWEEPS.items():
        cmd = [sys.executable, "-m", "servescope", "run", "--url", f"sim://{profile}", *SWEEP_ARGS,
               "--name", name, "--tag", f"quant={quant}", "--save", str(DATA / name)]
        print("$ servescope " + " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        (DATA / name / "runner.lock").unlink(missing_ok=True)  # the recording machine's pid: nothing to show
        _relative_paths(DATA / name)


def _relative_paths(session: Path) -> None:
    """The event log names the session by its path on the recording machine: name it from the clone's root."""
    log = session / "events.jsonl"
    log.write_text(log.read_text(encoding="utf-8").replace(str(session), str(session.relative_to(ROOT))),
                   encoding="utf-8")


# ---- the CLI reference -------------------------------------------------------------------------------------

HELP_COLUMNS = "100"  # argparse wraps help to $COLUMNS: a fixed width, so the page is the same on any terminal


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_text(p: argparse.ArgumentParser) -> str:
    import os

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        return p.format_help().rstrip()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def top_parser() -> argparse.ArgumentParser:
    """The parser `servescope` runs, with the docs pages named at the end of each command's help."""
    from servescope.__main__ import _parser
    from servescope.cli.args import add_docs_epilogs

    p = _parser()
    add_docs_epilogs(p)  # a no-op for parsers that have their epilog already
    return p


def cli_reference() -> str:
    """docs/reference/cli.md: `servescope --help` and every subcommand's, as argparse prints them."""
    from servescope.sim.cli import build_parser as sim_parser

    p = top_parser()
    subs = _subcommands(p)
    out = ["# CLI reference", "",
           "Every command's `--help`, as servescope prints it (written by `scripts/gen_docs.py` from the parsers "
           "themselves; `tests/test_docs.py` fails when it is out of date). Each section names the page that "
           "explains the command.", "",
           "## servescope {#servescope}", "", "```text", _help_text(p), "```", ""]
    for name, sp in subs.items():
        if name == "sim":  # a separate program: its own parser, with its own --help
            sp = sim_parser()
            sp.prog = "servescope sim"
        out += [f"## servescope {name} {{#{name}}}", "", "```text", _help_text(sp), "```", ""]
        for sub_name, ssp in _subcommands(sp).items():
            out += [f"### servescope {name} {sub_name} {{#{name}-{sub_name}}}", "", "```text", _help_text(ssp), "```",
                    ""]
    return "\n".join(out).rstrip() + "\n"


# ---- tables from the code ----------------------------------------------------------------------------------


def preset_table() -> str:
    """The workload presets (servescope/workloads/spec.py), as `servescope workloads` shows them."""
    from servescope.workloads.spec import COMPOSITE, PRESETS, context_sweep

    rows = ["| preset | shape | default load | stands for |", "|---|---|---|---|"]
    for w in PRESETS.values():
        load = ""
        if w.default_concurrency:
            load = f"c={','.join(map(str, w.default_concurrency))}, {w.default_requests} requests"
        rows.append(f"| `{w.name}` | {_cell(w.shape())} | {load} | {_cell(w.description)} |")
    for name, desc in COMPOSITE.items():
        parts = ", ".join(f"`{x.name}`" for x in context_sweep())
        rows.append(f"| `{name}` | {len(context_sweep())} workloads: {parts} |  | {_cell(desc)} |")
    return "\n".join(rows)


def metric_table() -> str:
    """Every metric's key, label, unit, statistics, better direction and formula, then what each formula leaves
    implicit (METRICS in servescope/core/results.py)."""
    from servescope.core.results import METRICS

    rows = ["| key | label | unit | statistics | better | formula |", "|---|---|---|---|---|---|"]
    for m in METRICS.values():
        better = m.better or "not judged"
        stats = ", ".join(f"`.{s}`" for s in m.stats) or "-"
        rows.append(f"| `{m.key}` | {_cell(m.label)} | {m.unit or '-'} | {stats} | {better} | "
                    f"{_cell(m.formula) or '-'} |")
    notes = [f"- **{m.label}** (`{m.key}`) {m.note}" for m in METRICS.values() if m.note]
    return "\n".join(rows) + "\n\nWhat the formulas leave implicit:\n\n" + "\n".join(notes)

def compare_example() -> str:
    """`servescope compare` of the two recorded sessions, as it prints it (a fenced Markdown block)."""
    import contextlib
    import io
    import os

    from servescope.__main__ import main as servescope_main

    a, b = (str((DATA / n).relative_to(ROOT)) for n in SWEEPS)
    out = io.StringIO()
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            rc = servescope_main(["compare", a, b, "--label", "quant"])
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise SystemExit(f"gen_docs: servescope compare {a} {b} exited {rc}")
    cmd = f"$ servescope compare {a} {b} --label quant"
    return f"```text\n{cmd}\n{out.getvalue().rstrip()}\n```"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


GENERATED: dict[str, tuple[str, Callable[[], str]]] = {
    "presets": ("measuring.md", preset_table),
    "metrics": ("metrics.md", metric_table),
    "compare-example": ("compare.md", compare_example),
}
_BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+)[^>]*-->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


def fill_generated(text: str) -> str:
    """`text` with each `<!-- generated: NAME ... -->` ... `<!-- /generated -->` block written anew."""
    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in GENERATED:
            raise SystemExit(f"gen_docs: unknown generated block {name!r}")
        return m.group(1) + GENERATED[name][1]() + "\n" + m.group(4)

    return _BLOCK.sub(one, text)


def text_files() -> dict[Path, str]:
    """Every generated text file, path -> what it should hold."""
    out = {DOCS / "reference" / "cli.md": cli_reference()}
    for page in sorted({p for p, _ in GENERATED.values()}):
        path = DOCS / page
        out[path] = fill_generated(path.read_text(encoding="utf-8"))
    return out


# ---- the app's screenshots ---------------------------------------------------------------------------------

RUN_SESSION = "qwen35-gptq-int4"  # the Run screen replays this sweep's event log, stopped half way through its last cell


class _SweepClock:
    """The app's clock: the sweep started 95 s before every reading after the first."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return 1000.0 if self.calls == 1 else 1095.0


async def _settle(pilot: Any) -> None:
    from textual.widgets import Input

    for i in pilot.app.screen.query(Input):
        i.cursor_blink = False
    await pilot.pause()
    await pilot.pause()


async def _to_screen(pilot: Any, name: str) -> None:
    for _ in range(500):
        if type(pilot.app.screen).__name__ == name:
            break
        await pilot.pause(0.01)
    else:
        raise RuntimeError(f"gen_docs: the app never showed {name}")
    await _settle(pilot)


def _run_items(home: Path) -> list[Any]:
    """The recorded sweep's events up to the middle of its last cell, as the app's runner would post them."""
    import msgspec

    from servescope.engine import wire as w
    from servescope.sessions.live import EventLogReader
    from servescope.tui.sweepworker import read_items

    reader = EventLogReader(home / "sessions" / RUN_SESSION)
    items: list[Any] = []
    while more := read_items(reader):
        items += more
    reader.close()
    last = max(i for i, x in enumerate(items) if isinstance(x, w.CellStarted))
    batches = [i for i, x in enumerate(items) if isinstance(x, w.RequestsMeasured) and i > last]
    cut = batches[(len(batches) - 1) // 2] if batches else last
    out = []
    for x in items[:cut + 1]:
        if isinstance(x, w.SweepStarted):  # the session as the app would name it, under the sessions folder
            # the app's clock, not the recording's date, times the sweep (as when the app started it)
            x = msgspec.structs.replace(x, session_dir=Path("sessions") / RUN_SESSION, started_at=None)
        out.append(x)
    return out


async def shot_run(pilot: Any) -> None:
    from servescope.tui import messages as m
    from servescope.tui.screens.run import RunScreen

    app = pilot.app
    await app.switch_mode("run")
    scr = app.get_screen("run", RunScreen)
    scr.reset("sim://rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4: 1 workload")
    for item in _run_items(Path.cwd()):
        scr.post_message(m.message(item))
    await pilot.pause()
    await pilot.pause()
    scr._update_eta()
    scr.flush_charts()
    await _settle(pilot)


async def shot_compose(pilot: Any) -> None:
    await _settle(pilot)


async def shot_compose_load(pilot: Any) -> None:
    await pilot.press("f8")
    await _settle(pilot)


async def shot_sessions(pilot: Any) -> None:
    await pilot.press("f4")
    await _to_screen(pilot, "SessionsScreen")


async def shot_session(pilot: Any) -> None:
    await shot_sessions(pilot)
    await pilot.press("enter")  # the newest: the GPTQ-Int4 sweep
    await _to_screen(pilot, "SessionScreen")


async def shot_compare(pilot: Any) -> None:
    await shot_sessions(pilot)
    await pilot.press("space", "down", "space", "c")
    await _to_screen(pilot, "CompareScreen")


async def shot_whatif(pilot: Any) -> None:
    await shot_session(pilot)
    await pilot.press("w")
    await _to_screen(pilot, "WhatIfScreen")


async def shot_help(pilot: Any) -> None:
    await pilot.press("f1")
    await _to_screen(pilot, "HelpScreen")


async def shot_export(pilot: Any) -> None:
    await shot_session(pilot)
    await pilot.press("e")
    await _to_screen(pilot, "ExportScreen")


# name -> (terminal size, how to reach the screen); docs/img/NAME.svg
SHOTS: dict[str, tuple[tuple[int, int], Callable[[Any], Awaitable[None]]]] = {
    "app-run": ((100, 30), shot_run),
    "app-compose": ((80, 24), shot_compose),
    "app-compose-load": ((80, 24), shot_compose_load),
    "app-sessions": ((80, 24), shot_sessions),
    "app-session": ((100, 30), shot_session),
    "app-compare": ((100, 30), shot_compare),
    "app-whatif": ((100, 30), shot_whatif),
    "app-help": ((80, 24), shot_help),
    "app-export": ((80, 24), shot_export),
}


async def _shoot(name: str, home: Path) -> str:
    from servescope.tui.app import make_app

    size, drive = SHOTS[name]
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                   clock=_SweepClock())
    async with app.run_test(size=size) as pilot:
        await drive(pilot)
        svg: str = app.export_screenshot(title=f"servescope: {name.removeprefix('app-')}")
    return svg


def _one_worker(starts: int = 4) -> int:
    return 1


def screenshots(names: list[str] | None = None) -> dict[str, str]:
    """Each screenshot's SVG, from the app opened on a copy of docs/data/sessions in a scratch home."""
    import os

    out: dict[str, str] = {}
    import servescope.engine.twin as twin

    keep = {k: os.environ.get(k) for k in ("SERVESCOPE_HOME", "NO_COLOR", "OPENAI_API_KEY")}
    cwd = Path.cwd()
    fit_workers = twin.fit_workers
    # the What-if screen's fit-time estimate counts this machine's CPUs: the pictures are taken as on 2 CPUs
    twin.fit_workers = _one_worker
    with tempfile.TemporaryDirectory(prefix="servescope-docs-") as tmp:
        home = Path(tmp)
        shutil.copytree(DATA, home / "sessions")
        (home / "workloads").mkdir()
        os.environ["SERVESCOPE_HOME"] = str(home)
        for k in ("NO_COLOR", "OPENAI_API_KEY"):
            os.environ.pop(k, None)
        os.chdir(home)  # paths show as the app shows them: relative to where it was started
        try:
            for name in names or list(SHOTS):
                out[name] = asyncio.run(_shoot(name, home))
        finally:
            twin.fit_workers = fit_workers
            os.chdir(cwd)
            for k, v in keep.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return out


def svg_text(svg: str) -> str:
    """What a screenshot says: its text, line by line (the colours, fonts and ids left out)."""
    lines: dict[float, list[tuple[float, str]]] = {}
    for m in re.finditer(r'<text[^>]*\bx="([\d.]+)"[^>]*\by="([\d.]+)"[^>]*>(.*?)</text>', svg, re.S):
        lines.setdefault(float(m.group(2)), []).append((float(m.group(1)), html.unescape(m.group(3))))
    return "\n".join("".join(t for _, t in sorted(row)).rstrip() for _, row in sorted(lines.items()))


# ---- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the files out of date")
    ap.add_argument("--sweep", action="store_true", help="record the simulator sessions again first (~2 min)")
    ap.add_argument("--no-screens", action="store_true", help="leave the screenshots alone (they take ~30 s)")
    args = ap.parse_args(argv)
    if args.sweep:
        record_sweeps()
    stale = []
    for path, text in text_files().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if not args.no_screens:
        for name, svg in screenshots().items():
            path = IMG / f"{name}.svg"
            if not path.exists() or svg_text(path.read_text(encoding="utf-8")) != svg_text(svg):
                stale.append(path)
                if not args.check:
                    path.write_text(svg, encoding="utf-8")
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
