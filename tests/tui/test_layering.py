"""The headless engine never imports Textual (layers: core <- workloads <- sessions <- engine <- tui; see
tests/test_imports.py), nor does the runner process a sweep runs in."""

from __future__ import annotations

import subprocess
import sys


def test_headless_modules_do_not_import_textual() -> None:
    code = (
        "import sys\n"
        "import servescope.core.metrics, servescope.core.target, servescope.core.client, servescope.core.load\n"
        "import servescope.workloads.spec, servescope.workloads.prompts\n"
        "import servescope.sessions.store\n"
        "import servescope.engine.spec, servescope.engine.runner\n"
        "import servescope.cli.run\n"
        "import servescope.tui.wire, servescope.cli.detach, servescope.engine.detached  # nor does a runner\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_app_module_imports_without_starting_anything() -> None:
    r = subprocess.run([sys.executable, "-c", "import servescope.tui.app as a; assert callable(a.run_app)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
