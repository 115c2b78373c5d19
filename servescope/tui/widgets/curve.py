"""Charts drawn with plain characters (no plotting library): the throughput curve of a sweep, the
overlaid curves of the Compare screen and the what-if curve (measured solid, predicted dashed over its
band). Every chart has a title line, a legend line above the plot (never drawn over the data) that names
each series and its unit, y ticks at even, round steps from 0 (never negative), and x ticks that carry the
load's unit (`c=4`, `2/s`; `users` / `req/s` at the axis' end when there is room). Without colour (NO_COLOR, a
monochrome terminal) every mark is told apart by its glyph alone: each series' line has its own character,
shown beside its marker in the legend, the SLO capacity line is ┃ beside the knee's ┊, and no mark is left in
the grey the Monochrome filter would make of its colour."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Span, Text
from textual.reactive import reactive

from servescope.tui.widgets.zoom import Zoomable


@dataclass(frozen=True)
class CurvePoint:
    x: float  # concurrency or rate
    label: str  # "c=4", "2/s"
    aggregate_tok_s: float
    per_user_tok_s: float
    meets_slo: bool | None = None  # None: no SLOs set
    live: bool = False  # the running cell, still filling in


def find_knee(points: Sequence[CurvePoint]) -> CurvePoint | None:
    """The last load level before extra aggregate throughput starts costing more per-user speed (relative
    change) than it gains: the first step where per-user loss > aggregate gain; its left end is the knee."""
    pts = sorted((p for p in points if not p.live), key=lambda p: p.x)
    for a, b in zip(pts, pts[1:], strict=False):
        if a.aggregate_tok_s <= 0 or a.per_user_tok_s <= 0:
            continue
        gain = (b.aggregate_tok_s - a.aggregate_tok_s) / a.aggregate_tok_s
        loss = (a.per_user_tok_s - b.per_user_tok_s) / a.per_user_tok_s
        if loss > gain:
            return a
    return None


def slo_capacity(points: Sequence[CurvePoint]) -> CurvePoint | None:
    """The highest load whose cell still meets the SLOs (None without SLOs or when none meets them)."""
    ok = [p for p in points if not p.live and p.meets_slo]
    return max(ok, key=lambda p: p.x) if ok else None


# ---- the character chart --------------------------------------------------------------------------------
NICE_STEPS = (1.0, 2.0, 2.5, 5.0)


def nice_step(top: float, intervals: int) -> float:
    """The smallest round step (1, 2, 2.5 or 5 x 10^k) with `intervals` steps reaching `top`."""
    if top <= 0 or intervals <= 0:
        return 1.0
    raw = top / intervals
    mag = 10.0 ** math.floor(math.log10(raw))
    for s in NICE_STEPS:
        if s * mag >= raw * (1 - 1e-9):
            return s * mag
    return 10 * mag


def nice_ticks(ymax: float, max_ticks: int) -> list[float]:
    """Ticks 0, s, 2s, ... up to the first multiple of a round step s at or above `ymax` (never negative;
    at most `max_ticks`, at least two)."""
    ymax = max(0.0, ymax)
    if ymax == 0:
        return [0.0, 1.0]
    best: list[float] | None = None
    for n in range(1, max(1, max_ticks - 1) + 1):
        step = nice_step(ymax, n)
        k = math.ceil(ymax / step - 1e-9)
        ticks = [i * step for i in range(k + 1)]
        if len(ticks) <= max_ticks and (best is None or ticks[-1] < best[-1] or
                                        (ticks[-1] == best[-1] and len(ticks) > len(best))):
            best = ticks
    return best or [0.0, ymax]


def even_ticks(ymax: float, rows: int, max_ticks: int) -> list[float]:
    """Round ticks from 0 whose rows are evenly spaced on a plot `rows` tall: the number of intervals
    divides rows - 1; a top close to the data with as many ticks as fit. With `max_ticks` ticks at most."""
    ymax = max(0.0, ymax) or 1.0
    ks = [k for k in range(1, min(6, max(1, rows - 1)) + 1) if (rows - 1) % k == 0 and (k < max_ticks or k == rows - 1)]
    if ks == [1] and rows >= 5:  # rows - 1 is prime: rows a tick apart differ by one at most
        ks = list(range(2, max(2, min(6, max_ticks - 1)) + 1))
    options = []
    for k in ks:
        step = nice_step(ymax, k)
        options.append([i * step for i in range(k + 1)])
    if not options:
        return nice_ticks(ymax, max_ticks)
    tightest = min(t[-1] for t in options)
    # among tops within 25% of the tightest, the most ticks (0, 200, 400, 600 rather than 0, 500)
    return max((t for t in options if t[-1] <= tightest * 1.25 + 1e-9), key=lambda t: (len(t), -t[-1]))


def fmt_tick(v: float, step: float) -> str:
    """A tick label with as many decimals as the step needs (2.5 -> "2.5", 1000 -> "1,000", 20k -> "20k")."""
    if v >= 10_000 and step >= 1000 and abs(v / 1000 - round(v / 1000)) < 1e-9:
        return f"{round(v / 1000):,}k"
    nd = 0
    while nd < 6 and abs(step * 10**nd - round(step * 10**nd)) > 1e-6 * max(1.0, step * 10**nd):
        nd += 1
    return f"{v:,.{nd}f}"


def ellipsize(text: str, width: int) -> str:
    """`text` cut to `width` characters, ending in `…` when cut."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


