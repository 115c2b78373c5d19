"""The typed document and its renderers: each renderer escapes text for its format once, so what a server or a user
named reads back exactly as typed (Markdown read by markdown-it-py as GitHub would, HTML by the standard parser);
figures written by servescope stay as they are in the Markdown source; figure blocks go where they stand, only
where figures are drawn; no module of servescope parses Markdown or HTML servescope wrote."""

from __future__ import annotations

import ast
import html.parser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from servescope.reports.document import (
    Chart,
    Code,
    Column,
    Document,
    Figure,
    FigureGroup,
    Mermaid,
    Num,
    Strong,
    bullets,
    heading,
    para,
    right,
    row,
    table,
)
from servescope.reports.render_html import render_html
from servescope.reports.render_md import FigureFiles, render_markdown
from tests.sessions.mdcheck import tables

HOSTILE = "a|b *c* _d_ <e> `f` \\g [h](i) &amp; #j [k]: l \x1b[31mred"
SHOWN = "a|b *c* _d_ <e> `f` \\g [h](i) &amp; #j [k]: l red"  # the escape sequence removed, nothing else


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def text_of(fragment: str) -> tuple[str, list[str]]:
    p = _Text()
    p.feed(fragment)
    return "".join(p.parts), p.tags


def md_html(md: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(md)


@pytest.mark.parametrize("where", ["paragraph", "cell", "heading", "item"])
def test_markdown_shows_hostile_text_as_typed(where: str) -> None:
    doc = Document("t", [
        heading(1, HOSTILE) if where == "heading" else para("x"),
        para(HOSTILE) if where == "paragraph" else para("x"),
        table((Column("h"), Column("i")), [row(HOSTILE, "y")]) if where == "cell" else para("x"),
        bullets([HOSTILE]) if where == "item" else para("x"),
    ])
    md = render_markdown(doc)
    if where == "cell":
        assert [t.rows[0] for t in tables(md)][0][1] == "y"  # the pipe did not split the cell
    shown, tags = text_of(md_html(md))
    assert SHOWN in shown, (md, shown)
    assert not {"em", "strong", "a", "code", "e"} & set(tags), tags


def test_html_shows_hostile_text_as_typed_and_runs_nothing() -> None:
    doc = Document(HOSTILE, [heading(1, HOSTILE), para(HOSTILE, " ", Strong(HOSTILE), " ", Code(HOSTILE)),
                             table((Column(HOSTILE),), [row(HOSTILE)])])
    page = render_html(doc)
    body = page[page.index("<main>"):]
    shown, tags = text_of(body)
    assert shown.count(SHOWN) == 6  # heading, paragraph, strong, code, header, cell
    assert "e" not in tags and "\x1b" not in page


def test_a_figure_stays_as_servescope_wrote_it_in_the_markdown() -> None:
    """An interval is literal in Markdown: it is not escaped (the source reads as the page); one that is not
    literal (it would start markup) is escaped like text."""
    md = render_markdown(Document("t", [para(Num("+6.4% [+5.5, +33.9] worse")), para(Num("*5*"))]))
    assert "+6.4% [+5.5, +33.9] worse\n" in md and "\\*5\\*" in md
    shown, _ = text_of(md_html(md))
    assert "+6.4% [+5.5, +33.9] worse" in shown and "*5*" in shown


def test_code_in_a_table_cell_keeps_its_pipe_inside_the_cell() -> None:
    md = render_markdown(Document("t", [table((Column("a"), Column("b")), [row(Code("x|y"), "z")])]))
    (t,) = tables(md)
    assert t.rows == [["`x|y`", "z"]]  # one cell: the parser took the escaped pipe as text
    assert "<code>x|y</code>" in md_html(md)


def test_figures_go_where_their_blocks_stand_and_only_where_figures_are_drawn() -> None:
    chart = Mermaid((Chart("c", "x", ("1", "2"), "y", ((1.0, 2.0),)),))
    doc = Document("t", [heading(1, "t"), heading(2, "Results: w"), para("table"), chart, Figure("w-a"),
                         FigureGroup(2, "Figures", ("ctx",)), heading(2, "Notes")])
    plain = render_markdown(doc)
    assert "```mermaid" in plain and "w-a" not in plain and "## Figures" not in plain
    files = {k: FigureFiles(f"title {k}", f"caption {k}", f"my figs (1)/{k}.svg", f"my figs (1)/{k}.png")
             for k in ("w-a", "ctx")}
    md = render_markdown(doc, files)
    assert "```mermaid" not in md
    assert md.index("table") < md.index("![title w-a](my%20figs%20%281%29/w-a.svg)") < md.index("## Figures")
    assert md.index("## Figures") < md.index("ctx.svg") < md.index("## Notes")
    page = render_html(doc, {"w-a": '<figure id="fig-w-a"></figure>'})
    assert page.index("table") < page.index('id="fig-w-a"') < page.index('id="notes"')
    assert 'id="figures"' not in page  # its figure was not drawn: no empty section
    assert "xychart" not in page


def test_a_column_says_its_unit_and_statistic() -> None:
    page = render_html(Document("t", [table((Column("load"), right("TTFT ms p50", "ms", "p50")),
                                            [row("c=1", Num("100.0"))])]))
    assert '<th class="num" title="ms, p50">TTFT ms p50</th>' in page


def test_no_module_parses_markdown_or_html_that_servescope_wrote() -> None:
    """No markdown-it, html.parser or hand-written Markdown reader under servescope/: documents are built once and
    rendered; nothing reads a rendering back."""
    pkg = Path(__file__).resolve().parents[2] / "servescope"
    readers = {"markdown_it", "html.parser", "mistune", "markdown", "commonmark", "bs4", "lxml"}
    for p in pkg.rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not {n for n in names if n.split(".")[0] in readers or n in readers}, p
        for gone in ("md_to_html", "\\x00FIG", "md_tables", "def _place("):
            assert gone not in text, (p, gone)
