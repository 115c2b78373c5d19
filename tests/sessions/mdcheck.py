"""Structural checks of generated Markdown: tables well formed, Mermaid xychart-beta blocks valid."""

from __future__ import annotations

import re
from dataclasses import dataclass

from markdown_it import MarkdownIt

_PIPE = re.compile(r"(?<!\\)\|")
_SEP = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


def _raw_cells(line: str) -> int:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return len(_PIPE.split(s))


def tables(md: str) -> list[Table]:
    """Every table, checked: the parser found as many tables as there are separator lines, and every source
    line of each table has as many cells as its header (markdown-it pads or cuts bad rows silently)."""
    mdi = MarkdownIt("commonmark").enable("table")
    tokens = mdi.parse(md)
    lines = md.splitlines()
    seps = [i for i, ln in enumerate(lines) if _SEP.match(ln.strip()) and ln.strip().startswith("|")]
    out: list[Table] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.type == "table_open":
            assert t.map is not None
            start, end = t.map
            src = [ln for ln in lines[start:end] if ln.strip()]
            ncols = _raw_cells(src[0])
            for ln in src:
                assert _raw_cells(ln) == ncols, f"table row has {_raw_cells(ln)} cells, header {ncols}:\n{ln}"
            header: list[str] = []
            rows: list[list[str]] = []
            cur: list[str] | None = None
            j = i + 1
            while tokens[j].type != "table_close":
                tj = tokens[j]
                if tj.type == "tr_open":
                    cur = []
                elif tj.type == "tr_close":
                    assert cur is not None
                    if not header:
                        header = cur
                    else:
                        rows.append(cur)
                elif tj.type == "inline" and cur is not None:
                    cur.append(tj.content)
                j += 1
            assert len(header) == ncols
            for r in rows:
                assert len(r) == ncols
            out.append(Table(header, rows))
            i = j
        i += 1
    assert len(out) == len(seps), f"{len(seps)} table separator lines but {len(out)} tables parsed"
    return out


@dataclass
class Chart:
    title: str
    categories: list[str]
    series: list[list[float]]


_TITLE = re.compile(r'^title "([^"]*)"$')
_XAXIS = re.compile(r'^x-axis(?: "([^"]*)")? \[(.*)\]$')
_YAXIS = re.compile(r'^y-axis "([^"]*)"(?: (-?[\d.]+) --> (-?[\d.]+))?$')
_SERIES = re.compile(r"^(line|bar) \[(.*)\]$")
_CAT = re.compile(r'\s*"([^"]*)"\s*')


def mermaid_charts(md: str) -> list[Chart]:
    """Every ```mermaid block must be an xychart-beta with a title, an x-axis of categories, a y-axis, and
    series as long as the categories."""
    mdi = MarkdownIt("commonmark")
    charts = []
    for t in mdi.parse(md):
        if t.type != "fence" or t.info.strip() != "mermaid":
            continue
        body = [ln.strip() for ln in t.content.splitlines() if ln.strip()]
        assert body[0] == "xychart-beta", body[0]
        title, cats, series, y = "", None, [], None
        for ln in body[1:]:
            if m := _TITLE.match(ln):
                title = m.group(1)
            elif m := _XAXIS.match(ln):
                cats = [c.group(1) for c in _CAT.finditer(m.group(2))]
                assert ",".join(f'"{c}"' for c in cats) == m.group(2).replace(", ", ","), ln
            elif m := _YAXIS.match(ln):
                y = m
                if m.group(2) is not None:
                    assert float(m.group(2)) < float(m.group(3))
            elif m := _SERIES.match(ln):
                series.append([float(x) for x in m.group(2).split(",")])
            else:
                raise AssertionError(f"unexpected xychart line: {ln!r}")
        assert title and cats and y is not None and series, body
        for s in series:
            assert len(s) == len(cats), f"series of {len(s)} values on {len(cats)} categories in {title!r}"
            if y.group(3) is not None:
                assert max(s) <= float(y.group(3))
        charts.append(Chart(title, cats, series))
    return charts
