"""A table that fits its width, the 80x24 rule of every table in the app: each column declares a priority,
and the columns that do not fit are left out by it, least important first, and counted in the pane
(`+2 columns: z zooms`; zoom the table with `z` to see more). A figure (a right-aligned column) is never cut: it
is shown whole or left out; a label column is cut down to its min_width first (its text ends in `…`). The figure
the pane exists for (`keep`) is never left out. Never a horizontal scrollbar. Sortable by column (`o` next column,
`O` reverse, or click a header). A figure column with a `short` form (Compare's deltas: `-4.5% [-9.0,+0.2]` for
`-4.5% [-9.0, +0.2] within noise`) is placed at its short form's width when the whole does not fit, and then shows
every value in that form."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widgets import DataTable

from servescope.core.textsafe import clean_text
from servescope.tui.widgets.zoom import Zoomable


@dataclass(frozen=True)
class Col:
    key: str
    label: str
    priority: int = 0  # lower is kept first when the width is short
    min_width: int = 0  # may be cut down to this (with …); 0: never cut, shown whole or not at all
    max_width: int = 40  # never wider than this (cut with …)
    right: bool = False  # right-aligned: a figure, never cut (shown whole or left out)
    keep: bool = False  # the figure the pane exists for: placed first, never left out
    # a cut label widens back to whole at this priority, before the columns after it are placed (a status: whole
    # when zoomed, `done…` in a narrow pane); None: only once every column that fits is placed (more columns, cut)
    grow_at: int | None = None
    # a shorter form of a value, shown when the whole value does not fit (`done, client BOUND` -> `bound`); the
    # table keeps the whole value (sorting, filtering, full_row) and shows it whenever it fits. A figure column
    # with a short form shows every value whole, or every value short (never cut).
    short: Callable[[str], str] | None = None

    def shown_value(self, value: str, width: int, compact: bool = False) -> str:
        """`value` as this column shows it at `width`: whole, else its short form (`compact`: the short form
        whatever its width), cut with `…` if need be."""
        if (compact or len(value) > width) and self.short is not None:
            value = self.short(value)
        return ellipsize(value, width)

    @property
    def figure(self) -> bool:
        return self.right


def ellipsize(text: str, width: int) -> str:
    """`text` cut to `width` characters, ending in `…` when cut (`done, client BOUND` at 6: `done…`, not
    `done,…`)."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return (text[: width - 1].rstrip(" ,;:/-") or text[: width - 1]) + "…"


def prioritized(cols: Sequence[Col], order: Sequence[str], keep: str | None = None,
                narrow: Mapping[str, int] | None = None, whole_after: Mapping[str, str] | None = None,
                short: Mapping[str, Callable[[str], str]] | None = None) -> list[Col]:
    """A pane's own priorities for columns declared elsewhere (same keys in the same order, so rows are built
    as before): the keys in `order` first, in that order, then the rest as they were declared; `keep` is the
    figure the pane exists for (never left out); `narrow` lets label columns be cut down to that width, to fit
    the room the columns before them leave; `whole_after` widens a cut label back to whole right after the column
    named (`{"workload": "TTFT p50"}`: that figure before a whole workload, a whole workload before the rest);
    `short` gives a label column the shorter form its values take when they do not fit whole (`Col.short`)."""
    rank = {k: i for i, k in enumerate(order)}
    declared = sorted(range(len(cols)), key=lambda i: cols[i].priority)
    after = {cols[i].key: len(order) + n for n, i in enumerate(declared)}
    prio = {c.key: rank.get(c.key, after[c.key]) for c in cols}
    narrow, whole_after, short = narrow or {}, whole_after or {}, short or {}
    grow = {**{k: prio[k] for k in narrow}, **{k: prio[v] for k, v in whole_after.items()}}
    return [replace(c, priority=prio[c.key], keep=c.key == keep, min_width=narrow.get(c.key, c.min_width),
                    grow_at=grow.get(c.key, c.grow_at), short=short.get(c.key, c.short)) for c in cols]


_NUM = re.compile(r"^[+-]?[\d,]*\.?\d+")


def sort_value(text: str) -> tuple[int, Any]:
    """Numbers (`1,193.2`, `c=16`, `12/60`, `+4.1%`) sort as numbers, the rest as text, `-` and empty last."""
    t = text.strip()
    if t in ("", "-", "?"):
        return (2, 0)
    core = t.split("=", 1)[1] if t.startswith(("c=",)) else t
    m = _NUM.match(core)
    if m:
        try:
            return (0, float(m.group(0).replace(",", "")))
        except ValueError:
            pass
    return (1, t.lower())


