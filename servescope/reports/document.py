"""A report, a compare page or a gate summary as one typed document: a list of blocks (heading, paragraph, list,
note, table whose columns carry their unit and statistic, formulas, Mermaid charts, figures), each holding text
as data. The renderers (servescope.reports.render_md, render_html) turn a document into Markdown or HTML; each
escapes for its own format, once, and none reads another's output. What the app shows of a report (its quality
panes, the compare headline) takes the same rows and `plain_text()`: escape sequences removed, the terminal's
escaping (Textual's widgets take it as text, never as markup).

Inline text is a tuple of parts:
- `str`: text (prose, or data from servers and users); every renderer escapes it for its format;
- `Num(text)`: a figure as servescope formats it (`1,234.5`, `+6.4% [+5.5, +33.9] worse`, `c=4`): the Markdown
  renderer writes it as it is when it is literal in Markdown (no escaping character, no link syntax), else escapes
  it as text, so a figure reads the same in the Markdown source as on the page;
- `Code(text)`, `Strong(text)`.

Figures are placed by the block they belong to: a `Figure` carries a figure spec's name
(servescope.reports.figures.FigureSpec.name) and a renderer that draws figures resolves it; one that does not (the
plain Markdown report, which shows its charts as Mermaid blocks instead) leaves it out, and a `FigureGroup` with its
heading."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from servescope.core.textsafe import clean_text


# ---- inline text ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Num:
    """A figure as servescope formats it (digits, signs, units, intervals, verdict words)."""

    text: str


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Strong:
    text: str


Inline = str | Num | Code | Strong
Content = tuple[Inline, ...]


def content(*parts: Inline | Content | None) -> Content:
    """The parts as one inline text; nested tuples are flattened, None and "" left out."""
    out: list[Inline] = []
    for p in parts:
        if p is None or p == "":
            continue
        if isinstance(p, tuple):
            out.extend(x for x in p if x != "")
        else:
            out.append(p)
    return tuple(out)


_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)


def tidy(s: str) -> str:
    """Text as every renderer takes it: control characters and escape sequences removed, line breaks as spaces
    (servescope.core.textsafe.clean_text), a space kept at either edge where there was one (parts of a sentence
    meet there)."""
    m = _EDGES.match(s)
    assert m is not None
    lead, mid, trail = m.groups()
    mid = clean_text(mid)
    return (" " if lead else "") + mid + (" " if trail and mid else "")


def plain_text(c: Content | str) -> str:
    """The text of inline parts without any markup (what a reader sees), tidied."""
    if isinstance(c, str):
        return clean_text(c)
    return clean_text("".join(tidy(p) if isinstance(p, str) else tidy(p.text) for p in c))


# ---- blocks ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Heading:
    level: int  # 1: the document's title
    text: Content


@dataclass(frozen=True)
class Paragraph:
    text: Content


@dataclass(frozen=True)
class Bullets:
    items: tuple[Content, ...]


@dataclass(frozen=True)
class Note:
    """The one line a reader must see (a gate's verdict): a quote in Markdown, a call-out in HTML."""

    text: Content


@dataclass(frozen=True)
class Column:
    """A table column: its header as printed, and what its values are (their unit and statistic: `ms`, `p50 /
    p90 / p99`), right-aligned when `align` says so (figures)."""

    header: str
    align: Literal["left", "right"] = "left"
    unit: str = ""
    stat: str = ""


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[Content, ...], ...]
    headless: bool = False  # a key-value table: no header worth a row
    empty: str = "-"  # what an empty cell shows ("": stays empty, as the grouped rows of a comparison)

    def __post_init__(self) -> None:
        for r in self.rows:
            if len(r) != len(self.columns):
                raise ValueError(f"a table row has {len(r)} cells for {len(self.columns)} columns")


@dataclass(frozen=True)
class Formula:
    """One metric's definition: its name (a key such as `ttft_ms`, shown as code, or words) and how it is
    computed."""

    name: str
    definition: str
    code: bool = True


@dataclass(frozen=True)
class Formulas:
    rows: tuple[Formula, ...]
    headers: tuple[str, str] = ("metric", "definition")


@dataclass(frozen=True)
class Chart:
    """A line chart with categorical x (a Mermaid `xychart-beta`): one series a line, as long as the categories."""

    title: str
    x_label: str
    categories: tuple[str, ...]
    y_label: str
    series: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class Mermaid:
    """Charts for a Markdown page that renders Mermaid (GitHub); a page with figures shows those instead."""

    charts: tuple[Chart, ...]
    legend: Content = ()  # which line is which session, under the charts


@dataclass(frozen=True)
class Figure:
    key: str  # the FigureSpec's name


@dataclass(frozen=True)
class FigureGroup:
    """Figures with a heading of their own (those that belong to no section): only where figures are drawn."""

    level: int
    title: str
    keys: tuple[str, ...]


Block = Heading | Paragraph | Bullets | Note | Table | Formulas | Mermaid | Figure | FigureGroup


@dataclass
class Document:
    title: str  # the page's title (HTML <title>); the first heading says it on the page
    blocks: list[Block] = field(default_factory=list)

    def figure_keys(self) -> list[str]:
        """The figures the document places, in order."""
        out: list[str] = []
        for b in self.blocks:
            if isinstance(b, Figure):
                out.append(b.key)
            elif isinstance(b, FigureGroup):
                out.extend(b.keys)
        return out


# ---- building ---------------------------------------------------------------------------------------------
def heading(level: int, *parts: Inline | Content | None) -> Heading:
    return Heading(level, content(*parts))


def para(*parts: Inline | Content | None) -> Paragraph:
    return Paragraph(content(*parts))


def bullets(items: Iterable[Content | str]) -> Bullets:
    return Bullets(tuple(content(i) for i in items))


def cols(*specs: str | Column) -> tuple[Column, ...]:
    return tuple(c if isinstance(c, Column) else Column(c) for c in specs)


def right(header: str, unit: str = "", stat: str = "") -> Column:
    return Column(header, "right", unit, stat)


def row(*cells: Inline | Content | None) -> tuple[Content, ...]:
    return tuple(content(c) for c in cells)


def table(columns: Sequence[Column], rows: Iterable[Sequence[Content]], headless: bool = False,
          empty: str = "-") -> Table:
    return Table(tuple(columns), tuple(tuple(r) for r in rows), headless, empty)
