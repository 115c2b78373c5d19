"""Make docs/img/throughput.svg, the docs' example figure (aggregate against per-user throughput as users grow),
from a fresh simulator session, so the picture in the docs is what `servescope report --format html` draws.

    .venv/bin/python scripts/make_readme_figure.py [--out docs/img/throughput.svg] [--keep DIR]

It runs a short sweep against the built-in simulator (the RTX Pro 6000 GPTQ-Int4 profile, a chat workload of
512 prompt and 128 output tokens, 1 to 64 users) into a temporary sessions folder (or DIR with --keep), then
draws the session's throughput figure with servescope.reports.figures. Needs the plots extra."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"
WORKLOAD = '[workload]\nname = "chat"\napi = "chat"\ninput_tokens = 512\noutput_tokens = 128\n'


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "throughput.svg")
    ap.add_argument("--keep", type=Path, help="keep the session in this sessions folder")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from servescope.reports.figures import session_figures
    from servescope.reports.figures_svg import render
    from servescope.reports.report import build
    from servescope.sessions.store import load_session

    with tempfile.TemporaryDirectory(prefix="servescope-figure-") as tmp:
        base = args.keep or Path(tmp)
        wl = Path(tmp) / "chat.toml"
        wl.write_text(WORKLOAD)
        r = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", f"sim://{PROFILE}", "-w", str(wl),
                            "-c", "1,2,4,8,16,32,64", "-n", "64", "--sessions-dir", str(base), "--name",
                            "docs-throughput", "--json"], capture_output=True, text=True, cwd=ROOT, check=False)
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        session = load_session(json.loads(r.stdout)["session"])
        spec = next(f for f in session_figures(build(session)) if f.kind == "throughput")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(spec).svg_file, encoding="utf-8")
    print(f"wrote {args.out} from session {session.path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
