"""The engine never imports Textual, and the CLI imports nothing heavy before a command needs it."""

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_headless_modules_never_import_textual() -> None:
    mods = _modules_after(
        "import servescope.core.client, servescope.core.load, servescope.core.metrics, servescope.core.target,"
        " servescope.core.servermetrics, servescope.workloads.spec, servescope.workloads.prompts,"
        " servescope.sessions.store, servescope.sessions.runner, servescope.cli.run"
    )
    assert "servescope.sessions.runner" in mods
    assert not {m for m in mods if m == "textual" or m.startswith("textual.")}


def test_cli_startup_imports_nothing_heavy() -> None:
    mods = _modules_after("from servescope.__main__ import _parser; _parser()")
    heavy = {"polars", "httpx", "textual", "aiohttp", "msgspec", "prometheus_client"}
    assert not heavy & mods, heavy & mods


def test_sim_never_imports_the_client() -> None:
    mods = _modules_after("import servescope.sim.server, servescope.sim.engine")
    assert "servescope.core.client" not in mods and "httpx" not in mods and "polars" not in mods