DOT, DASH, SHADE = "·", "╌", "░"  # a measured series' line, a dashed (predicted) one, a band
KNEE, CAPACITY = "┊", "┃"  # the knee's and the SLO capacity's vertical lines (capacity: ┊ too, in colour)
UNDER = (" ", KNEE, CAPACITY, SHADE)  # what a line may be drawn over


@dataclass(frozen=True)
class Series:
    label: str  # the legend's text
    points: tuple[tuple[int, float], ...]  # (x category index, y)
    marker: str
    style: str = ""
    right: bool = False  # on the right y axis
    line: bool = True  # join the points with dots
    legend: bool = True
    short: str = ""  # the legend's text when the full one does not fit
    tiny: str = ""  # shorter still, where the short ones do not fit on the chart's lines (`tok/s` for `tok/s (l)`)
    dashed: bool = False  # joined with a lighter dashed line (╌): a predicted curve beside a measured one
    band: tuple[tuple[int, float, float], ...] = ()  # (x category index, lo, hi): shaded ░ between lo and hi
    band_label: str = "band"  # the band's legend text (its own item, ░ and this)
    key: str = ""  # what the legend shows before the label (default: the marker, and ╌ when dashed)
    dot: str = DOT  # the glyph of its joining line (dashed series: ╌); series told apart without colour differ

    @property
    def legend_key(self) -> str:
        return self.key or self.marker + (DASH if self.dashed else "")

    def mono_key(self) -> str:
        """The legend's key without colour: the marker and the line's glyph, which tell the series apart."""
        if self.key or not self.line:
            return self.legend_key
        return self.marker + (DASH if self.dashed else self.dot)


@dataclass(frozen=True)
class ChartSpec:
    title: str
    x_labels: tuple[str, ...]  # one per category, left to right
    x_name: str  # what the x ticks count, e.g. "users", "req/s"
    series: tuple[Series, ...]
    notes: tuple[tuple[str, str], ...] = ()  # (text, style) after the legend: knee, SLO capacity
    vlines: tuple[tuple[int, str, str], ...] = ()  # (x category index, style, glyph: ┊), where no data is
    empty: str = "waiting for the first finished cell…"
    title_short: str = ""  # the title where the whole one does not fit (it leaves out a hint, never the metric)


MARKERS = set("■□◆◇●○▼▽×x+∔")
TEXT_STYLES = {"bold", "dim", "italic", "underline", "reverse", "strike"}


def mono_style(style: str | Style) -> str | Style:
    """A style without its colours (bold and dim stay): what a chart draws under NO_COLOR, where the Monochrome
    filter would turn each colour into a grey of its own brightness (a dark magenta: near the background)."""
    if isinstance(style, str):
        return " ".join(w for w in style.split() if w in TEXT_STYLES)
    return style.without_color


