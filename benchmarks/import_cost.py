"""What servescope's start-up paths import, and what the imports kept inside functions save.

The code imports servescope modules at the top of each module, except where deferring an import keeps a heavy
library off a start-up path (servescope/__main__.py, and the modules with imports inside functions, say which).
This prints, for each path, its import time (median of `--rounds` fresh interpreters, `-X importtime`'s total for
the path's modules) and the heavy libraries it loads; then each heavy library's own import time, which is what an
import hoisted onto that path would add.

    python benchmarks/import_cost.py [--rounds 7]

Paths: `servescope --help` (argument parsing: servescope/__main__.py with servescope/cli/args.py), the app's
module (servescope.tui.app, before its first frame), the simulator's command line (servescope.sim.cli) and, for
comparison, the sweep runner (servescope.engine.runner, which needs them all).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("polars", "httpx", "textual", "aiohttp", "tomli_w", "rich", "numpy", "pyarrow")
PATHS = {
    "servescope --help": "import servescope.__main__ as m; m._parser()",
    "the app (servescope.tui.app)": "import servescope.tui.app",
    "the simulator's CLI (servescope.sim.cli)": "import servescope.sim.cli",
    "the sweep runner (servescope.engine.runner)": "import servescope.engine.runner",
}


def _run(code: str) -> tuple[float, list[str]]:
    """Wall time of `code` in a fresh interpreter (ms, measured inside it) and the heavy libraries it loaded."""
    prog = ("import sys, time\nt0 = time.perf_counter()\n" + code.replace("; ", "\n") +
            "\nms = (time.perf_counter() - t0) * 1000\n"
            f"print(ms, ' '.join(h for h in {HEAVY!r} if h in sys.modules))")
    out = subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    ms, _, libs = out.strip().partition(" ")
    return float(ms), libs.split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"start-up paths (median of {args.rounds} fresh interpreters, interleaved):")
    times: dict[str, list[float]] = {k: [] for k in PATHS}
    libs: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, code in PATHS.items():
            ms, loaded = _run(code)
            times[name].append(ms)
            libs[name] = loaded
    for name in PATHS:
        print(f"  {name:<46} {statistics.median(times[name]):7.0f} ms   loads: {' '.join(libs[name]) or '-'}")
    print(f"heavy libraries alone (median of {args.rounds}; what one hoisted import onto a path adds):")
    for lib in HEAVY:
        try:
            ms = statistics.median(_run(f"import {lib}")[0] for _ in range(args.rounds))
        except subprocess.CalledProcessError:
            continue
        print(f"  {lib:<46} {ms:7.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
