"""The Compare screen: two or more saved sessions side by side. The delta table (each metric's values per
session, the signed delta against the first with its interval and verdict, `+13.2% [+11.1, +15.3] better`, the winner
marked with ★ only when it is better than the runner-up beyond noise, knowing which direction is better),
then, when the sessions hold quality results, their quality rows in the same table (perplexity, each task's
accuracy with its delta in points and verdict, KL from the reference, accuracy under load: `quality_rows`),
the aggregate and per-user tok/s curves of every session overlaid, the capacity/knee answers, a label-key
selector (a tag such as `quant`), and Export, which writes the Markdown report. All numbers come from
`servescope.sessions.compare.compare_sessions`; this screen only lays them out. Sessions another tool measured
(`servescope import`) head the pane with each session's tool and the definitions that differ, naming the figures
left unjudged (`comparability_lines`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Label, Select, Static

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text, slug
from servescope.reports.compare_doc import headline
from servescope.reports.report import render_report
from servescope.sessions.answers import is_completed
from servescope.sessions.compare import cell_views, compare_sessions, delta_text, fmt_num
from servescope.sessions.store import load_session
from servescope.tui.safe import esc, plain
from servescope.tui.screens.export import ExportScreen
from servescope.tui.widgets.curve import OverlayCurve
from servescope.tui.widgets.panels import short_path
from servescope.tui.widgets.table import Col, FitTable

NAME_LABEL = "(session name)"


def COMPARE_COLS(labels: list[str]) -> list[Col]:  # noqa: N802 (a declaration, built per set of labels)
    """The delta table's columns: the pane exists for the values and their deltas with their intervals (figures:
    whole or left out; a delta in its short form where the whole does not fit, `-4.5% [-9.0,+0.2]`: the verdict is
    then the ★ beside a value), read by their metric and load (whole: `output tok/s (a…` reads as nothing); the
    workload is cut or left out before any of them (each group's first row names it, `w` picks the curves' one),
    the best session (★ marks it in the values) goes first."""
    return [Col("workload", "workload", 2, min_width=6, max_width=24), Col("load", "load", 0),
            Col("metric", "metric", 0, max_width=40),
            *[Col(f"v{i}", lb, 1, right=True, keep=i == 0) for i, lb in enumerate(labels)],
            *[Col(f"d{i}", f"Δ {lb}", 1, right=True, short=compact_delta) for i, lb in enumerate(labels[1:], 1)],
            Col("best", "best", 3, max_width=20)]


_DELTA = re.compile(r"^(?P<d>[+-]\d+\.\d)(?P<unit>%| pts)(?: \[(?P<lo>[+-]\d+\.\d), (?P<hi>[+-]\d+\.\d)\]"
                    r"| (?P<none>\((?:no spread|no interval)))?")


def _short_num(x: str) -> str:
    """A signed figure in fewer digits: one decimal under 10, whole from 10 up (`+11.1` -> `+11`)."""
    v = float(x)
    return f"{v:+.0f}" if abs(v) >= 10 else x


def compact_delta(text: str) -> str:
    """A delta as delta_text writes it, in fewer characters for a narrow table: one decimal under 10, whole from
    10 up, the interval without spaces, without the verdict (★ marks the better value beyond noise):
    `+13.2% [+11.1, +15.3] better` -> `+13% [+11,+15]`, `-0.4% [-2.3, +1.5] within noise` -> `-0.4% [-2.3,+1.5]`,
    `+42.3% (no spread: deterministic server) better` -> `+42% (no spread)`; anything else as it is."""
    m = _DELTA.match(text)
    if m is None or m.group(0) == text:
        return text
    d = _short_num(m.group("d")) + m.group("unit")
    if m.group("lo") is not None:
        return f"{d} [{_short_num(m.group('lo'))},{_short_num(m.group('hi'))}]"
    if m.group("none") is not None:
        return f"{d} {m.group('none')})"
    return d


WIN = " ★"


def tag_keys(sessions: list[Any]) -> list[str]:
    """Tag keys in the order they first appear; those every session has come first."""
    keys: list[str] = []
    tags = [s.info.tags for s in sessions]
    for t in tags:
        for k in t:
            if str(k) not in keys:
                keys.append(str(k))
    everywhere = [k for k in keys if all(k in t for t in tags)]
    return everywhere + [k for k in keys if k not in everywhere]


def default_label_key(sessions: list[Any]) -> str | None:
    """The first tag whose values tell every session apart (`quant` for FP8 vs GPTQ-Int4), else None."""
    tags = [s.info.tags for s in sessions]
    for k in tag_keys(sessions):
        vals = [str(t.get(k, "")) for t in tags]
        if all(vals) and len(set(vals)) == len(vals):
            return k
    return None


def delta_rows(comparison: Any) -> list[tuple[str, ...]]:
    """The rows of the delta table: workload, load, metric, one value per session (★ on a winner beyond
    noise), the delta of each later session vs the first with its interval and verdict, and the winner's
    label (or why there is none: within noise, tie, not comparable, -)."""
    labels = comparison.labels
    rows: list[tuple[str, ...]] = []
    for c in comparison.cells:
        for j, mspec in enumerate(comparison.metrics):
            wi = c.winners[mspec.key]
            vals = [fmt_num(v) + (WIN if i == wi else "") for i, v in enumerate(c.values[mspec.key])]
            deltas = [delta_text(c, mspec, i) for i in range(1, len(labels))]
            best = labels[wi] if wi is not None else c.no_winner.get(mspec.key, "-")
            rows.append((c.workload if j == 0 else "", c.load if j == 0 else "", mspec.label, *vals, *deltas, best))
    for w, ld, have in comparison.only_in:
        present = ["✓" if lb in have else "·" for lb in labels]
        rows.append((w, ld, "only in " + ", ".join(have), *present, *[""] * (len(labels) - 1), ""))
    return rows


def quality_rows(comparison: Any) -> list[tuple[str, ...]]:
    """The quality block's rows in the delta table's columns (servescope.sessions.quality): `quality` (or `WORKLOAD
    under load`) on a section's first row, the task's context or the cell's load, the figure, one value per
    session (★ on the best beyond noise), each later session's delta vs the first (`-8.0 pts worse`), and the
    best session (or why none: within noise, no interval, -). Empty when no session holds quality results."""
    q = getattr(comparison, "quality", None)
    if q is None:
        return []
    n = len(comparison.labels)
    rows: list[tuple[str, ...]] = []
    shown = ""
    for r in q.rows:
        group = "quality" if not r.section.startswith("under load") else (
            f"{r.section.removeprefix('under load: ')} under load")
        head = group if group != shown else ""
        shown = group
        vals = [t + (WIN if i == r.best else "") for i, t in enumerate(r.texts)]
        best = comparison.labels[r.best] if r.best is not None else r.no_best
        rows.append((head, r.where, r.short or r.label, *vals, *[r.delta_text(i) for i in range(1, n)], best))
    for lb in q.missing:
        rows.append(("quality" if not rows else "", "", f"{lb}: no quality results", *[""] * (2 * n - 1), ""))
    return rows


def comparability_lines(comparison: Any) -> list[str]:
    """When another tool measured some session (servescope.sessions.comparability): each session's tool and each
    definition that differs with the figures it leaves unjudged, `measured with: gl GuideLLM 0.8.1, ap AIPerf
    0.13.0` and `ITL definition differs: ITL p99 ms not judged`; [] for sessions servescope measured."""
    c = getattr(comparison, "comparability", None)
    if c is None or not c.shown:
        return []
    names = {m.key: m.label for m in comparison.metrics}
    out = ["measured with: " + ", ".join(f"{lb} {t}" for lb, t in zip(comparison.labels, c.tools, strict=True))]
    for r in c.rows:
        if r.figures:
            out.append(f"{r.fact.label} differs: {', '.join(names.get(f, f) for f in r.figures)} not judged")
    return out


def config_line(comparison: Any) -> str:
    """'config: --max-num-seqs 16 | 32; model a | b': what the sessions' recorded configuration differs in."""
    return "config: " + "; ".join(f"{what} {' | '.join(vals)}" for what, vals in comparison.config)


