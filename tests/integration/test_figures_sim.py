"""The figures and the HTML report as a person gets them, end to end against the simulator: a session of two
workloads at five loads, and GPTQ-Int4 against FP8 (two simulator profiles) with --repeat 3. `report --format
html`, `compare --format html` and `--figures` write their files; Debian's headless Chromium opens each HTML
report by file:// with networking blocked, driven over the DevTools protocol: the page may ask for nothing (its
Network events are read), and its screenshot must not be blank."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .helpers import servescope

pytest.importorskip("matplotlib")

pytestmark = pytest.mark.slow

GPTQ = "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"
FP8 = "rtx-pro-6000/qwen3.5-35b-a3b-fp8"


@dataclass
class Sessions:
    base: Path
    two: Path  # two workloads, five loads
    gptq: Path  # --repeat 3
    fp8: Path


def _run(base: Path, profile: str, workloads: str, loads: str, *extra: str) -> Path:
    r = servescope("run", "--url", f"sim://{profile}", "-w", workloads, "-c", loads, "--sessions-dir", str(base),
                   "--json", *extra, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return Path(json.loads(r.stdout)["session"])


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Sessions:
    base = tmp_path_factory.mktemp("figures-sim")
    (base / "chat.toml").write_text('[workload]\nname = "chat"\napi = "chat"\ninput_tokens = 256\noutput_tokens = 32\n')
    (base / "doc.toml").write_text('[workload]\nname = "doc"\napi = "chat"\ninput_tokens = 4096\noutput_tokens = 32\n')
    two = _run(base, GPTQ, f"{base / 'chat.toml'},{base / 'doc.toml'}", "1,2,4,8,16", "-n", "8", "--name", "two")
    gptq = _run(base, GPTQ, str(base / "chat.toml"), "1,4", "-n", "6", "--repeat", "3", "--tag", "quant=GPTQ-Int4")
    fp8 = _run(base, FP8, str(base / "chat.toml"), "1,4", "-n", "6", "--repeat", "3", "--tag", "quant=FP8")
    return Sessions(base, two, gptq, fp8)


@pytest.fixture(scope="module")
def reports(sessions: Sessions) -> dict[str, Path]:
    out = sessions.base / "out"
    out.mkdir()
    runs = {
        "report.html": ("report", str(sessions.two), "--format", "html"),
        "compare.html": ("compare", str(sessions.gptq), str(sessions.fp8), "--label", "quant", "--format", "html"),
        "report.md": ("report", str(sessions.two), "--figures", str(out / "report-figures")),
        "compare.md": ("compare", str(sessions.gptq), str(sessions.fp8), "--label", "quant", "--figures",
                       str(out / "compare-figures")),
    }
    for name, args in runs.items():
        r = servescope(*args, "-o", str(out / name), timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    return {name: out / name for name in runs}


def test_every_format_writes_its_files(reports: dict[str, Path]) -> None:
    doc = reports["report.html"].read_text()
    for fig in ("chat-throughput", "chat-tradeoff", "chat-latency", "chat-histograms", "doc-throughput",
                "ttft-vs-context", "server-telemetry"):
        assert f'<figure id="fig-{fig}">' in doc, fig
    cmp = reports["compare.html"].read_text()
    assert '<figure id="fig-chat-compare">' in cmp and "GPTQ-Int4 vs FP8" in cmp
    for md in ("report.md", "compare.md"):
        text = reports[md].read_text()
        links = re.findall(r"\]\(([^)]+\.(?:svg|png))\)", text)
        assert links, md
        for link in links:
            assert not Path(link).is_absolute() and (reports[md].parent / link).stat().st_size > 1000, link


def test_no_text_covers_another_text_or_a_data_point(sessions: Sessions) -> None:
    """Every figure of the two-workload, five-load simulator session and of the GPTQ-Int4 against FP8 comparison,
    drawn with the Agg renderer: no text's extent meets another text's, none (nor a legend) meets a data marker
    (tests/support/figure_extents.py asks matplotlib for them)."""
    from servescope.reports.figures import comparison_figures, session_figures
    from servescope.reports.figures_svg import draw
    from servescope.reports.htmlreport import compare_parts
    from servescope.reports.report import build
    from servescope.sessions.store import load_session
    from tests.support.figure_extents import overlaps

    specs = session_figures(build(load_session(sessions.two)))
    comp, reps = compare_parts([load_session(sessions.gptq), load_session(sessions.fp8)], label_key="quant")
    specs += comparison_figures(comp, reps)
    assert {f.kind for f in specs} >= {"throughput", "tradeoff", "latency", "histograms", "context", "telemetry",
                                       "compare"}
    found = {f.name: overlaps(draw(f)) for f in specs}
    assert not any(found.values()), {k: v[:5] for k, v in found.items() if v}


def test_figure_pngs_are_at_least_1600_pixels_wide(reports: dict[str, Path]) -> None:
    pngs = sorted((reports["report.md"].parent / "report-figures").glob("*.png"))
    assert pngs
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") >= 1600, png.name


# ---- the browser --------------------------------------------------------------------------------------
def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian's chromium is needed: apt-get install chromium (scripts/test.sh installs it)"
    return exe


@dataclass
class Visit:
    requests: list[str]  # every request the page asked for (its own file:// document left out)
    png: bytes


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: fd 3 in, fd 4
    out, NUL-separated JSON), with its networking sent to a proxy that does not exist, so nothing can leave
    the machine either way; the page's own requests are read from its Network events."""

    def __init__(self, profile: Path) -> None:
        self.cmd_r, self.cmd_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        fds = (self.cmd_r, self.out_w)

        def child_fds() -> None:
            os.dup2(fds[0], 3)
            os.dup2(fds[1], 4)

        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", f"--user-data-dir={profile}", "--proxy-server=http://127.0.0.1:9",
             "--proxy-bypass-list=<-loopback>", "--host-resolver-rules=MAP * ~NOTFOUND", "--remote-debugging-pipe",
             "about:blank"], preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(self.cmd_r)
        os.close(self.out_w)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            ready, _, _ = select.select([self.out_r], [], [], 1.0)
            if ready:
                chunk = os.read(self.out_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return dict(json.loads(msg))

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                assert "error" not in m, m
                return dict(m.get("result", {}))
            self.events.append(m)

    def wait_for(self, method: str, session: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.events.append(self._read(deadline))

    def visit(self, page: Path, width: int = 1280, height: int = 2600) -> Visit:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Network.enable", session=sid)
        self.call("Page.enable", session=sid)
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=sid)
        self.events.clear()
        url = page.resolve().as_uri()
        self.call("Page.navigate", {"url": url}, session=sid)
        self.wait_for("Page.loadEventFired", sid)
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session=sid)["data"])
        reqs = [str(e["params"]["request"]["url"]) for e in self.events
                if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == sid]
        return Visit([r for r in reqs if r != url], png)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close", timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.cmd_w)
        os.close(self.out_r)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def not_blank(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of pixels that are not the page's white) of a screenshot."""
    from PIL import Image

    im = Image.open(io.BytesIO(png)).convert("RGB")
    small = im.resize((im.width // 4, im.height // 4))
    b = small.tobytes()
    px = list(zip(b[0::3], b[1::3], b[2::3], strict=True))
    return len(set(px)), sum(1 for p in px if sum(p) < 720) / len(px)


def test_the_check_sees_a_page_that_fetches(tmp_path: Path, browser: Browser) -> None:
    """The check can fail: a page with one remote image asks for it (and gets nothing: no network)."""
    page = tmp_path / "fetches.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p><img src="http://example.com/pixel.png"></body></html>')
    assert browser.visit(page).requests == ["http://example.com/pixel.png"]


@pytest.mark.parametrize("name", ["report.html", "compare.html"])
def test_the_html_report_opens_offline_and_draws(name: str, reports: dict[str, Path], browser: Browser) -> None:
    page = reports[name]
    doc = page.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", doc, re.I)
    visit = browser.visit(page)
    assert visit.requests == []  # no request left the page
    colours, ink = not_blank(visit.png)
    assert colours > 50 and ink > 0.02, (colours, ink)
    page.with_suffix(".png").write_bytes(visit.png)  # beside the report, for a person to look at
