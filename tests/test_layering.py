"""The headless modules (core, workloads, sessions, engine, the CLI's commands) never import Textual, the CLI
imports nothing heavy before a command needs it, and the simulator never imports servescope's client.
Which package may import which is checked statically in tests/test_imports.py."""

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_headless_modules_never_import_textual() -> None:
    # every module of the headless packages, whatever they are split into
    mods = _modules_after(
        "import importlib, pkgutil, servescope\n"
        "for pkg in ('core', 'workloads', 'sessions', 'engine', 'cli'):\n"
        "    p = importlib.import_module('servescope.' + pkg)\n"
        "    for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.'):\n"
        "        importlib.import_module(m.name)"
    )
    assert {"servescope.core.client", "servescope.sessions.store", "servescope.engine.spec",
            "servescope.engine.runner", "servescope.cli.run"} <= mods
    assert not {m for m in mods if m == "textual" or m.startswith("textual.")}


def test_cli_startup_imports_nothing_heavy() -> None:
    mods = _modules_after("from servescope.__main__ import _parser; _parser()")
    heavy = {"polars", "httpx", "textual", "aiohttp", "msgspec", "prometheus_client"}
    assert not heavy & mods, heavy & mods


def test_sim_never_imports_the_client() -> None:
    mods = _modules_after("import servescope.sim.server, servescope.sim.engine")
    assert "servescope.core.client" not in mods and "httpx" not in mods and "polars" not in mods
