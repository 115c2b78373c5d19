"""`report`/`compare` with figures, as a user runs them: the Markdown's links to the figure files resolve even when
the folder's name has spaces and parentheses (issue 44, item 19: read back with markdown-it-py, as GitHub would),
and the figures being drawn are told on stderr, one line each, never on stdout (issue 44, item 10)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

from tests.integration.helpers import servescope
from tests.sessions.test_figures import two_workloads

# the --fast lane leaves this module out: 2 tests, ~5 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

pytest.importorskip("matplotlib")

PROGRESS = re.compile(r"^servescope (report|compare): drawing figure (\d+) of (\d+): .+$")


def targets(md: str) -> list[str]:
    """Every image source and link target of the Markdown, as a CommonMark parser reads them."""
    out: list[str] = []

    def walk(tokens: list[Any]) -> None:
        for t in tokens:
            if t.type == "image":
                out.append(str(t.attrs["src"]))
            elif t.type == "link_open":
                out.append(str(t.attrs["href"]))
            if t.children:
                walk(t.children)

    walk(MarkdownIt("commonmark").parse(md))
    return out


def progress_of(stderr: str) -> list[tuple[int, int]]:
    return [(int(m[2]), int(m[3])) for ln in stderr.splitlines() if (m := PROGRESS.match(ln))]


def test_figure_links_resolve_in_a_folder_named_with_spaces_and_parentheses(tmp_path: Path) -> None:
    s = two_workloads(tmp_path / "s", loads=(1, 4), workloads=("sharegpt",))
    out = tmp_path / "out dir" / "report.md"
    figs = tmp_path / "out dir" / "my figs (v2)"
    out.parent.mkdir()
    r = servescope("report", str(s.path), "--figures", str(figs), "-o", str(out))
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    files = sorted(p.name for p in figs.iterdir())
    links = targets(md)
    assert sorted(Path(unquote(x)).name for x in links) == files  # every file linked, as an image or its PNG
    for x in links:
        assert not Path(unquote(x)).is_absolute()
        assert (out.parent / unquote(x)).is_file(), x
    # the figures were told as they were drawn, on stderr: one line each, 1..n of n
    n = len([f for f in files if f.endswith(".svg")])
    assert progress_of(r.stderr) == [(i, n) for i in range(1, n + 1)], r.stderr
    assert "drawing figure" not in r.stdout


def test_an_html_report_on_stdout_keeps_the_progress_on_stderr(tmp_path: Path) -> None:
    a = two_workloads(tmp_path / "s", "GPTQ", loads=(1, 4), workloads=("sharegpt",))
    b = two_workloads(tmp_path / "s", "FP8", loads=(1, 4), workloads=("sharegpt",), tpot_ms=7.5)
    r = servescope("compare", str(a.path), str(b.path), "--label", "quant", "--format", "html")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<!DOCTYPE html>") and r.stdout.rstrip().endswith("</html>")
    steps = progress_of(r.stderr)
    assert steps and steps == [(i, steps[0][1]) for i in range(1, steps[0][1] + 1)], r.stderr
    assert r.stdout.count('<figure id="fig-') == steps[0][1]
