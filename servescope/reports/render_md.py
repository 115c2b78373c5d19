"""A document (servescope.reports.document) as Markdown that GitHub renders: GFM tables, Mermaid `xychart-beta`
charts, or, given the figures' files, image links in their place.

Escaping happens here and only here: text (`str` parts) has control characters removed and every character
Markdown could read as markup escaped (`\\ | ` * _ [ ] < >`, and the `&` of an entity reference); a figure (`Num`)
is written as it is when it is literal in Markdown, else escaped as text; a code span loses its backticks and, in a
table cell, escapes its pipes (GFM splits cells on them even inside code). Link targets are percent-encoded (spaces,
parentheses)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from servescope.core.textsafe import clean_text, md_escape
from servescope.reports.document import (
    Block,
    Bullets,
    Chart,
    Code,
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
    tidy,
)

__all__ = ["FigureFiles", "href", "inline", "render_markdown", "xychart_lines"]

_MARKUP = set("\\`*_|<>")


@dataclass(frozen=True)
class FigureFiles:
    """A figure as files beside the Markdown: its title and caption, and the paths of its SVG and PNG relative to
    the Markdown file (posix, not yet encoded)."""

    title: str
    caption: str
    svg: str
    png: str | None = None


_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")  # `&amp;` would be read as `&`


def _text(s: str) -> str:
    """Text escaped for Markdown (an entity reference's `&` too); spaces at its edges kept (parts of one sentence
    meet there)."""
    t = tidy(s)
    core = t.strip()
    if not core:
        return t
    lead, trail = t[: t.index(core)], t[t.index(core) + len(core):]
    return lead + _ENTITY.sub(r"\\&", md_escape(core)) + trail


def _literal(s: str) -> bool:
    """Markdown shows `s` as it is: no character that starts markup, no link (`](`, `][`)."""
    return (not (_MARKUP & set(s)) and "](" not in s and "][" not in s and not _ENTITY.search(s)
            and s == clean_text(s))


def href(path: str) -> str:
    """A link target as Markdown reads it: percent-encoded (a space or a parenthesis would end it)."""
    return quote(path, safe="/")


def inline(c: Content, in_table: bool = False) -> str:
    out: list[str] = []
    for p in c:
        if isinstance(p, str):
            out.append(_text(p))
        elif isinstance(p, Num):
            out.append(p.text if _literal(p.text) else _text(p.text))
        elif isinstance(p, Code):
            code = clean_text(p.text).replace("`", "")
            out.append(f"`{code.replace('|', chr(92) + '|') if in_table else code}`")
        elif isinstance(p, Strong):
            out.append(f"**{_text(p.text)}**")
    return "".join(out)


def _table(t: Table) -> list[str]:
    if t.headless:
        head = "|" + " |" * len(t.columns)
    else:
        head = "|" + "".join(f" {_text(c.header)} |" if c.header else " |" for c in t.columns)
    sep = "|" + "|".join("---:" if c.align == "right" else "---" for c in t.columns) + "|"
    lines = [head, sep]
    for r in t.rows:
        lines.append("| " + " | ".join(inline(c, in_table=True) or t.empty for c in r) + " |")
    return lines


def _formulas(f: Formulas) -> list[str]:
    lines = [f"| {f.headers[0]} | {f.headers[1]} |", "|---|---|"]
    for x in f.rows:
        name = f"`{clean_text(x.name).replace('`', '')}`" if x.code else _text(x.name)
        lines.append(f"| {name} | {_text(x.definition)} |")
    return lines


def _mermaid_text(s: str) -> str:
    return clean_text(s).replace('"', "'").replace("`", "'")


def _chart_num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def _nice_ceiling(v: float) -> float:
    import math

    if v <= 0 or math.isnan(v):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * mag >= v * 1.05:
            return m * mag
    return 10 * mag


def xychart_lines(c: Chart) -> list[str]:
    """A Mermaid xychart-beta block: one line per series, all as long as the categories."""
    top = _nice_ceiling(max((v for s in c.series for v in s), default=0.0))
    cats = ", ".join(f'"{_mermaid_text(x)}"' for x in c.categories)
    out = ["```mermaid", "xychart-beta", f'    title "{_mermaid_text(c.title)}"',
           f'    x-axis "{_mermaid_text(c.x_label)}" [{cats}]',
           f'    y-axis "{_mermaid_text(c.y_label)}" 0 --> {top:g}']
    out += ["    line [" + ", ".join(_chart_num(v) for v in s) + "]" for s in c.series]
    return out + ["```"]


def _figure(key: str, figures: Mapping[str, FigureFiles]) -> list[str]:
    f = figures[key]
    png = f" ([PNG]({href(f.png)}))" if f.png else ""
    return [f"![{_text(f.title)}]({href(f.svg)})", "", f"*{_text(f.caption)}*{png}"]


def _block(b: Block, figures: Mapping[str, FigureFiles] | None) -> list[str]:
    if isinstance(b, Heading):
        return ["#" * b.level + " " + inline(b.text)]
    if isinstance(b, Paragraph):
        return [inline(b.text)]
    if isinstance(b, Bullets):
        return [f"- {inline(i)}" for i in b.items]
    if isinstance(b, Note):
        return [f"> {inline(b.text)}"]
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Formulas):
        return _formulas(b)
    if isinstance(b, Mermaid):
        if figures is not None or not b.charts:
            return []
        out: list[str] = []
        for c in b.charts:
            out += [*xychart_lines(c), ""]
        return out + [inline(b.legend)] if b.legend else out[:-1]
    if isinstance(b, Figure):
        return _figure(b.key, figures) if figures is not None and b.key in figures else []
    if isinstance(b, FigureGroup):
        keys = [k for k in b.keys if figures is not None and k in figures]
        if not keys or figures is None:
            return []
        out = ["#" * b.level + " " + _text(b.title)]
        for k in keys:
            out += ["", *_figure(k, figures)]
        return out
    raise TypeError(f"not a block: {b!r}")


def render_blocks(blocks: Sequence[Block], figures: Mapping[str, FigureFiles] | None = None) -> str:
    """The blocks as Markdown, one blank line between them, ending in one newline."""
    parts = ["\n".join(lines) for b in blocks if (lines := _block(b, figures))]
    return "\n\n".join(parts).rstrip() + "\n"


def render_markdown(doc: Document, figures: Mapping[str, FigureFiles] | None = None) -> str:
    """The document as Markdown: with its Mermaid charts, or with `figures` (key -> its files) linked in their
    places instead."""
    return render_blocks(doc.blocks, figures)