def fit_widths(cols: Sequence[Col], natural: Sequence[int], avail: int, pad: int = 2,
               least: Sequence[int] | None = None) -> dict[str, int]:
    """Which columns are shown and how wide: the kept figure first, then by priority, each at its minimum (a
    label column cut to its min_width, a figure whole: figures are never cut, but one with a short form starts at
    `least`, its short values' width), a column that does not fit left out; a label with `grow_at` widens back
    towards whole at that priority, the other cut labels once every column is placed, by priority, with the space
    left; a figure in its short form widens to whole only where the whole fits."""
    order = sorted(range(len(cols)), key=lambda i: (not cols[i].keep, cols[i].priority))
    # (kept first, priority, place before grow, column): placing each column, and the early widening of some labels
    steps = sorted([(not cols[i].keep, cols[i].priority, 0, i) for i in order]
                   + [(True, g, 1, i) for i in order if (g := cols[i].grow_at) is not None and not cols[i].figure])
    widths: dict[str, int] = {}
    used = 0

    def grow(i: int) -> None:
        nonlocal used
        c, nat = cols[i], natural[i]
        if c.key in widths and widths[c.key] < nat:
            extra = min(nat - widths[c.key], avail - used)
            if c.figure and extra < nat - widths[c.key]:
                return  # a figure in its short form: whole, or as it is
            widths[c.key] += extra
            used += extra

    for _, _, growing, i in steps:
        c, nat = cols[i], natural[i]
        if growing:
            grow(i)
            continue
        if c.figure:
            w = min(nat, least[i]) if least is not None and c.short is not None else nat
        else:
            w = min(nat, c.min_width) if c.min_width else nat
        if used + w + pad <= avail or (c.keep and not widths):
            widths[c.key] = w
            used += w + pad
    for i in order:
        grow(i)
    return widths


