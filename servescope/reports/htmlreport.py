"""A report with its figures: one self-contained HTML file, or Markdown with its figures as files beside it.

The report (servescope.reports.report.report_document) and the compare page
(servescope.reports.compare_doc.comparison_document) are built once, as documents that place each figure by its
key in the section it belongs to; the figures (servescope.reports.figures, drawn by servescope.reports.figures_svg)
are drawn here, one by one, each step told to `progress` (the CLI prints it on stderr).

`report_html()` / `compare_html()`: the page (servescope.reports.render_html) with every figure inline as SVG, each
point's value in a `<title>` tooltip. `report_markdown()` / `compare_markdown()` with `figures_dir`: the Markdown
(servescope.reports.render_md) with the figures written to that folder as SVG and PNG files and linked by
relative, percent-encoded paths (ready to drop into a GitHub issue); without a folder, the report keeps its Mermaid
charts (servescope.reports.report.render_markdown)."""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servescope.core.errors import ServescopeError
from servescope.reports.compare_doc import comparison_document
from servescope.reports.document import Document
from servescope.reports.figures import FigureSpec, comparison_figures, session_figures
from servescope.reports.figures_svg import Rendered, render, require_plots
from servescope.reports.render_html import CSP, render_html
from servescope.reports.render_md import FigureFiles
from servescope.reports.render_md import render_markdown as markdown_of
from servescope.reports.report import build, build_all, render_markdown, report_document
from servescope.reports.report_sections import SessionReport
from servescope.sessions.compare import Comparison, compare_sessions
from servescope.sessions.stats import MIN_EFFECT_PCT
from servescope.sessions.store import Session

__all__ = ["CSP", "FigureProgress", "ReportParts", "compare_html", "compare_markdown", "compare_parts", "draw",
           "report_html", "report_markdown", "report_parts", "write_report_files"]

FigureProgress = Callable[[int, int, FigureSpec], None]  # (figures drawn before this one, all of them, this one)


# ---- the reports, built once ---------------------------------------------------------------------------------
@dataclass
class ReportParts:
    rep: SessionReport
    others: list[SessionReport]
    comparison: Comparison | None

    def markdown(self) -> str:
        """The report as `servescope report` prints it (Mermaid charts, no figure files)."""
        return render_markdown(self.rep, self.others, self.comparison)

    def figures(self) -> list[FigureSpec]:
        specs = session_figures(self.rep)
        if self.comparison is not None and self.comparison.cells:
            specs += comparison_figures(self.comparison, [self.rep, *self.others])
        return specs

    def document(self, figures: Sequence[FigureSpec] | None = None) -> Document:
        return report_document(self.rep, self.others, self.comparison, figures)


def report_parts(session: Session, compare_with: Sequence[Session] = (), slos: Mapping[str, float] | None = None,
                 label_key: str | None = None, include_bound: bool = False) -> ReportParts:
    """What `render_report(..., fmt="md")` renders: the session's report, the others', and their comparison."""
    return ReportParts(*build_all(session, compare_with, slos, label_key, include_bound))


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


# ---- drawing -------------------------------------------------------------------------------------------------
def draw(specs: Sequence[FigureSpec], png: bool = False, progress: FigureProgress | None = None) -> dict[str, Rendered]:
    """Every figure drawn (SVG, and PNG when asked), by name; `progress` hears of each before it is drawn."""
    require_plots()
    out: dict[str, Rendered] = {}
    for i, s in enumerate(specs):
        if progress is not None:
            progress(i, len(specs), s)
        out[s.name] = render(s, png=png)
    return out


def _figure_html(r: Rendered) -> str:
    caption = r.spec.caption
    hover = "" if "hover" in caption.lower() else " Hover a point for its value."
    return (f'<figure id="fig-{html.escape(r.spec.name)}">{r.svg}<figcaption><strong>{html.escape(r.spec.title)}.'
            f"</strong> {html.escape(caption)}{hover}</figcaption></figure>")


def _page(doc: Document, figs: Mapping[str, Rendered]) -> str:
    return render_html(doc, {k: _figure_html(v) for k, v in figs.items()})


# ---- Markdown with figure files ----------------------------------------------------------------------------
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


def _files(figs: Mapping[str, Rendered], rel: str) -> dict[str, FigureFiles]:
    return {k: FigureFiles(r.spec.title, r.spec.caption, f"{rel}/{k}.svg", f"{rel}/{k}.png" if r.png else None)
            for k, r in figs.items()}


def report_markdown(parts: ReportParts, figures_dir: Path, output: Path | None = None,
                    progress: FigureProgress | None = None) -> str:
    """The Markdown report, its figures written to `figures_dir` (SVG and PNG) and linked relative to the
    report's file (`output`; the current folder when it goes to stdout)."""
    require_plots()
    specs = parts.figures()
    figs = draw(specs, png=True, progress=progress)
    _write_figures(list(figs.values()), figures_dir)
    return markdown_of(parts.document(specs), _files(figs, _rel(figures_dir, output)))


def compare_markdown(comp: Comparison, figures_dir: Path, output: Path | None = None,
                     reps: Sequence[SessionReport] = (), progress: FigureProgress | None = None) -> str:
    require_plots()
    specs = comparison_figures(comp, reps)
    figs = draw(specs, png=True, progress=progress)
    _write_figures(list(figs.values()), figures_dir)
    return markdown_of(comparison_document(comp, [s.name for s in specs]), _files(figs, _rel(figures_dir, output)))


# ---- HTML ------------------------------------------------------------------------------------------------------
def report_html(parts: ReportParts, progress: FigureProgress | None = None) -> str:
    """The whole report as one HTML file: everything inline, nothing fetched."""
    require_plots()
    specs = parts.figures()
    return _page(parts.document(specs), draw(specs, progress=progress))


def compare_html(comp: Comparison, reps: Sequence[SessionReport] = (), progress: FigureProgress | None = None) -> str:
    require_plots()
    specs = comparison_figures(comp, reps)
    return _page(comparison_document(comp, [s.name for s in specs]), draw(specs, progress=progress))


# ---- the app's "open report" -----------------------------------------------------------------------------------
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
