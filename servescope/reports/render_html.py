"""A document (servescope.reports.document) as one self-contained HTML page: headings with anchors and a table of
contents, tables whose numeric columns align right and say their unit and statistic on hover, figures inlined where
their blocks stand (`figures`: key -> the figure's HTML), the styles inline. Nothing is loaded from anywhere: no
script, no font, no image, no stylesheet, and a Content-Security-Policy that forbids the browser any fetch, so the
file reads the same offline years later.

Every text is escaped here, once (`html.escape` after control characters are removed): a model named `<script>`
is text. Mermaid blocks are left out: the page has figures instead.

Tables fit a 1280 px window: cells wrap (figures at their spaces, text anywhere), and a table still wider than the
page scrolls inside its own frame with its first column held."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping

from servescope import __version__
from servescope.reports.document import (
    Block,
    Bullets,
    Code,
    Column,
    Content,
    Document,
    Figure,
    FigureGroup,
    Formulas,
    Heading,
    Mermaid,
    Note,
    Num,
    Paragraph,
    Strong,
    Table,
    plain_text,
    tidy,
)

__all__ = ["CSP", "STYLE", "render_html"]

# the browser may fetch nothing: the page's own inline styles and data: images only
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
NOWRAP = 14  # a cell this short (a figure, a load) never wraps; longer ones wrap

STYLE = """
:root { --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --head: #f6f8fa; --accent: #0072B2; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #ffffff;
  font: 15px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Helvetica, Arial, sans-serif; }
