"""A report as one self-contained HTML file, and a Markdown report with its figures as files beside it.

`report_html()` / `compare_html()`: the Markdown report (servescope.reports.report, the same text `--format md`
prints) turned into HTML, its Mermaid charts replaced by the figures (servescope.reports.figures, drawn as
inline SVG with every point's value in a `<title>` tooltip), the styles inline. Nothing is loaded from anywhere:
no script, no font, no image, no stylesheet, and a Content-Security-Policy that forbids the browser any fetch, so
the file reads the same offline years later. Text from servers and users is escaped (a model named `<script>`
is text).

`report_markdown()` / `compare_markdown()` with `figures_dir`: the Markdown report with its figures written to
that folder as SVG and PNG files and linked by relative paths (ready to drop into a GitHub issue); without it,
the report keeps its Mermaid charts."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servescope import __version__
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text, md_escape
from servescope.reports.figures import FigureSpec, comparison_figures, session_figures
from servescope.reports.figures_svg import Rendered, render, require_plots
from servescope.reports.report import build, build_all, render_markdown
from servescope.reports.report_sections import SessionReport
from servescope.reports.tunereport import TUNE_TITLE
from servescope.sessions.compare import Comparison, compare_sessions
from servescope.sessions.stats import MIN_EFFECT_PCT
from servescope.sessions.store import Session

__all__ = ["CSP", "ReportParts", "compare_html", "compare_markdown", "md_to_html", "report_html",
           "report_markdown", "write_report_files"]

# the browser may fetch nothing: the page's own inline styles and data: images only
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
FIG = "\x00FIG:"  # a line of the Markdown that stands for a figure (replaced by its HTML or its links)

STYLE = """
:root { --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --head: #f6f8fa; --accent: #0072B2; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #ffffff;
  font: 15px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Helvetica, Arial, sans-serif; }