def answer_line(a: Any) -> str:
    """'FP8: capacity c=16, knee c=16, peak 1,193 tok/s at c=16' (`+`: not reached, the highest level
    measured still qualifies)."""
    cap = a.capacity
    cap_t = cap.text().split(" (")[0].split(":")[0] + ("+" if cap.not_reached and cap.level is not None else "")
    knee = f"c={a.knee.concurrency}" + ("+" if a.knee.not_reached else "") if a.knee.concurrency is not None else "-"
    peak = f"{fmt_num(a.peak_output_tok_s)} tok/s at {a.peak_load}" if a.peak_output_tok_s is not None else "-"
    left = f" (left out, not completed: {', '.join(a.left_out)})" if getattr(a, "left_out", None) else ""
    bound = getattr(a, "bound", None)
    if bound:  # the load generator, not the server, limited them
        left += f" (left out, client bound: {', '.join(b.split(' (')[0] for b in bound)})"
    return f"{a.session}: capacity {cap_t}, knee {knee}, peak {peak}{left}"


def load_kind(sessions: list[Any], workload: str) -> str:
    """"req/s" when the workload's cells ran at request rates, else "users" (concurrency)."""
    for s in sessions:
        for v in cell_views(s):
            if v.workload == workload and v.x is not None:
                return "req/s" if v.concurrency is None and v.rate is not None else "users"
    return "users"