main { max-width: 76rem; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
h1 { font-size: 1.6rem; border-bottom: 2px solid var(--accent); padding-bottom: .3rem; overflow-wrap: anywhere; }
h2 { font-size: 1.3rem; margin-top: 2.2rem; border-bottom: 1px solid var(--line); padding-bottom: .2rem;
  overflow-wrap: anywhere; }
h3 { font-size: 1.1rem; margin-top: 1.6rem; overflow-wrap: anywhere; }
p, li { overflow-wrap: break-word; }
nav.toc { background: var(--head); border: 1px solid var(--line); border-radius: 6px; padding: .5rem 1rem;
  font-size: .9rem; }
nav.toc a { color: var(--accent); text-decoration: none; margin-right: 1rem; white-space: nowrap; }
.table-wrap { overflow-x: auto; margin: .8rem 0; max-width: 100%; }
table { border-collapse: separate; border-spacing: 0; font-size: .82rem; }
th, td { border: 1px solid var(--line); border-width: 0 1px 1px 0; padding: .25rem .45rem; vertical-align: top;
  overflow-wrap: break-word; }
tr > :first-child { border-left-width: 1px; }
thead tr:first-child > *, tbody:first-child tr:first-child > * { border-top-width: 1px; }
th { background: var(--head); text-align: left; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.nw { white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafbfc; }
tr > :first-child { position: sticky; left: 0; z-index: 1; background: #ffffff; }
thead tr > :first-child { background: var(--head); }
code { font: .85em/1.4 "DejaVu Sans Mono", Menlo, Consolas, monospace; background: var(--head); padding: .05rem .3rem;
  border-radius: 3px; overflow-wrap: break-word; }
blockquote.note { margin: 1rem 0; padding: .5rem 1rem; border-left: 4px solid var(--accent); background: var(--head); }
figure { margin: 1.2rem 0 2rem; padding: .6rem; border: 1px solid var(--line); border-radius: 6px; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: .88rem; margin-top: .4rem; }
figcaption a { color: var(--accent); }
svg .pt, svg .bar { cursor: crosshair; }
footer { color: var(--muted); font-size: .85rem; margin-top: 3rem; border-top: 1px solid var(--line);
  padding-top: .6rem; }
@media print { nav.toc { display: none; } figure { break-inside: avoid; } .table-wrap { overflow: visible; } }
"""


def _esc(s: str) -> str:
    return html.escape(tidy(s))


def inline(c: Content) -> str:
    out: list[str] = []
    for p in c:
        if isinstance(p, str):
            out.append(_esc(p))
        elif isinstance(p, Num):
            out.append(_esc(p.text))
        elif isinstance(p, Code):
            out.append(f"<code>{_esc(p.text)}</code>")
        elif isinstance(p, Strong):
            out.append(f"<strong>{_esc(p.text)}</strong>")
    return "".join(out)


class _Anchors:
    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, text: str) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        a, n = base, 2
        while a in self.used:
            a, n = f"{base}-{n}", n + 1
        self.used.add(a)
        return a


def _th(c: Column) -> str:
    what = ", ".join(x for x in (c.unit, c.stat) if x)
    title = f' title="{html.escape(what)}"' if what else ""
    cls = ' class="num"' if c.align == "right" else ""
    return f"<th{cls}{title}>{_esc(c.header)}</th>"


def _td(c: Column, cell: Content, empty: str) -> str:
    text = plain_text(cell) or empty
    names = [x for x in ("num" if c.align == "right" else "", "nw" if 0 < len(text) <= NOWRAP else "") if x]
    cls = f' class="{" ".join(names)}"' if names else ""
    return f"<td{cls}>{inline(cell) or _esc(empty)}</td>"


def _table(t: Table) -> str:
    out = ['<div class="table-wrap"><table>']
    if not t.headless:
        out += ["<thead><tr>", *(_th(c) for c in t.columns), "</tr></thead>"]
    out.append("<tbody>")
    for r in t.rows:
        out.append("<tr>" + "".join(_td(c, cell, t.empty) for c, cell in zip(t.columns, r, strict=True)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _formulas(f: Formulas) -> str:
    rows = "".join(f"<tr><td>{f'<code>{_esc(x.name)}</code>' if x.code else _esc(x.name)}</td><td>{_esc(x.definition)}"
                   "</td></tr>" for x in f.rows)
    return (f'<div class="table-wrap"><table><thead><tr><th>{_esc(f.headers[0])}</th><th>{_esc(f.headers[1])}</th>'
            f"</tr></thead><tbody>{rows}</tbody></table></div>")


def _block(b: Block, figures: Mapping[str, str], anchor: _Anchors, heads: list[tuple[str, str]]) -> str:
    if isinstance(b, Heading):
        a = anchor(plain_text(b.text))
        if b.level == 2:
            heads.append((a, inline(b.text)))
        return f'<h{b.level} id="{a}">{inline(b.text)}</h{b.level}>'
    if isinstance(b, Paragraph):
        return f"<p>{inline(b.text)}</p>"
    if isinstance(b, Bullets):
        return "<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, Note):
        return f'<blockquote class="note"><p>{inline(b.text)}</p></blockquote>'
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Formulas):
        return _formulas(b)
    if isinstance(b, Mermaid):
        return ""
    if isinstance(b, Figure):
        return figures.get(b.key, "")
    if isinstance(b, FigureGroup):
        shown = [figures[k] for k in b.keys if k in figures]
        if not shown:
            return ""
        a = anchor(b.title)
        if b.level == 2:
            heads.append((a, _esc(b.title)))
        return f'<h{b.level} id="{a}">{_esc(b.title)}</h{b.level}>\n' + "\n".join(shown)
    raise TypeError(f"not a block: {b!r}")


def render_html(doc: Document, figures: Mapping[str, str] | None = None) -> str:
    """The document as one HTML page; `figures`: a figure's key -> its HTML (a `<figure>` element). The table of
    contents (the level-2 headings) follows the title."""
    anchor = _Anchors()
    heads: list[tuple[str, str]] = []
    parts: list[str] = []
    after_title = 0
    for b in doc.blocks:
        if x := _block(b, figures or {}, anchor, heads):
            parts.append(x)
            if isinstance(b, Heading) and b.level == 1 and not after_title:
                after_title = len(parts)
    if heads:
        parts.insert(after_title, '<nav class="toc">' + "".join(f'<a href="#{a}">{t}</a>' for a, t in heads)
                     + "</nav>")
    body = "\n".join(parts)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="servescope {html.escape(__version__)}">\n'
            f"<title>{_esc(doc.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n"
            f"{body}\n<footer>A self-contained file: its styles and figures are inline and it loads nothing. "
            f"Made by servescope {html.escape(__version__)}.</footer>\n</main>\n</body>\n</html>\n")