def draw_chart(spec: ChartSpec, width: int, height: int, mono: bool = False) -> Text:
    """The chart as text, `width` x `height`: title, legend (one or two lines, outside the plot), the plot
    with the left (and right) y ticks, the x axis and its tick labels with the x unit. `mono` (NO_COLOR, a
    terminal without colour): no colours, and the legend shows each series' line glyph beside its marker, so
    that the series are told apart by their characters alone."""
    out = _draw_chart(spec, width, height, mono)
    if mono:
        out.style = mono_style(out.style)
        out.spans = [Span(sp.start, sp.end, mono_style(sp.style)) for sp in out.spans]
    return out


def _draw_chart(spec: ChartSpec, width: int, height: int, mono: bool) -> Text:
    width = max(20, width)
    out = Text()
    title = spec.title if len(spec.title) <= width or not spec.title_short else spec.title_short
    out.append(ellipsize(title, width), style="bold")
    # legend items: marker + label, then the notes; wrapped onto two lines (a short chart: one, the series' short
    # labels if that makes them fit), and one line more rather than leave an item out
    max_lines = 2 if height >= 10 else 1  # a short chart keeps its rows for the data

    def legend_items(form: int) -> list[list[tuple[str, str]]]:
        """The legend's items with each series' label (0), short label (1) or tiny one (2)."""
        items = []
        for s in spec.series:
            if s.legend:
                key = s.mono_key() if mono else s.legend_key
                text = [s.label, s.short or s.label, s.tiny or s.short or s.label][form]
                items.append([(key, s.style), (" " + text, "")])
            if s.band and s.band_label:
                items.append([(SHADE, band_style(s)), (" " + s.band_label, "")])
        return items + [[(text, style)] for text, style in spec.notes]

    def pack(items: list[list[tuple[str, str]]], limit: int) -> tuple[list[list[tuple[str, str]]], bool, bool]:
        """The items on lines of `width`, each on the first line with room for it (in order), at most `limit`
        lines; whether an item was left out, and whether the series' items are all on the first line."""
        lines: list[list[tuple[str, str]]] = [[]]
        used = [0]
        dropped = False
        first = True
        n_series = sum(1 for s in spec.series if s.legend) + sum(1 for s in spec.series if s.band and s.band_label)
        for i, it in enumerate(items):
            n = sum(len(t) for t, _ in it)
            k = next((k for k in range(len(lines)) if not used[k] or used[k] + 2 + n <= width), None)
            if k is None and len(lines) < limit:
                lines.append([])
                used.append(0)
                k = len(lines) - 1
            if k is None:
                dropped = True
                continue
            if i < n_series and k:
                first = False
            if used[k]:
                lines[k].append(("  ", ""))
                used[k] += 2
            lines[k].extend(it)
            used[k] += n
        return lines, dropped, first

    # the longest labels whose legend takes no more than the chart's share of lines with the series side by side
    # on the first; else the fewest lines, one more than the chart's share rather than leave an item out, so that
    # a mark drawn on the plot (┊ knee, ┃ SLO capacity, a hollow point) is always explained
    forms = [pack(legend_items(f), max_lines + 1) for f in range(3)]
    lines, dropped, _ = next((p for p in forms if not p[1] and p[2] and len(p[0]) <= max_lines),
                             min(forms, key=lambda p: (p[1], len(p[0]))))
    for k, ln in enumerate(lines):
        t = Text()
        for txt, style in ln:
            t.append(txt, style=style)
        if dropped and k == len(lines) - 1:
            t.append(" …" if t.cell_len <= width - 2 else "")
        t.truncate(width, overflow="ellipsis")
        out.append("\n")
        out.append_text(t)
    n_x = len(spec.x_labels)
    pts = [p for s in spec.series for p in s.points]
    ph = max(2, height - len(lines) - 2)  # plot rows
    if not n_x or not pts:
        out.append("\n" + ellipsize(spec.empty, width), style="dim")
        return out
    # a band's top is data too: the axis reaches it
    left = [p for s in spec.series if not s.right for p in (*s.points, *((i, hi) for i, _, hi in s.band))]
    right = [p for s in spec.series if s.right for p in (*s.points, *((i, hi) for i, _, hi in s.band))]
    max_ticks = ph if ph <= 4 else max(2, (ph - 1) // 2 + 1)
    lt, rt = even_ticks(max((y for _, y in left), default=0.0), ph, max_ticks), []
    if right:
        k = len(lt) - 1  # the same rows as the left ticks
        rstep = nice_step(max(y for _, y in right) or 1.0, k)
        rt = [i * rstep for i in range(k + 1)]
    lstep = lt[1] - lt[0]
    llab = [fmt_tick(v, lstep) for v in lt]
    rlab = [fmt_tick(v, rt[1] - rt[0]) for v in rt] if rt else []
    lw = max(len(s) for s in llab)
    rw = max(len(s) for s in rlab) if rlab else 0
    pw = max(n_x * 2, width - lw - 1 - (rw + 1 if rt else 0))

    def xcol(i: int) -> int:
        return min(pw - 1, int((i + 0.5) * pw / n_x))

    def yrow(y: float, top: float) -> int:
        return max(0, min(ph - 1, round((1 - max(0.0, y) / top) * (ph - 1))))

    grid: list[list[tuple[str, str]]] = [[(" ", "")] * pw for _ in range(ph)]
    for i, style, glyph in spec.vlines:
        if 0 <= i < n_x:
            c = xcol(i)
            for r in range(ph):
                grid[r][c] = (glyph, style)
    for s in spec.series:  # bands first, under every line and point
        if not s.band:
            continue
        top = (rt[-1] if s.right else lt[-1]) or 1.0
        ends = sorted((xcol(i), yrow(hi, top), yrow(lo, top)) for i, lo, hi in s.band)
        spans = [(c, r_hi, r_lo) for c, r_hi, r_lo in ends[:1]]  # one point: its own column
        for (c0, h0, l0), (c1, h1, l1) in zip(ends, ends[1:], strict=False):
            for c in range(c0 + 1, c1 + 1):  # between points: the band's edges joined straight
                f = (c - c0) / (c1 - c0)
                spans.append((c, round(h0 + (h1 - h0) * f), round(l0 + (l1 - l0) * f)))
        for c, r_hi, r_lo in spans:
            for r in range(r_hi, r_lo + 1):
                if grid[r][c][0] == " ":
                    grid[r][c] = (SHADE, band_style(s))
    for s in spec.series:
        top = (rt[-1] if s.right else lt[-1]) or 1.0
        cells = sorted((xcol(i), yrow(y, top)) for i, y in s.points)
        if s.line:
            for (c0, r0), (c1, r1) in zip(cells, cells[1:], strict=False):
                for c in range(c0 + 1, c1):
                    r = round(r0 + (r1 - r0) * (c - c0) / (c1 - c0))
                    if grid[r][c][0] in UNDER:
                        grid[r][c] = (DASH, f"{s.style} dim".strip()) if s.dashed else (s.dot, s.style)
        for c, r in cells:
            if grid[r][c][0] in MARKERS and grid[r][c][0] != s.marker and c + 1 < pw:
                c += 1  # another series' point is here: stand beside it, not on it
            grid[r][c] = (s.marker, s.style)
    lrows = {yrow(v, lt[-1]): lab for v, lab in zip(lt, llab, strict=True)}
    rrows = {yrow(v, rt[-1]): lab for v, lab in zip(rt, rlab, strict=True)} if rt else {}
    for r in range(ph):
        out.append("\n")
        lab = lrows.get(r)
        out.append(f"{lab or '':>{lw}}" + ("┤" if lab else "│"), style="dim")
        for ch, style in grid[r]:
            out.append(ch, style=style)
        if rt:
            rl = rrows.get(r)
            out.append(("├" if rl else "│") + f"{rl or '':<{rw}}", style="dim")
    # the x axis, its tick labels written into it under their points, the x unit at its right end
    axis = ["─"] * pw
    taken: list[tuple[int, int]] = []
    name = spec.x_name
    name_at = pw - len(name) - 1
    order = [0, n_x - 1, *range(1, n_x - 1)] if n_x > 1 else [0]  # first and last first
    for i in order:
        lab = spec.x_labels[i]
        st = max(0, min(pw - len(lab), xcol(i) - len(lab) // 2))
        en = st + len(lab)
        if any(not (en < a - 1 or st > b + 1) for a, b in taken):
            continue  # would touch a neighbour: left out (the first and last are always there)
        taken.append((st, en))
        axis[st:en] = list(lab)
    if name and name_at > 0 and all(en + 1 < name_at for _, en in taken):
        axis[name_at:name_at + len(name)] = list(name)
    out.append("\n" + " " * lw + "└", style="dim")
    out.append("".join(axis))
    out.append("┘" if rt else "", style="dim")
    return out


def band_style(s: Series) -> str:
    return f"{s.style} dim".strip()


class Chart(Zoomable):
    """A focusable character chart (focus it and press `z` to zoom it); subclasses say what to draw."""

    can_focus = True
    DEFAULT_CSS = """
    Chart { height: 1fr; min-height: 7; padding: 0 1; }
    """

    def spec(self) -> ChartSpec:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def mono(self) -> bool:
        """No colour to tell marks apart (NO_COLOR, or a terminal without colour): glyphs do it alone."""
        app = self.app
        return bool(getattr(app, "no_color", False)) or app.console.color_system is None

    def render(self) -> Text:
        return draw_chart(self.spec(), self.content_size.width, self.content_size.height, self.mono)


AGGREGATE = ("■", "□", "cyan")  # finished, running, colour
PER_USER = ("◆", "◇", "magenta")
PER_USER_DOT = "-"  # the per-user line's glyph without colour (the aggregate's: ·)


def x_unit(labels: Sequence[str]) -> str:
    return "req/s" if labels and all(lab.endswith("/s") for lab in labels) else "users"


class ThroughputCurve(Chart):
    """Set `points` (finished cells plus, optionally, one live point) and `title`; it redraws itself.
    Aggregate output tok/s on the left axis (■), per-user tok/s on the right (◆), the running cell hollow
    (□ ◇); the knee and the SLO capacity named in the legend and drawn as ┊ lines."""

    points: reactive[tuple[CurvePoint, ...]] = reactive(tuple)
    title: reactive[str] = reactive("throughput vs load")
    empty: reactive[str] = reactive(ChartSpec.empty)  # what it says without a point (a saved session: why)

    def spec(self) -> ChartSpec:
        pts = sorted(self.points, key=lambda p: (p.x, p.live))
        xs = sorted({p.x for p in pts})
        pos = {x: i for i, x in enumerate(xs)}
        labels = {p.x: p.label for p in pts}
        knee, cap = find_knee(pts), slo_capacity(pts)
        notes: list[tuple[str, str]] = []
        vlines: list[tuple[int, str, str]] = []
        mono = self.is_attached and self.mono
        cap_glyph = CAPACITY if mono else KNEE  # in colour, yellow and green tell them apart
        if knee:
            notes.append((f"{KNEE} knee {knee.label}", "yellow"))
            vlines.append((pos[knee.x], "yellow", KNEE))
        if cap:
            notes.append((f"{cap_glyph} SLO capacity {cap.label}", "green"))
            if not knee or cap.x != knee.x:
                vlines.append((pos[cap.x], "green", cap_glyph))
        elif any(p.meets_slo is not None for p in pts):
            notes.append(("no cell meets the SLOs", "red"))
        done = [p for p in pts if not p.live]
        live = [p for p in pts if p.live]
        series = (
            Series("tok/s (left)", tuple((pos[p.x], p.aggregate_tok_s) for p in done), AGGREGATE[0], AGGREGATE[2],
                   short="tok/s (l)", tiny="tok/s"),
            Series("mean tok/s/user (right)", tuple((pos[p.x], p.per_user_tok_s) for p in done), PER_USER[0],
                   PER_USER[2], right=True, short="mean/user (r)", dot=PER_USER_DOT if mono else DOT),
            Series("running", tuple((pos[p.x], p.aggregate_tok_s) for p in live), AGGREGATE[1], AGGREGATE[2],
                   line=False, legend=False),
            Series("running", tuple((pos[p.x], p.per_user_tok_s) for p in live), PER_USER[1], PER_USER[2],
                   right=True, line=False, legend=False),
        )
        if live:
            notes.append(("□◇ running", "dim"))
        x_labels = tuple(labels[x] for x in xs)
        return ChartSpec(self.title, x_labels, x_unit(x_labels), series, tuple(notes), tuple(vlines), self.empty)


SERIES_COLORS = ("cyan", "magenta", "yellow", "green", "red", "blue")
SERIES_MARKERS = ("■", "◆", "●", "▼", "×", "+")  # distinct without colour (NO_COLOR)
SERIES_DOTS = ("·", "-", "~", ":", "'", "=")  # their lines' glyphs without colour
HOLLOW = {"■": "□", "◆": "◇", "●": "○", "▼": "▽", "×": "x", "+": "∔"}  # a client-bound point of that series
CLIENT_BOUND = "client-bound, not a server figure"

# a session's point: (load, value), or (load, value, client_bound): True where the load generator, not the
# server, was the limit (core/health.py); drawn hollow, apart from the line, and named so in the legend
OverlayPoint = tuple[float, float] | tuple[float, float, bool]


class OverlayCurve(Chart):
    """One metric against load for several sessions, overlaid: set `series` (label -> [(x, y)] or
    [(x, y, client_bound)]) and `title` (which names the metric and its unit, e.g. "output tok/s vs load"); the
    legend names the sessions; the x axis is categorical (the load levels in order), `x_kind` its unit. A
    client-bound point is no measurement of the server: it is drawn hollow (□ for ■), not joined to the line,
    and the legend says so."""

    series: reactive[tuple[tuple[str, tuple[OverlayPoint, ...]], ...]] = reactive(tuple)
    title: reactive[str] = reactive("")
    title_short: reactive[str] = reactive("")  # where the title does not fit: the metric and the workload
    x_kind: reactive[str] = reactive("users")  # "users" (concurrency) or "req/s" (rate)

    def spec(self) -> ChartSpec:
        xs = sorted({p[0] for _, pts in self.series for p in pts})
        pos = {x: i for i, x in enumerate(xs)}
        mono = self.is_attached and self.mono
        out = []
        hollow = ""  # the hollow markers of the series with a client-bound point
        for i, (label, pts) in enumerate(self.series):
            marker, style = SERIES_MARKERS[i % len(SERIES_MARKERS)], SERIES_COLORS[i % len(SERIES_COLORS)]
            measured = tuple((pos[p[0]], p[1]) for p in sorted(pts) if not (len(p) > 2 and p[2]))
            bound = tuple((pos[p[0]], p[1]) for p in sorted(pts) if len(p) > 2 and p[2])
            out.append(Series(label, measured, marker, style, dot=SERIES_DOTS[i % len(SERIES_DOTS)] if mono else DOT))
            if bound:
                out.append(Series(CLIENT_BOUND, bound, HOLLOW[marker], style, line=False, legend=False))
                hollow += HOLLOW[marker]
        notes = ((self._bound_note(hollow, out), ""),) if hollow else ()
        rate = self.x_kind == "req/s"
        labels = tuple((f"{x:g}/s" if rate else f"c={x:g}") for x in xs)
        return ChartSpec(self.title, labels, self.x_kind, tuple(out), notes, empty="no finished cells of this workload",
                         title_short=self.title_short)

    def _bound_note(self, hollow: str, series: Sequence[Series]) -> str:
        """The legend's word for the hollow points: whole where it fits beside the sessions' names (one legend line
        on a short chart, two on a taller one), else `□ client-bound` (zoomed, it is whole)."""
        full = f"{hollow} {CLIENT_BOUND}"
        width, height = self.content_size.width, self.content_size.height
        if not width:
            return full
        keys = sum(len(s.legend_key) + 1 + len(s.label) + 2 for s in series if s.legend)
        room = max(20, width) - (keys if height < 10 else 0)
        return full if len(full) <= room else f"{hollow} client-bound"


@dataclass(frozen=True)
class PredictedPoint:
    """A predicted cell on the what-if curve: its figures, and the aggregate's band (lo, hi)."""

    x: float  # concurrency or rate
    label: str  # "c=32"
    aggregate_tok_s: float
    per_user_tok_s: float
    aggregate_lo: float | None = None
    aggregate_hi: float | None = None


PREDICTED = ("□", "◇")  # the predicted aggregate and per-user markers: hollow, on dashed lines


def prediction_spec(measured: Sequence[CurvePoint], predicted: Sequence[PredictedPoint], title: str,
                    empty: str = "nothing predicted yet", mono: bool = False) -> ChartSpec:
    """The what-if chart: measured points solid, predicted ones hollow on dashed lines over their band (`mono`:
    the measured per-user line drawn with its own glyph, as the throughput curve's)."""
    meas = sorted(measured, key=lambda p: p.x)
    pred = sorted(predicted, key=lambda p: p.x)
    labels = {p.x: p.label for p in meas} | {p.x: p.label for p in pred}
    xs = sorted(labels)
    pos = {x: i for i, x in enumerate(xs)}
    band = tuple((pos[p.x], lo, hi) for p in pred
                 if (lo := p.aggregate_lo) is not None and (hi := p.aggregate_hi) is not None)
    agg = tuple((pos[p.x], p.aggregate_tok_s) for p in pred)
    per_user = tuple((pos[p.x], p.per_user_tok_s) for p in pred)
    if meas:  # the measured series name the axes; one legend item says the hollow, dashed ones are predicted
        shown: tuple[Series, ...] = (
            Series("predicted (dashed)", agg, PREDICTED[0], AGGREGATE[2], dashed=True, band=band,
                   band_label="band (tok/s)", key=PREDICTED[0] + PREDICTED[1] + DASH, short="predicted",
                   legend=bool(pred)),
            Series("predicted mean tok/s/user", per_user, PREDICTED[1], PER_USER[2], right=True, dashed=True,
                   legend=False))
    else:  # nothing measured of this workload: the predicted series name the axes
        shown = (
            Series("predicted tok/s (left)", agg, PREDICTED[0], AGGREGATE[2], dashed=True, band=band,
                   band_label="band (tok/s)", short="tok/s (l)", tiny="tok/s", legend=bool(pred)),
            Series("predicted mean tok/s/user (right)", per_user, PREDICTED[1], PER_USER[2], right=True, dashed=True,
                   short="mean/user (r)", legend=bool(pred)))
    series = (
        Series("tok/s (left)", tuple((pos[p.x], p.aggregate_tok_s) for p in meas), AGGREGATE[0], AGGREGATE[2],
               short="tok/s (l)", tiny="tok/s", legend=bool(meas)),
        Series("mean tok/s/user (right)", tuple((pos[p.x], p.per_user_tok_s) for p in meas), PER_USER[0],
               PER_USER[2], right=True, short="mean/user (r)", legend=bool(meas), dot=PER_USER_DOT if mono else DOT),
        *shown,
    )
    notes: tuple[tuple[str, str], ...] = ()
    if pred and not meas:
        notes = (("(not measured in this session)", "dim"),)
    x_labels = tuple(labels[x] for x in xs)
    return ChartSpec(title, x_labels, x_unit(x_labels), series, notes, empty=empty)


class PredictionCurve(Chart):
    """The what-if curve: the measured cells solid (■ output tok/s on the left axis, ◆ per-user tok/s on the
    right, as `ThroughputCurve` draws them), the predicted cells hollow on dashed lines (□ ◇ ╌), the predicted
    output tok/s band shaded (░) under them. Set `measured`, `predicted` and `title`."""

    measured: reactive[tuple[CurvePoint, ...]] = reactive(tuple)
    predicted: reactive[tuple[PredictedPoint, ...]] = reactive(tuple)
    title: reactive[str] = reactive("output tok/s vs load: measured and predicted")
    empty: reactive[str] = reactive("nothing predicted yet")

    def spec(self) -> ChartSpec:
        return prediction_spec(self.measured, self.predicted, self.title, self.empty, self.is_attached and self.mono)
