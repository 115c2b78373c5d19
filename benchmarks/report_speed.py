"""How long `servescope report SESSION --format html` takes on the demo session, the first time and the second,
against the code before the figures were kept and laid out by arithmetic, in one interleaved run.

    .venv/bin/python benchmarks/report_speed.py [--rounds 5] [--base 465c88b] [--session DIR]

Without --session it first records the demo's session headlessly: the sweep `servescope demo` runs in the app
(the simulator's default profile, the sharegpt workload, 1, 4 and 16 users, 8 s each), as `servescope run`
flags, into a temporary folder (about 30 s). The base code is `git archive BASE` unpacked into a temporary
folder; each checkout's package is put first on PYTHONPATH (same Python, same venv), and the script checks that
each report was made by its own checkout. Every round runs, in turn: the base's report, this checkout's first
report (its kept figures, SESSION/figures/, removed first), the base's again and this checkout's second. The base
keeps nothing, so its first and second are the same work. Prints the medians, the ratios and the targets (the
first report at most two thirds of the base's time, the second at most a third), and the machine: CPU model
(lscpu), cores, load average, Python and matplotlib versions."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = "465c88b"  # the commit before the figures were laid out by arithmetic and kept (issue 45)
DEMO = ["-w", "sharegpt", "-c", "1,4,16", "--duration", "8s", "--name", "demo", "--tag", "demo=yes"]


def _env(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code)}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "unknown")


def demo_session(folder: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://", *DEMO, "--sessions-dir",
                        str(folder), "--json"], capture_output=True, text=True, env=_env(ROOT), cwd=folder)
    if r.returncode != 0:
        raise SystemExit(f"the demo sweep failed:\n{r.stderr[-2000:]}")
    return Path(json.loads(r.stdout)["session"])


def report(code: Path, session: Path, out: Path) -> float:
    """One `report --format html` by the checkout at `code`: its wall time in seconds."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "servescope", "report", str(session), "--format", "html", "-o",
                        str(out)], capture_output=True, text=True, env=_env(code), cwd=out.parent)
    dt = time.perf_counter() - t0
    if r.returncode != 0 or not out.is_file():
        raise SystemExit(f"{code}: the report failed:\n{r.stderr[-2000:]}")
    return dt


def whose(code: Path, cwd: Path) -> str:
    """The servescope a Python started with `code` on PYTHONPATH imports (from a neutral folder)."""
    r = subprocess.run([sys.executable, "-c", "import servescope; print(servescope.__file__)"], capture_output=True,
                       text=True, env=_env(code), cwd=cwd, check=True)
    return r.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base", default=BASE, help=f"the commit to compare with (default {BASE})")
    ap.add_argument("--session", type=Path, help="an existing session (default: record the demo's)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="servescope-report-speed-") as tmp:
        t = Path(tmp)
        base = t / "base"
        base.mkdir()
        arch = subprocess.run(["git", "archive", args.base], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=arch, check=True)
        for code in (base, ROOT):
            if not whose(code, t).startswith(str(code)):
                raise SystemExit(f"PYTHONPATH={code} does not import its own servescope ({whose(code, t)})")
        if args.session is not None:
            session = t / args.session.name
            shutil.copytree(args.session, session, ignore=shutil.ignore_patterns("figures"))
        else:
            print("recording the demo's session (about 30 s) ...", file=sys.stderr)
            session = demo_session(t)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        load = os.getloadavg()
        times: dict[str, list[float]] = {"base first": [], "base second": [], "first": [], "second": []}
        for i in range(args.rounds):
            times["base first"].append(report(base, session, t / "base.html"))
            shutil.rmtree(session / "figures", ignore_errors=True)
            times["first"].append(report(ROOT, session, t / "new.html"))
            times["base second"].append(report(base, session, t / "base.html"))
            times["second"].append(report(ROOT, session, t / "new.html"))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), file=sys.stderr)
        med = {k: statistics.median(v) for k, v in times.items()}
    try:
        mpl = metadata.version("matplotlib")
    except metadata.PackageNotFoundError:
        mpl = "not installed"
    print(f"servescope report --format html on the demo session ({session.name}), {datetime.now():%Y-%m-%d %H:%M}")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"Python {platform.python_version()}, matplotlib {mpl}")
    print(f"medians of {args.rounds} interleaved rounds; base {args.base}, this checkout {head}")
    print(f"{'report':<10} {'base (s)':>9} {'this (s)':>9} {'ratio':>6}  target")
    for what, target in (("first", 2 / 3), ("second", 1 / 3)):
        ratio = med[what] / med[f"base {what}"]
        print(f"{what:<10} {med[f'base {what}']:>9.2f} {med[what]:>9.2f} {ratio:>6.2f}  <= {target:.2f} "
              f"{'met' if ratio <= target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