main { max-width: 72rem; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
h1 { font-size: 1.6rem; border-bottom: 2px solid var(--accent); padding-bottom: .3rem; }
h2 { font-size: 1.3rem; margin-top: 2.2rem; border-bottom: 1px solid var(--line); padding-bottom: .2rem; }
h3 { font-size: 1.1rem; margin-top: 1.6rem; }
nav.toc { background: var(--head); border: 1px solid var(--line); border-radius: 6px; padding: .5rem 1rem;
  font-size: .9rem; }
nav.toc a { color: var(--accent); text-decoration: none; margin-right: 1rem; white-space: nowrap; }
.table-wrap { overflow-x: auto; margin: .8rem 0; }
table { border-collapse: collapse; font-size: .85rem; }
th, td { border: 1px solid var(--line); padding: .3rem .55rem; vertical-align: top; }
th { background: var(--head); text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.nw { white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfc; }
code { font: .85em/1.4 "DejaVu Sans Mono", Menlo, Consolas, monospace; background: var(--head); padding: .05rem .3rem;
  border-radius: 3px; }
pre { background: var(--head); padding: .8rem; overflow-x: auto; border-radius: 6px; }
figure { margin: 1.2rem 0 2rem; padding: .6rem; border: 1px solid var(--line); border-radius: 6px; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: .88rem; margin-top: .4rem; }
figcaption a { color: var(--accent); }
svg .pt, svg .bar { cursor: crosshair; }
footer { color: var(--muted); font-size: .85rem; margin-top: 3rem; border-top: 1px solid var(--line);
  padding-top: .6rem; }
@media print { nav.toc { display: none; } figure { break-inside: avoid; } }
"""


# ---- the reports, as the Markdown report builds them -------------------------------------------------
@dataclass
class ReportParts:
    rep: SessionReport
    others: list[SessionReport]
    comparison: Comparison | None

    def markdown(self) -> str:
        return render_markdown(self.rep, self.others, self.comparison)

    def figures(self) -> list[FigureSpec]:
        specs = session_figures(self.rep)
        if self.comparison is not None and self.comparison.cells:
            specs += comparison_figures(self.comparison, [self.rep, *self.others])
        return specs


def report_parts(session: Session, compare_with: Sequence[Session] = (), slos: Mapping[str, float] | None = None,
                 label_key: str | None = None, include_bound: bool = False) -> ReportParts:
    """What `render_report(..., fmt="md")` renders: the session's report, the others', and their comparison."""
    return ReportParts(*build_all(session, compare_with, slos, label_key, include_bound))


# ---- placing the figures in the Markdown -------------------------------------------------------------
def _place(md: str, specs: Sequence[FigureSpec], section_of: Mapping[str, str], tail_before: Sequence[str],
           tail_heading: str) -> list[str]:
    """The Markdown's lines with its Mermaid charts (and their legend line) taken out and a FIG line per figure:
    a workload's figures at the end of its section (`section_of`: workload -> its heading line), the others in a
    section of their own before the first of the `tail_before` headings (else at the end)."""
    lines = md.rstrip("\n").split("\n")
    out: list[str] = []
    placed: set[str] = set()
    by_heading: dict[str, list[FigureSpec]] = {}
    for s in specs:
        h = section_of.get(s.workload or "")
        if h is not None:
            by_heading.setdefault(h, []).append(s)
    current: str | None = None

    def close() -> None:
        if current is not None:
            for s in by_heading.get(current, []):
                if s.name not in placed:
                    out.extend([FIG + s.name, ""])
                    placed.add(s.name)

    rest = [s for s in specs if (s.workload or "") not in section_of]
    tail_done = False
    in_mermaid = False
    for line in lines:
        if in_mermaid:
            in_mermaid = line.strip() != "```"
            continue
        if line.strip() == "```mermaid":
            in_mermaid = True
            continue
        if line.startswith("Lines in each chart, in order:"):
            continue
        if line.startswith("#"):
            close()
            current = line if line in by_heading else None
            if not tail_done and rest and any(line.startswith(t) for t in tail_before):
                out += [tail_heading, ""] + [x for s in rest for x in (FIG + s.name, "")]
                tail_done = True
        if line.startswith("Generated by servescope") and not tail_done and rest:
            close()
            current = None
            out += [tail_heading, ""] + [x for s in rest for x in (FIG + s.name, "")]
            tail_done = True
        out.append(line)
    close()
    if not tail_done and rest:
        out += ["", tail_heading, ""] + [x for s in rest for x in (FIG + s.name, "")]
    for s in specs:  # a workload whose section was not found: at the end
        if s.name not in placed and s not in rest:
            out += [FIG + s.name, ""]
    return out


def _report_lines(parts: ReportParts, specs: Sequence[FigureSpec]) -> list[str]:
    sections = {s.workload: (f"## {TUNE_TITLE}" if s.kind == "tune" else f"## Results: {md_escape(s.workload)}")
                for s in specs if s.workload is not None and s.kind != "compare"}  # tune: in its own section
    return _place(parts.markdown(), [s for s in specs if s.kind != "compare"], sections, ["## Notes"],
                  "## Figures") + _compare_tail(specs)


def _compare_tail(specs: Sequence[FigureSpec]) -> list[str]:
    cmp = [s for s in specs if s.kind == "compare"]
    if not cmp:
        return []
    return ["", "## Figures: the comparison", ""] + [x for s in cmp for x in (FIG + s.name, "")]


# ---- Markdown with figure files ----------------------------------------------------------------------
def _write_figures(figs: Sequence[Rendered], folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for r in figs:
            (folder / f"{r.spec.name}.svg").write_text(r.svg_file, encoding="utf-8")
            if r.png is not None:
                (folder / f"{r.spec.name}.png").write_bytes(r.png)
    except OSError as e:
        raise ServescopeError(f"cannot write the figures to {folder}: {e.strerror or e}; choose another --figures "
                              "folder") from None


def _rel(folder: Path, output: Path | None) -> str:
    base = output.parent if output is not None else Path.cwd()
    return Path(os.path.relpath(folder.resolve(), base.resolve())).as_posix()


def _md_links(lines: Sequence[str], figs: Mapping[str, Rendered], rel: str) -> str:
    out = []
    for line in lines:
        if line.startswith(FIG):
            r = figs[line[len(FIG):]]
            name = r.spec.name
            out += [f"![{md_escape(r.spec.title)}]({rel}/{name}.svg)", "",
                    f"*{md_escape(r.spec.caption)}* ([PNG]({rel}/{name}.png))"]
        else:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def report_markdown(parts: ReportParts, figures_dir: Path, output: Path | None = None) -> str:
    """The Markdown report, its figures written to `figures_dir` (SVG and PNG) and linked relative to the
    report's file (`output`; the current folder when it goes to stdout)."""
    require_plots()
    specs = parts.figures()
    figs = {s.name: render(s, png=True) for s in specs}
    _write_figures(list(figs.values()), figures_dir)
    return _md_links(_report_lines(parts, specs), figs, _rel(figures_dir, output))


def compare_markdown(comp: Comparison, figures_dir: Path, output: Path | None = None,
                     reps: Sequence[SessionReport] = ()) -> str:
    require_plots()
    specs = comparison_figures(comp, reps)
    figs = {s.name: render(s, png=True) for s in specs}
    _write_figures(list(figs.values()), figures_dir)
    lines = _place(comp.to_markdown(level=1), specs, {}, ["## Capacity, knee and peak"], "## Figures")
    return _md_links(lines, figs, _rel(figures_dir, output))


# ---- HTML --------------------------------------------------------------------------------------------
def report_html(parts: ReportParts) -> str:
    """The whole report as one HTML file: everything inline, nothing fetched."""
    require_plots()
    specs = parts.figures()
    figs = {s.name: render(s) for s in specs}
    return _page(f"servescope report: {parts.rep.label}", _report_lines(parts, specs), figs)


def compare_html(comp: Comparison, reps: Sequence[SessionReport] = ()) -> str:
    require_plots()
    specs = comparison_figures(comp, reps)
    figs = {s.name: render(s) for s in specs}
    lines = _place(comp.to_markdown(level=1), specs, {}, ["## Capacity, knee and peak"], "## Figures")
    return _page(f"servescope comparison: {' vs '.join(comp.labels)}", lines, figs)


def compare_parts(sessions: Sequence[Session], label_key: str | None = None,
                  slos: Mapping[str, float] | None = None, min_effect: float = MIN_EFFECT_PCT,
                  include_bound: bool = False) -> tuple[Comparison, list[SessionReport]]:
    """The comparison `servescope compare` prints, and each session's report (for its twin's curves)."""
    comp = compare_sessions(sessions, label_key=label_key, slos=slos, min_effect=min_effect,
                            include_bound=include_bound)
    reps = [build(s, comp.slos, label_key, include_bound) for s in sessions]
    for r, lb in zip(reps, comp.labels, strict=True):
        r.label = lb
    return comp, reps


def _figure_html(r: Rendered) -> str:
    return (f'<figure id="fig-{html.escape(r.spec.name)}">{r.svg}<figcaption><strong>{html.escape(r.spec.title)}.'
            f"</strong> {html.escape(r.spec.caption)} Hover a point for its value.</figcaption></figure>")


def _page(title: str, lines: Sequence[str], figs: Mapping[str, Rendered]) -> str:
    body = md_to_html(lines, {k: _figure_html(v) for k, v in figs.items()})
    heads = re.findall(r'<h2 id="([^"]+)">(.*?)</h2>', body)
    toc = ('<nav class="toc">' + "".join(f'<a href="#{i}">{t}</a>' for i, t in heads) + "</nav>") if heads else ""
    body = body.replace("</h1>", "</h1>" + toc, 1)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="servescope {html.escape(__version__)}">\n'
            f"<title>{html.escape(clean_text(title))}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n"
            f"{body}\n<footer>A self-contained file: its styles and figures are inline and it loads nothing. "
            f"Made by servescope {html.escape(__version__)}.</footer>\n</main>\n</body>\n</html>\n")


# ---- a small Markdown to HTML converter (the subset the reports write) --------------------------------
_ESCAPABLE = set("\\`*_{}[]()<>#+-.!|")


def _inline(s: str) -> str:
    """Backslash escapes, `code`, **bold**; everything else escaped as text."""
    out: list[str] = []
    bold = False
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] in _ESCAPABLE:
            out.append(html.escape(s[i + 1]))
            i += 2
        elif ch == "`" and (j := s.find("`", i + 1)) > i:
            out.append(f"<code>{html.escape(s[i + 1:j])}</code>")
            i = j + 1
        elif s.startswith("**", i):
            out.append("</strong>" if bold else "<strong>")
            bold = not bold
            i += 2
        else:
            out.append(html.escape(ch))
            i += 1
    if bold:
        out.append("</strong>")
    return "".join(out)


