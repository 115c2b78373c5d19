"""The HTML report fits a 1280 px window: every column of every table can be seen without scrolling sideways.

A simulator session of two workloads at five loads, priced per GPU hour (so its results tables carry every column:
the four latency triples, throughputs, goodput, SLO met, prefix cache hit, the client's health and the cost), is
written by `servescope report --format html` and opened in Debian's headless Chromium (networking off; the browser
of tests/integration/test_figures_sim.py) at 1280x2000. The check asks the browser's own layout, over the DevTools
protocol, for each table's frame (its scroll width against its visible width) and each header cell's box; a
script run through DevTools reads the page without changing it (the page's Content-Security-Policy forbids
scripts of its own). Measured boxes, not pixels: it does not depend on the fonts' exact widths, and it fails where
a column is cut off or hidden behind a sideways scroll. The screenshot is kept beside the report for a person."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import servescope
from .test_figures_sim import GPTQ, Browser, not_blank

pytest.importorskip("matplotlib")

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 1280, 2000
MEASURE = """
(() => {
  const vw = document.documentElement.clientWidth;
  const tables = [...document.querySelectorAll('table')].map(t => {
    const frame = t.closest('.table-wrap') || t.parentElement;
    const head = t.tHead ? t.tHead.rows[0] : t.rows[0];
    const cells = [...head.cells].map(c => {
      const r = c.getBoundingClientRect();
      return {text: c.textContent, left: r.left, right: r.right, width: r.width};
    });
    return {scroll: frame.scrollWidth, visible: frame.clientWidth, cells: cells};
  });
  return JSON.stringify({vw: vw, tables: tables});
})()
"""


class MeasuringBrowser(Browser):
    def measure(self, page: Path) -> tuple[dict[str, Any], bytes]:
        """The page at WIDTH x HEIGHT: its tables' frames and header cells as laid out, and a screenshot."""
        import base64

        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=sid)
        self.call("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=sid)
        self.events.clear()
        self.call("Page.navigate", {"url": page.resolve().as_uri()}, session=sid)
        self.wait_for("Page.loadEventFired", sid)
        got = self.call("Runtime.evaluate", {"expression": MEASURE, "returnByValue": True}, session=sid)
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session=sid)["data"])
        return dict(json.loads(got["result"]["value"])), png


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[MeasuringBrowser]:
    b = MeasuringBrowser(tmp_path / "profile")
    yield b
    b.close()


def cut_off(layout: dict[str, Any]) -> list[str]:
    """Every column that cannot be seen whole at this width: `table N: HEADER (why)`."""
    vw = layout["vw"]
    out = []
    for i, t in enumerate(layout["tables"]):
        if t["scroll"] > t["visible"] + 1:
            out.append(f"table {i}: scrolls sideways ({t['scroll']} px in {t['visible']} px)")
        out += [f"table {i}: {c['text']!r} (at {c['left']:.0f}-{c['right']:.0f} px)" for c in t["cells"]
                if c["left"] < 0 or c["right"] > vw + 0.5 or c["width"] < 8]
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("html-fit")
    (base / "chat.toml").write_text('[workload]\nname = "chat"\napi = "chat"\ninput_tokens = 256\noutput_tokens = 32\n')
    (base / "doc.toml").write_text('[workload]\nname = "doc"\napi = "chat"\ninput_tokens = 4096\noutput_tokens = 32\n')
    r = servescope("run", "--url", f"sim://{GPTQ}", "-w", f"{base / 'chat.toml'},{base / 'doc.toml'}", "-c",
                   "1,2,4,8,16", "-n", "8", "--gpu-hour", "2.50", "--sessions-dir", str(base), "--json", "--name",
                   "fit", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    session = json.loads(r.stdout)["session"]
    page = base / "report.html"
    r = servescope("report", session, "--format", "html", "-o", str(page), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return page


def test_every_table_column_shows_at_1280_px(report: Path, browser: MeasuringBrowser) -> None:
    layout, png = browser.measure(report)
    report.with_suffix(".png").write_bytes(png)  # beside the report, for a person to look at
    assert layout["vw"] == WIDTH
    results = [t for t in layout["tables"] if t["cells"] and t["cells"][0]["text"] == "load"
               and any(c["text"] == "client" for c in t["cells"])]
    assert len(results) == 2  # chat and doc, each with every column the results table can have
    heads = [c["text"] for c in results[0]["cells"]]
    assert {"goodput req/s", "SLO met", "prefix cache hit", "client", "cost $/1M out tok"} <= set(heads), heads
    assert cut_off(layout) == []
    colours, ink = not_blank(png)
    assert colours > 50 and ink > 0.02, (colours, ink)


def test_the_check_sees_a_table_that_does_not_fit(tmp_path: Path, browser: MeasuringBrowser) -> None:
    """The check can fail: a table of twenty columns that may not wrap scrolls inside its frame."""
    page = tmp_path / "wide.html"
    cells = "".join(f'<th style="white-space:nowrap">a column that does not wrap {i}</th>' for i in range(20))
    page.write_text(f'<!DOCTYPE html><html><body><div class="table-wrap" style="overflow-x:auto"><table><thead>'
                    f"<tr>{cells}</tr></thead></table></div></body></html>")
    layout, _ = browser.measure(page)
    problems = cut_off(layout)
    assert problems and problems[0].startswith("table 0: scrolls sideways"), problems
