"""What a figure really draws, asked of matplotlib: every text and every data marker with its extent (window
extents after a draw with the Agg renderer), and the overlaps a reader would see: a text drawn over another
text, and a text or a legend drawn over a data point.

The record is taken at the renderer: each text as it is drawn (its `get_window_extent` then), each marker as
the renderer stamps it (the marker's own extent placed at each vertex, inside the clip the renderer was given),
so nothing the figure code claims about itself is taken on trust. Data markers are those of the lines a panel
holds (its plotted series, rings and intervals), not tick marks or a legend's samples. A legend's own texts lie
inside its box by design: they are checked against everything else, not against their own legend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Box = tuple[float, float, float, float]
TOL = 0.5  # pixels two extents must share in both directions to count as overlapping


@dataclass
class Drawn:
    kind: str  # text | marker | legend
    what: str  # the text, or what the marker belongs to
    box: Box
    legend: int | None = None  # the legend it is part of


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] - TOL and b[0] < a[2] - TOL and a[1] < b[3] - TOL and b[1] < a[3] - TOL


@contextmanager
def _patched(cls: Any, name: str, wrapper: Any) -> Iterator[None]:
    orig = cls.__dict__[name]
    setattr(cls, name, wrapper(orig))
    try:
        yield
    finally:
        setattr(cls, name, orig)


def extents(fig: Any) -> list[Drawn]:
    """Draw `fig` on its Agg canvas and return every text, data marker and legend it drew, with its extent."""
    from matplotlib.legend import Legend
    from matplotlib.lines import Line2D
    from matplotlib.text import Text

    r = fig.canvas.get_renderer()
    r.clear()
    legends = list(fig.findobj(Legend))
    owner = {id(a): k for k, leg in enumerate(legends) for a in leg.findobj()}
    data = {id(line) for ax in fig.axes for line in ax.lines}  # not ticks, not legend samples
    out: list[Drawn] = []
    lines: list[Any] = []
    texts: list[Any] = []
    seen: set[int] = set()

    def line_draw(orig: Any) -> Any:
        def draw(self: Any, renderer: Any) -> Any:
            lines.append(self)
            try:
                return orig(self, renderer)
            finally:
                lines.pop()
        return draw

    def text_draw(orig: Any) -> Any:
        def draw(self: Any, renderer: Any) -> Any:
            texts.append(self)
            try:
                return orig(self, renderer)
            finally:
                texts.pop()
        return draw

    draw_markers, draw_text = r.draw_markers, r.draw_text

    def markers(gc: Any, marker_path: Any, marker_trans: Any, path: Any, trans: Any, rgbFace: Any = None) -> Any:
        line = lines[-1] if lines else None
        if line is not None and id(line) in data:
            ext = marker_path.get_extents(marker_trans)
            clip = gc.get_clip_rectangle()
            for x, y in trans.transform(path.vertices):
                if not (abs(x) < 1e9 and abs(y) < 1e9):
                    continue
                if clip is not None and not (clip.x0 - 0.5 <= x <= clip.x1 + 0.5 and clip.y0 - 0.5 <= y <= clip.y1 + 0.5):
                    continue
                out.append(Drawn("marker", str(line.get_gid() or line.get_label()),
                                 (x + ext.x0, y + ext.y0, x + ext.x1, y + ext.y1)))
        return draw_markers(gc, marker_path, marker_trans, path, trans, rgbFace)

    def text(gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False,
             mtext: Any = None) -> Any:
        t = texts[-1] if texts else mtext
        if t is not None and id(t) not in seen and s.strip():
            seen.add(id(t))
            bb = t.get_window_extent(r)
            out.append(Drawn("text", t.get_text(), (bb.x0, bb.y0, bb.x1, bb.y1), owner.get(id(t))))
        return draw_text(gc, x, y, s, prop, angle, ismath, mtext)

    r.draw_markers, r.draw_text = markers, text
    try:
        with _patched(Line2D, "draw", line_draw), _patched(Text, "draw", text_draw):
            fig.draw(r)
    finally:
        r.draw_markers, r.draw_text = draw_markers, draw_text
    for k, leg in enumerate(legends):
        if leg.get_visible():
            bb = leg.get_window_extent(r)
            out.append(Drawn("legend", f"legend {k}", (bb.x0, bb.y0, bb.x1, bb.y1), k))
    return out


def overlaps(fig: Any) -> list[str]:
    """Each text drawn over another text, and each text or legend drawn over a data marker, in words."""
    items = extents(fig)
    texts = [d for d in items if d.kind == "text"]
    marks = [d for d in items if d.kind == "marker"]
    legends = [d for d in items if d.kind == "legend"]
    found = []
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if _overlap(a.box, b.box):
                found.append(f"text {a.what!r} over text {b.what!r}")
        for m in marks:
            if _overlap(a.box, m.box):
                found.append(f"text {a.what!r} over a marker of {m.what}")
    for leg in legends:
        for m in marks:
            if _overlap(leg.box, m.box):
                found.append(f"{leg.what} over a marker of {m.what}")
        for t in texts:
            if t.legend != leg.legend and _overlap(leg.box, t.box):
                found.append(f"{leg.what} over text {t.what!r}")
    return found