def _cells(row: str) -> list[str]:
    """A table row's cells, split on the pipes that are not escaped."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)]


_SEP = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _table(rows: list[str]) -> str:
    head = _cells(rows[0])
    aligns = ["num" if c.endswith(":") else "" for c in _cells(rows[1])]

    def cls(i: int, text: str = "") -> str:
        names = [x for x in ("num" if i < len(aligns) and aligns[i] else "", "nw" if 0 < len(text) <= 28 else "") if x]
        return f' class="{" ".join(names)}"' if names else ""

    out = ['<div class="table-wrap"><table>']
    if any(head):  # a key-value table (`| | |`) has no header worth a row
        out += ["<thead><tr>", *(f"<th{cls(i)}>{_inline(c)}</th>" for i, c in enumerate(head)), "</tr></thead>"]
    out.append("<tbody>")
    for r in rows[2:]:
        out.append("<tr>" + "".join(f"<td{cls(i, c)}>{_inline(c)}</td>" for i, c in enumerate(_cells(r))) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _anchor(text: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    a, n = base, 2
    while a in used:
        a, n = f"{base}-{n}", n + 1
    used.add(a)
    return a


def md_to_html(lines: Sequence[str] | str, figures: Mapping[str, str] | None = None) -> str:
    """HTML of the Markdown the reports write: headings, tables, lists, fenced code (Mermaid blocks are left
    out: the HTML has figures), paragraphs; FIG lines become `figures[name]`."""
    if isinstance(lines, str):
        lines = lines.split("\n")
    figures = figures or {}
    out: list[str] = []
    para: list[str] = []
    used: set[str] = set()
    i = 0
    n = len(lines)

    def flush() -> None:
        if para:
            out.append("<p>" + " ".join(_inline(p) for p in para) + "</p>")
            para.clear()

    while i < n:
        line = lines[i]
        st = line.strip()
        if line.startswith(FIG):
            flush()
            out.append(figures.get(line[len(FIG):], ""))
        elif st.startswith("```"):
            flush()
            lang = st[3:].strip()
            block = []
            i += 1
            while i < n and lines[i].strip() != "```":
                block.append(lines[i])
                i += 1
            if lang != "mermaid":
                out.append(f"<pre><code>{html.escape(chr(10).join(block))}</code></pre>")
        elif m := re.match(r"^(#{1,6})\s+(.*)$", st):
            flush()
            level = len(m[1])
            text = _inline(m[2])
            out.append(f'<h{level} id="{_anchor(re.sub(r"<[^>]+>", "", text), used)}">{text}</h{level}>')
        elif st.startswith("|") and i + 1 < n and _SEP.match(lines[i + 1].strip()):
            flush()
            rows = [line, lines[i + 1]]
            i += 2
            while i < n and lines[i].strip().startswith("|"):
                rows.append(lines[i])
                i += 1
            out.append(_table(rows))
            continue
        elif re.match(r"^\s*[-*] ", line):
            flush()
            depth = 0
            while i < n and (m2 := re.match(r"^(\s*)[-*] (.*)$", lines[i])):
                d = len(m2[1]) // 2 + 1
                while depth < d:
                    out.append("<ul>")
                    depth += 1
                while depth > d:
                    out.append("</ul>")
                    depth -= 1
                item = m2[2]
                i += 1
                while i < n and lines[i].startswith("  ") and lines[i].strip() and not re.match(r"^\s*[-*] ",
                                                                                               lines[i]):
                    item += " " + lines[i].strip()
                    i += 1
                out.append(f"<li>{_inline(item)}</li>")
            out += ["</ul>"] * depth
            continue
        elif not st:
            flush()
        else:
            para.append(st)
        i += 1
    flush()
    return "\n".join(out)


# ---- the app's "open report" -------------------------------------------------------------------------
def write_report_files(session: Session, folder: Path | None = None) -> tuple[Path | None, Path, str]:
    """report.html (when matplotlib is installed) and report.md in `folder` (the session's own by default):
    (html path or None, md path, a note when the HTML could not be made)."""
    folder = folder or session.path
    parts = report_parts(session)
    md_path = folder / "report.md"
    html_path: Path | None = folder / "report.html"
    note = ""
    try:
        md_path.write_text(parts.markdown(), encoding="utf-8")
        try:
            assert html_path is not None
            html_path.write_text(report_html(parts), encoding="utf-8")
        except ServescopeError as e:
            html_path, note = None, e.message
    except OSError as e:
        raise ServescopeError(f"cannot write the report into {folder}: {e.strerror or e}") from None
    return html_path, md_path, note
