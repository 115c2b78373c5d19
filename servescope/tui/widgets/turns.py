"""TTFT by turn index for conversation and agent cells: a bar per turn (its TTFT p50, bars from 0 so their
lengths compare), with the requests it counts and the share of prompt tokens the server's prefix cache served;
p90 and mean input tokens when the pane is wide enough. The Run screen fills it from the running cell's
requests (`live_turn_rows`), a saved session from its per-turn summary (`summary_turn_rows`): both compute
the same figures (core.metrics per_turn: linear-interpolated p50/p90 of the successful requests' TTFT, cached /
prompt tokens of the requests whose usage said)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.reactive import reactive

from servescope.tui.widgets.histogram import percentile
from servescope.tui.widgets.zoom import Zoomable


@dataclass(frozen=True)
class TurnRow:
    turn: int
    ok: int  # successful requests of this turn index (those the percentiles are over)
    p50: float | None
    p90: float | None = None
    input_tokens: float | None = None  # mean prompt tokens
    cached: float | None = None  # 0..1: cached / prompt tokens; None when the server's usage did not say
    failed: int = 0


def live_turn_rows(turns: Sequence[int], ttft_ms: Sequence[float], cached: Sequence[Any]) -> tuple[TurnRow, ...]:
    """Per turn index (turns from 1; 0, a single-turn request, is left out) from parallel per-request lists:
    the turn, the TTFT (ms) and [cached prompt tokens or None, prompt tokens or None]."""
    by: dict[int, list[int]] = {}
    for i, t in enumerate(turns):
        if t and t > 0 and i < len(ttft_ms):
            by.setdefault(int(t), []).append(i)
    rows = []
    for t in sorted(by):
        idx = by[t]
        vals = sorted(float(ttft_ms[i]) for i in idx)
        hit = prompt = 0
        known = False
        prompts: list[int] = []
        for i in idx:
            c = cached[i] if i < len(cached) else None
            ct, pt = (c[0], c[1]) if isinstance(c, (list, tuple)) and len(c) == 2 else (None, None)
            if isinstance(pt, int) and pt >= 0:
                prompts.append(pt)
                if isinstance(ct, int):
                    known, hit, prompt = True, hit + ct, prompt + pt
        rows.append(TurnRow(t, len(vals), percentile(vals, 50), percentile(vals, 90),
                            sum(prompts) / len(prompts) if prompts else None,
                            (hit / prompt if prompt else None) if known else None))
    return tuple(rows)


def summary_turn_rows(turns: Sequence[Any]) -> tuple[TurnRow, ...]:
    """From a cell summary's `turns` (core.results.TurnStat)."""
    return tuple(TurnRow(int(t.turn), int(t.requests_ok), t.ttft_ms_p50, t.ttft_ms_p90, t.input_tokens_mean,
                         t.prefix_cache_hit_rate, int(t.requests_failed)) for t in turns)


def _ms(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    if v >= 10_000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


MAX_BAR = 48  # the longest bar (columns)


class TurnChart(Zoomable):
    """TTFT p50 by turn as bars, with n, cached share, and (wide) p90 and mean input tokens. Set `rows`."""

    DEFAULT_CSS = """
    TurnChart { height: 1fr; padding: 0 1; }
    TurnChart .turns--bar { color: $accent; }
    """
    COMPONENT_CLASSES = {"turns--bar"}
    can_focus = True  # so it can be zoomed (z)

    rows: reactive[tuple[TurnRow, ...]] = reactive(tuple, layout=False)
    note: reactive[str] = reactive("")  # dim, after the title: why the chart is here

    def __init__(self, title: str = "TTFT p50 by turn", *, saved: bool = False, name: str | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.title = title
        self.saved = saved  # a saved cell's summary: `ok N` and the failed count (live: `n=N`, the TTFTs counted)

    def lines(self, width: int, height: int) -> list[Text]:
        head = Text(self.title, style="bold")
        if self.note:
            head.append(f" {self.note}", style="dim")
        head.truncate(width, overflow="ellipsis")
        rows = self.rows
        if not rows:
            head = Text(self.title, style="bold")
            head.append("  waiting for requests of a later turn…" if not self.note else f" {self.note}", style="dim")
            head.truncate(width, overflow="ellipsis")
            return [head]
        label_w = max(len(str(r.turn)) for r in rows)
        word = "turn " if width >= 44 else "t"
        # fields by priority; each right-aligned to its widest value so the columns line up
        fields: list[tuple[str, list[str]]] = [
            ("p50", [f"{_ms(r.p50)} ms" for r in rows]),
            ("n", [(f"ok {r.ok}" + (f" ✗{r.failed}" if r.failed else "")) if self.saved else f"n={r.ok}"
                   for r in rows]),
            ("cached", [(f"{r.cached * 100:.0f}%" if r.cached is not None else "-") + " cached" for r in rows]),
            ("p90", [f"p90 {_ms(r.p90)}" for r in rows]),
            ("in", [f"in {r.input_tokens:,.0f} tok" if r.input_tokens is not None else "in -" for r in rows]),
        ]
        fixed = len(word) + label_w + 1
        min_bar = 3
        chosen: list[tuple[str, list[str]]] = []
        used = fixed + 1  # the space after the bar
        for key, vals in fields:
            w = max(len(v) for v in vals) + 1
            if used + w + min_bar <= width or key == "p50":
                chosen.append((key, vals))
                used += w
        widths = [max(len(v) for v in vals) for _, vals in chosen]
        bar_w = max(1, min(MAX_BAR, width - used))  # wide panes: the figures stay next to their bars
        top = max((r.p50 for r in rows if r.p50 is not None and not math.isnan(r.p50)), default=0.0)
        bar_style = self.get_component_rich_style("turns--bar")
        out = [head]
        room = max(1, height - 1)
        shown = rows if len(rows) <= room else rows[: room - 1]
        for i, r in enumerate(shown):
            line = Text(f"{word}{r.turn:>{label_w}} ")
            frac = (r.p50 / top) if top > 0 and r.p50 is not None and not math.isnan(r.p50) else 0.0
            eighths = int(round(frac * bar_w * 8))
            bar = "█" * (eighths // 8) + (" ▏▎▍▌▋▊▉"[eighths % 8] if eighths % 8 else "")
            line.append(bar.ljust(bar_w), style=bar_style)
            line.append(" ")
            for (_, vals), w in zip(chosen, widths, strict=True):
                line.append(" " + vals[i].rjust(w))
            line.truncate(width, overflow="ellipsis")
            out.append(line)
        if len(shown) < len(rows):
            rest = rows[len(shown):]
            which = f"turn {rest[0].turn}" if len(rest) == 1 else f"turns {rest[0].turn}-{rest[-1].turn}"
            out.append(Text(f"… {which}: z zooms", style="dim"))
        return out

    def render(self) -> Text:
        width = max(10, self.content_size.width)
        height = max(2, self.content_size.height)
        return Text("\n").join(self.lines(width, height))