def session_curve(session: Any, workload: str, metric: str) -> tuple[tuple[float, float, bool], ...]:
    """(load, value, client_bound) over one session's completed cells of `workload` (for the overlaid curves): a
    client-bound cell measured the load generator, so the chart draws it hollow, apart from the line."""
    pts = []
    for v in cell_views(session):
        y = v.summary.value(metric)
        if v.workload == workload and v.x is not None and y is not None and is_completed(v):  # completed only
            pts.append((float(v.x), y, v.summary.client_bound))
    return tuple(sorted(pts))


class CompareScreen(Screen[None]):
    """Pushed by the Sessions screen (`c` on two or more marked sessions)."""

    BINDINGS = [
        Binding("escape,b", "back", "Back"),
        Binding("l", "next_label", "Label by", show=False),  # the "label by" field is on screen; F1 lists it
        Binding("B", "next_baseline", "Base", tooltip="Baseline"),  # a short word: F2 and F3 fit at 80 columns
        Binding("w", "next_workload", "Workload"),
        Binding("e", "export", "Export"),
    ]

    def __init__(self, paths: list[Path], label_key: str | None = None) -> None:
        """Loads the sessions; raises ServescopeError (missing, newer schema, no common cell while neither holds
        quality results, a damaged quality.json) for the caller to show."""
        super().__init__()
        if len(paths) < 2:
            raise ServescopeError("compare needs at least two sessions: mark them with space, then press c")
        self.paths = list(paths)
        self.sessions = [load_session(p) for p in self.paths]
        self.keys = tag_keys(self.sessions)
        self.label_key = label_key if label_key in self.keys else default_label_key(self.sessions)
        self.comparison = self._compare(self.label_key)  # raises when they share no cell (and hold no quality)
        self.workloads: list[str] = list(dict.fromkeys(c.workload for c in self.comparison.cells))
        self.workload = self.workloads[0] if self.workloads else ""

    def _compare(self, label_key: str | None) -> Any:
        return compare_sessions(self.sessions, label_key=label_key)

    # ---- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="compare-head")
        options = [(plain(NAME_LABEL), NAME_LABEL)] + [(plain(f"tag {k}"), k) for k in self.keys]
        yield Horizontal(Label("label by", classes="field-label"),
                         Select(options, value=self.label_key or NAME_LABEL, allow_blank=False, id="label-key"),
                         classes="field-row", id="compare-controls")
        yield FitTable(id="compare-table")
        yield Static("", id="compare-answers", markup=False)
        with Horizontal(id="compare-curves"):
            yield OverlayCurve(id="cmp-aggregate")
            yield OverlayCurve(id="cmp-per-user")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        t = self.query_one("#compare-table", FitTable)
        t.sortable = False  # rows are grouped by cell
        self.refresh_view()
        t.focus()

    def refresh_view(self) -> None:
        cmp_ = self.comparison
        labels = cmp_.labels
        cells = (f"{len(cmp_.cells)} common cell{'s' if len(cmp_.cells) != 1 else ''}" if cmp_.cells else
                 "no speed cells in common: quality only")
        head = [f"[b]{esc(' vs '.join(labels))}[/b]  ({cells};"
                f" baseline {esc(labels[0])} (B changes it); ★ best beyond noise)"]
        if cmp_.mismatches:
            head.append("[b]not comparable[/b], no winner: " + esc("; ".join(cmp_.mismatches)))
        head += [esc(h) for h in comparability_lines(cmp_)]
        head += [esc(h) for h in headline(cmp_)[:1]]  # whole: the header grows rather than cut a sentence
        self.query_one("#compare-head", Static).update("\n".join(head))
        t = self.query_one("#compare-table", FitTable)
        t.clear(columns=True)
        t.set_columns(COMPARE_COLS(labels))
        for i, row in enumerate(delta_rows(cmp_) + quality_rows(cmp_)):
            t.data[str(i)] = [clean_text(str(v)) for v in row]
        t.relayout(force=True)
        answers = [config_line(cmp_)] if cmp_.config else []  # the server arguments that differ
        answers += [answer_line(a) for a in cmp_.answers if a.workload == self.workload]
        answers += cmp_.notes
        if cmp_.quality is not None:
            answers += cmp_.quality.notes
            answers.append("quality Δ: accuracy in points, beyond noise by a two-proportion test at 95%; "
                           "perplexity and KL not judged")
        if cmp_.cells:
            # one line at 80 columns: `Δ [low, high]: 95% request-level interval (1 repeat); noise: holds 0 or < 2%`
            answers.append(f"Δ [low, high]: 95% {cmp_.interval or 'bootstrap interval'}; noise: holds 0 or < "
                           f"{cmp_.min_effect:g}%")
        self.query_one("#compare-answers", Static).update("\n".join(clean_text(a) for a in answers))
        self._plot()

    def _plot(self) -> None:
        """Every cell of each session (not only the common ones) for the shown workload; no curves when the
        sessions share no cell (quality only)."""
        self.query_one("#compare-curves").display = bool(self.workloads)
        more = f" (w: next of {len(self.workloads)})" if len(self.workloads) > 1 else ""
        kind = load_kind(self.sessions, self.workload)
        for wid, metric, what in (("#cmp-aggregate", "output_tok_s", "output tok/s"),
                                  ("#cmp-per-user", "per_user_tok_s.mean", "mean tok/s/user")):
            c = self.query_one(wid, OverlayCurve)
            c.title = f"{what} vs load: {self.workload}{more}"
            c.title_short = f"{what} vs load: {self.workload}"  # the hint is in the footer too (w Workload)
            c.x_kind = kind
            c.series = tuple((lb, session_curve(s, self.workload, metric))
                             for lb, s in zip(self.comparison.labels, self.sessions, strict=True))

    # ---- actions --------------------------------------------------------------------------------
    @on(Select.Changed, "#label-key")
    def _label_changed(self, event: Select.Changed) -> None:
        key = None if event.value in (NAME_LABEL, Select.BLANK) else str(event.value)
        if key == self.label_key:
            return
        self.label_key = key
        self.comparison = self._compare(key)
        self.refresh_view()

    def action_next_label(self) -> None:
        choices: list[str | None] = [None, *self.keys]
        nxt = choices[(choices.index(self.label_key) + 1) % len(choices)] if self.label_key in choices else None
        if len(choices) == 1:
            self.notify("these sessions have no tags to label them by: tag a sweep with e.g. quant=FP8",
                        severity="warning", markup=False)
            return
        self.query_one("#label-key", Select).value = nxt or NAME_LABEL  # Select.Changed does the rest

    def action_next_baseline(self) -> None:
        """The next session becomes the baseline the deltas are taken against (and the report's first)."""
        if len(self.sessions) < 2:
            return
        self.paths = self.paths[1:] + self.paths[:1]
        self.sessions = self.sessions[1:] + self.sessions[:1]
        self.comparison = self._compare(self.label_key)
        self.refresh_view()
        self.notify(f"baseline: {self.comparison.labels[0]}", timeout=3, markup=False)

    def action_next_workload(self) -> None:
        if len(self.workloads) < 2:
            self.notify("the sessions share one workload", severity="information", markup=False)
            return
        self.workload = self.workloads[(self.workloads.index(self.workload) + 1) % len(self.workloads)]
        self.refresh_view()

    def default_report_path(self) -> Path:
        labels = self.comparison.labels
        return self.paths[0].parent / f"report-{slug('-vs-'.join(labels))[:80]}.md"

    def action_export(self) -> None:
        first, rest, key = self.sessions[0], self.sessions[1:], self.label_key

        def render() -> str:
            return render_report(first, compare_with=rest, fmt="md", label_key=key)

        self.app.push_screen(ExportScreen(" vs ".join(self.comparison.labels), self.default_report_path(), render),
                             self._exported)

    def _exported(self, path: Path | None) -> None:
        if path is not None:
            self.notify(f"wrote the report to {short_path(path)}", title="export", timeout=8, markup=False)

    def action_back(self) -> None:
        self.app.pop_screen()