class FitTable(DataTable[Text], Zoomable):
    """Call `set_columns`, then `put_row(key, values)` / `remove_key` / `clear`; the table shows what fits."""

    BINDINGS = [Binding("o", "sort_next", "Sort"), Binding("O", "sort_reverse", "Reverse sort", show=False)]
    # a one-column scrollbar (as lazygit's): at 80x24 a short pane scrolls its rows, and the second column is
    # the room a status needs beside the figures
    DEFAULT_CSS = """
    FitTable { overflow-x: hidden; scrollbar-size-vertical: 1; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("cursor_type", "row")
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(*args, **kwargs)
        self.cols: list[Col] = []
        self.data: dict[str, list[str]] = {}  # row key -> one value per column (all columns)
        self.sort_key: str | None = None
        self.sort_reverse = False
        self.shown: list[Col] = []
        self.row_filter: str = ""
        self._layout_width = -1
        self.sortable = True

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("sort_next", "sort_reverse") and not self.sortable:
            return False
        return super().check_action(action, parameters)

    # ---- data ---------------------------------------------------------------------------------------
    def set_columns(self, cols: Sequence[Col]) -> None:
        self.cols = list(cols)
        self.relayout(force=True)

    def put_row(self, key: str, values: Sequence[Any]) -> None:
        self.data[key] = [clean_text(str(v)) for v in values]
        self.relayout(force=True)

    def set_rows(self, rows: dict[str, Sequence[Any]]) -> None:
        """Replace every row (the cursor stays on the same key when it is still there)."""
        cur = self.current_key
        self.data = {k: [clean_text(str(v)) for v in vals] for k, vals in rows.items()}
        self.relayout(force=True, keep=cur)

    def remove_key(self, key: str) -> None:
        self.data.pop(key, None)
        self.relayout(force=True)

    def clear(self, columns: bool = False) -> FitTable:
        self.data.clear()
        super().clear(columns=columns)
        if not columns:
            self.relayout(force=True)
        return self

    def set_filter(self, text: str) -> None:
        self.row_filter = text.strip().lower()
        self.relayout(force=True)

    def full_row(self, i: int) -> list[str]:
        """Every column's value of the i-th row shown (also the columns left out at this width)."""
        return self.data[self.ordered_keys()[i]]

    def value(self, key: str, col: str) -> str:
        return self.data[key][[c.key for c in self.cols].index(col)]

    def ordered_keys(self) -> list[str]:
        keys = [k for k, v in self.data.items() if not self.row_filter or self.row_filter in " ".join(v).lower()]
        if self.sort_key is not None:
            i = [c.key for c in self.cols].index(self.sort_key)
            keys.sort(key=lambda k: sort_value(self.data[k][i]), reverse=self.sort_reverse)
        return keys

    def _shown_key(self) -> str | None:
        """The key of the row under the cursor as drawn now (before the rows change)."""
        try:
            return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        except Exception:
            return None

    def action_scroll_home(self) -> None:
        """home: the first row (row tables), as in lazygit and k9s."""
        if self.cursor_type == "row":
            self.move_cursor(row=0)
        else:
            super().action_scroll_home()

    def action_scroll_end(self) -> None:
        """end: the last row (row tables)."""
        if self.cursor_type == "row":
            self.move_cursor(row=max(0, self.row_count - 1))
        else:
            super().action_scroll_end()

    @property
    def current_key(self) -> str | None:
        keys = self.ordered_keys()
        return keys[self.cursor_row] if 0 <= self.cursor_row < len(keys) else None

    # ---- layout -------------------------------------------------------------------------------------
    def _avail(self) -> int:
        w = self.size.width
        if w <= 0:
            return 0
        rows_h = self.size.height - (1 if self.show_header else 0)
        scroll = self.styles.scrollbar_size_vertical if len(self.ordered_keys()) > rows_h else 0
        return w - scroll

    def _short_width(self, c: Col, i: int, keys: Sequence[str]) -> int:
        """A figure column's width in its short form: its widest short value, its label not cut below 8
        (`Δ GPTQ-I…`); its whole width when it has no short form."""
        short = c.short
        whole = max([len(c.label), *(len(self.data[k][i]) for k in keys)])
        if short is None:
            return whole
        return min(whole, max([min(len(c.label), 8), *(len(short(self.data[k][i])) for k in keys)]))

    def relayout(self, force: bool = False, keep: str | None = None) -> None:
        avail = self._avail()
        if not self.cols or avail <= 0 or (not force and avail == self._layout_width):
            return
        self._layout_width = avail
        keys = self.ordered_keys()
        # a figure's natural width is its widest value whole (max_width caps labels only: figures are never cut)
        natural = [min(10_000 if c.figure else c.max_width, max([len(c.label), *(len(self.data[k][i]) for k in keys)]))
                   for i, c in enumerate(self.cols)]
        least = [self._short_width(c, i, keys) if c.figure else n for i, (c, n) in enumerate(zip(self.cols, natural,
                                                                                                  strict=True))]
        widths = fit_widths(self.cols, natural, avail, pad=2 * self.cell_padding, least=least)
        self.shown = [c for c in self.cols if c.key in widths]
        cur = keep if keep is not None else self._shown_key()
        scroll_y = self.scroll_y
        super().clear(columns=True)
        for c in self.shown:
            mark = (" ▼" if self.sort_reverse else " ▲") if c.key == self.sort_key else ""
            label = ellipsize(c.label, widths[c.key] - len(mark)) + mark if mark else ellipsize(c.label, widths[c.key])
            self.add_column(Text(label, justify="right" if c.right else "left"), key=c.key, width=widths[c.key])
        idx = [self.cols.index(c) for c in self.shown]
        compact = {c.key for i, c in zip(idx, self.shown, strict=True) if c.figure and widths[c.key] < natural[i]}
        for k in keys:
            vals = self.data[k]
            self.add_row(*(Text(c.shown_value(vals[i], widths[c.key], c.key in compact),
                                justify="right" if c.right else "left", end="")
                           for i, c in zip(idx, self.shown, strict=True)), key=k)
        hidden = len(self.cols) - len(self.shown)
        more = f"+{hidden} column{'s' if hidden != 1 else ''}"
        zoom = self.is_attached and not self.has_class("-maximized") and self.size.width < self.screen.size.width - 4
        names = ", ".join(c.label for c in self.cols if c.key not in widths)
        self.border_subtitle = (f"{more}: z zooms" if zoom else f"{more} left out"
                                + (f" ({names})" if len(names) < avail // 2 else "")) if hidden else ""
        if cur is not None and cur in keys:
            self.move_cursor(row=keys.index(cur), animate=False)
        self.scroll_y = scroll_y

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self.relayout)

    # ---- sorting ------------------------------------------------------------------------------------
    def sort_on(self, key: str | None, reverse: bool = False) -> None:
        self.sort_key, self.sort_reverse = key, reverse
        self.relayout(force=True)

    def action_sort_next(self) -> None:
        """Sort by the next column shown (after the last one: the original order)."""
        keys = [c.key for c in self.shown]
        if not keys:
            return
        nxt = keys[0] if self.sort_key not in keys else (
            keys[keys.index(self.sort_key) + 1] if keys.index(self.sort_key) + 1 < len(keys) else None)
        self.sort_on(nxt, self.sort_reverse if nxt else False)
        self.notify(f"sorted by {nxt}" if nxt else "original order", timeout=2, markup=False)

    def action_sort_reverse(self) -> None:
        if self.sort_key is None and self.shown:
            self.sort_key = self.shown[0].key
        self.sort_on(self.sort_key, not self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if not self.sortable:
            return
        key = str(event.column_key.value)
        self.sort_on(key, not self.sort_reverse if key == self.sort_key else False)
        event.stop()
