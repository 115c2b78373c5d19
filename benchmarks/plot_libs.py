"""Which plotting library draws servescope's figures: matplotlib (Agg backend) against pygal, by measurement.

For each library: what installing it adds (the files of it and of every package it pulls in that servescope does
not already need, from importlib.metadata), how long importing it takes (a fresh interpreter each time), and how
long one figure takes to draw: the report's throughput figure (two series of five points on two y axes, an SLO
line, a knee line, a tooltip per point) as SVG, and as PNG. Medians of several runs, printed as a Markdown table.

    python benchmarks/plot_libs.py [--runs 7]

Run it in an environment holding both (a scratch venv: pip install matplotlib pygal cairosvg); a library that is
not installed is reported as such. pygal writes SVG itself and needs CairoSVG (and the system's libcairo) for PNG;
its interactive tooltips load a script from the web unless `js=[]`, so the measured chart is made with `js=[]`."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

X = [1, 2, 4, 8, 16]
AGG = [143.2, 265.2, 473.8, 772.9, 1177.9]
USER = [143.2, 132.8, 118.7, 96.7, 74.1]
# what servescope itself installs (its own closure is not charged to a plotting library)
BASE = {"textual", "httpx", "polars", "msgspec", "pynvml", "prometheus-client", "platformdirs", "tomli-w", "aiohttp",
        "uvloop", "rich", "packaging", "typing-extensions", "anyio", "idna", "certifi", "h11", "httpcore", "sniffio",
        "markdown-it-py", "mdurl", "pygments", "linkify-it-py", "uc-micro-py", "mdit-py-plugins", "nvidia-ml-py",
        "aiosignal", "aiohappyeyeballs", "attrs", "frozenlist", "multidict", "propcache", "yarl"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str) -> list[str]:
    """The installed distributions `root` pulls in (itself included), less servescope's own."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in BASE:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            m = re.match(r"[A-Za-z0-9_.-]+", req)
            if m:
                todo.append(m[0])
    return sorted(seen)


def install_mb(names: list[str]) -> float:
    total = 0
    for n in names:
        for f in md.distribution(n).files or []:
            try:
                total += f.locate().stat().st_size  # type: ignore[attr-defined]
            except OSError:
                pass
    return total / 1e6


def import_s(stmt: str, runs: int) -> float:
    code = f"import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    out = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
           for _ in range(runs)]
    return statistics.median(out)


def timed(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm: fonts, caches
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


# ---- the figure, in each library ------------------------------------------------------------------------
def mpl_figure(fmt: str) -> bytes:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context():
        matplotlib.rc("svg", fonttype="none")
        fig = Figure(figsize=(7.5, 4.2), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        ax2 = ax.twinx()
        ax.plot(X, AGG, color="#0072B2")
        pts = ax.plot(X, AGG, "o", color="#0072B2", label="aggregate output tok/s")[0]
        pts.set_gid("agg")
        ax2.plot(X, USER, color="#E69F00")
        ax2.plot(X, USER, "s", color="#E69F00", label="per-user tok/s (mean)")[0].set_gid("user")
        ax2.axhline(20, linestyle="--", color="#D55E00")
        ax.axvline(16, linestyle="-.", color="#CC79A7")
        ax.set_xscale("log")
        ax.set_xticks(X)
        ax.set_xticklabels([str(x) for x in X])
        ax.set_xlabel("concurrency (users)")
        ax.set_ylabel("aggregate output tok/s")
        ax2.set_ylabel("per-user tok/s (mean)")
        ax.legend(loc="upper left")
        fig.suptitle("chat: aggregate vs per-user throughput")
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=110)
        data = buf.getvalue()
    if fmt == "svg":  # the tooltips, as servescope writes them (one <title> per marker)
        text = data.decode()
        for v in AGG + USER:
            text = text.replace("<use ", f"<use data-y=\"{v}\"><title>{v}</title></use><use ", 1)
        data = text.encode()
    return data


def pygal_figure(fmt: str) -> bytes:
    import pygal

    chart = pygal.XY(js=[], logarithmic=False, secondary_range=(0, 160), title="chat: aggregate vs per-user throughput",
                     x_title="concurrency (users)", y_title="aggregate output tok/s", width=825, height=460)
    chart.add("aggregate output tok/s", list(zip(X, AGG, strict=True)))
    chart.add("per-user tok/s (mean)", list(zip(X, USER, strict=True)), secondary=True)
    chart.add("SLO", [(1, 20), (16, 20)], secondary=True, stroke_style={"dasharray": "6,3"}, show_dots=False)
    return bytes(chart.render()) if fmt == "svg" else bytes(chart.render_to_png())


LIBS = {
    "matplotlib (Agg)": ("matplotlib", "import matplotlib; from matplotlib.figure import Figure; "
                         "from matplotlib.backends.backend_agg import FigureCanvasAgg", mpl_figure),
    "pygal": ("pygal", "import pygal", pygal_figure),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, Python {platform.python_version()} on {platform.machine()} "
          f"({platform.processor() or platform.system()}); medians of {args.runs} runs\n")
    print("| library | version | installs (MB, with what it pulls in) | import (s) | figure as SVG (s) | "
          "figure as PNG (s) | SVG size (kB) | PNG needs |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for label, (dist, stmt, draw) in LIBS.items():
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            print(f"| {label} | not installed | | | | | | |")
            continue
        names = closure(dist)
        size = install_mb(names + (closure("cairosvg") if dist == "pygal" else []))
        imp = import_s(stmt, args.runs)
        svg = timed(lambda d=draw: d("svg"), args.runs)
        try:
            png: float | None = timed(lambda d=draw: d("png"), args.runs)
        except Exception as e:  # noqa: BLE001 - pygal without CairoSVG / libcairo
            print(f"({label} PNG: {type(e).__name__}: {e})", file=sys.stderr)
            png = None
        kb = len(draw("svg")) / 1e3
        needs = "nothing more" if dist == "matplotlib" else "CairoSVG and the system's libcairo"
        print(f"| {label} | {version} | {size:.0f} | {imp:.2f} | {svg:.3f} | "
              f"{f'{png:.3f}' if png is not None else '-'} | {kb:.0f} | {needs} |")
    print("\nInstalls: the files of the library and of each package it pulls in that servescope does not already "
          "need (pygal's with CairoSVG's, which its PNG needs).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
