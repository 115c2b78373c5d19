from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from servescope.core.servermetrics import parse

ROOT = Path(__file__).resolve().parents[2]


def servescope(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def run_json(*args: str, **kw: Any) -> dict[str, Any]:
    p = servescope("run", *args, "--json", **kw)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse(r.read().decode())
