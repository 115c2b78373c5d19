"""The new-workload form (Compose, ctrl+n): a kind (single, conversation, agent, trace) and the fields that
kind takes, each checked as the Compose screen's are (the error under its field); a trace file gets a live
one-line preview of its requests, rate and lengths (or the line that says what is wrong with it). Saved as a
TOML file in the workloads folder through `Workload.from_dict` / `to_dict`, the same schema `-w FILE` reads.
`list_shape` is how the Compose list says a workload's shape (short enough for 80 columns).

Imported inside functions, to keep httpx off the app's start-up: workloads.traces (benchmarks/import_cost.py; the
docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import slug
from servescope.tui.keyorder import FormInput
from servescope.tui.widgets.panels import short_path
from servescope.workloads.spec import DistTable, Workload, WorkloadTable, fixed


def parse_length(text: str, where: str, what: str = "a token count like 1024 or a range like 200-512") -> DistTable:
    """'1024' -> fixed, '200-512' -> uniform."""
    t = text.strip().replace(" ", "")
    lo, sep, hi = t.partition("-")
    if not sep and t.isdigit() and int(t) > 0:
        return {"dist": "fixed", "value": int(t)}
    if sep and lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi):
        return {"dist": "uniform", "min": int(lo), "max": int(hi)}
    raise ServescopeError(f"{where}: give {what}")


def parse_seconds(text: str, where: str) -> DistTable:
    """'0', '2', '0.5' -> fixed; '1-5' -> uniform (seconds, never negative)."""
    t = text.strip().replace(" ", "").removesuffix("s") or "0"
    lo, sep, hi = t.partition("-")

    def num(v: str) -> float | None:
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) and f >= 0 else None

    a, b = num(lo), num(hi) if sep else None
    if not sep and a is not None:
        return {"dist": "fixed", "value": a}
    if sep and a is not None and b is not None and a <= b:
        return {"dist": "uniform", "min": a, "max": b}
    raise ServescopeError(f"{where}: give seconds like 0, 2 or a range like 1-5")


def show_field_error(node: Any, fid: str, text: str) -> None:
    """The error line under field_row's input `fid` (hidden when `text` is empty)."""
    w = node.query_one(f"#{fid}-error", Static)
    if w.has_class("-visible") == bool(text) and str(w.content) == text:
        return  # as shown: no repaint (the form checks its fields on every key)
    w.update(text)
    w.set_class(bool(text), "-visible")


def field_row(label: str, input_id: str, value: str = "", placeholder: str = "", password: bool = False,
              classes: str = "") -> Vertical:
    return Vertical(
        Horizontal(Label(label, classes="field-label"), FormInput(value, placeholder=placeholder, id=input_id,
                                                              password=password), classes="field-row"),
        Static("", id=f"{input_id}-error", classes="field-error", markup=False),
        classes=f"field {classes}".strip(),
    )


def select_row(label: str, select_id: str, options: list[tuple[str, str]], value: str, classes: str = "") -> Horizontal:
    return Horizontal(Label(label, classes="field-label"),
                      Select(options, value=value, allow_blank=False, id=select_id),
                      classes=f"field-row {classes}".strip())


def _short(d: Any, unit: str = "") -> str:
    """A length distribution in a few characters: 256, 200-500, ~300 (a normal's mean); 16384 as 16K."""
    def n(v: float) -> str:
        return f"{v / 1024:g}K" if v >= 4096 and v % 1024 == 0 else f"{v:g}"

    if d.dist == "fixed":
        return n(d.value) + unit
    if d.dist == "uniform":
        return f"{n(d.min)}-{n(d.max)}{unit}"
    return f"~{n(round(d.mean))}{unit}"


def list_shape(w: Any) -> str:
    """A workload's shape for the Compose list, short enough for 80 columns: single-turn workloads as
    Workload.shape() says them; a conversation's turns, an agent's context and calls, a trace's file and size."""
    think = f", think {_short(w.think_time_s, ' s')}" if w.think_time_s.upper > 0 else ""
    if w.kind == "conversation":
        turns = "dataset's" if w.dataset else _short(w.turns)
        pre = f", prefix {_short(fixed(w.prefix_tokens))}" if w.prefix_tokens else ""
        return f"conversation: {turns} turns x in {_short(w.input_tokens)} / out {_short(w.output_tokens)}{think}{pre}"
    if w.kind == "agent":
        ctx = _short(fixed(w.context_tokens))
        return (f"agent: {ctx} context + {_short(w.input_tokens)}, {_short(w.calls)} calls x tool "
                f"{_short(w.tool_result_tokens)} / out {_short(w.output_tokens)}{think}")
    if w.kind == "trace":
        scale = f" x{w.time_scale:g} time" if w.time_scale != 1 else ""
        try:
            from servescope.workloads.traces import cached_trace

            t = cached_trace(w.trace, w.trace_format)
            what = f"{len(t.requests):,} requests over {t.scaled(w.time_scale).duration_s:,.0f} s"
            fmt = t.format
        except ServescopeError:
            what, fmt = "✗ cannot be read (add it again to see why)", w.trace_format
        return f"trace {Path(w.trace).name} ({fmt}{scale}): {what}"
    return str(w.shape())


KINDS = (("single: one request at a time", "single"), ("conversation: turns resend the history", "conversation"),
         ("agent: calls on one long context", "agent"), ("trace: replay a trace file's requests", "trace"))
FORMATS = (("auto (from the file)", "auto"), ("mooncake (JSON lines)", "mooncake"), ("burstgpt (CSV)", "burstgpt"),
           ("azure (CSV)", "azure"), ("session (a servescope session)", "session"))
# the fields each kind shows (a field row's class is k-<kind> for every kind that takes it)
KIND_FIELDS = {
    "single": ("api", "in", "out", "prefix", "think"),
    "conversation": ("turns", "in", "out", "pause", "prefix", "think"),
    "agent": ("context", "in", "calls", "tool", "out", "pause", "think"),
    "trace": ("api", "trace", "format", "scale", "think"),
}
# the input field's label and hint by kind: a conversation's is each turn's new user message, an agent's its task
IN_LABEL = {"single": ("input tokens", "1024 or 200-512"),
            "conversation": ("user tokens", "new tokens each turn: 300 or 200-500"),
            "agent": ("task tokens", "the task after the context: 300 or 200-400")}


class WorkloadFormScreen(ModalScreen["Any"]):
    """A small form for a new workload; saved as TOML in the workloads folder."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save workload")]

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def compose(self) -> ComposeResult:
        def kinds(field: str) -> str:
            return " ".join(f"k-{k}" for k, fs in KIND_FIELDS.items() if field in fs)

        with Vertical(id="wl-form"):
            yield Static(f"New workload (saved to {short_path(self.folder)})", classes="pane-title", markup=False)
            with VerticalScroll(id="wf-fields", can_focus=False):
                yield field_row("name", "wf-name", placeholder="rag-4k")
                yield select_row("kind", "wf-kind", list(KINDS), "single")
                yield select_row("api", "wf-api", [("chat", "chat"), ("completions", "completions")], "chat",
                                 kinds("api"))
                yield field_row("trace file", "wf-trace", "", "mooncake.jsonl, a CSV or a session folder",
                                classes=kinds("trace"))
                yield Static("", id="wf-trace-preview", classes=f"hint field-note {kinds('trace')}", markup=False)
                yield select_row("format", "wf-format", list(FORMATS), "auto", kinds("format"))
                yield field_row("time scale", "wf-scale", "1", "x the trace's times: 0.5 replays twice as fast",
                                classes=kinds("scale"))
                yield field_row("context", "wf-context", "16384", "tokens every session shares (system, tools, repo)",
                                classes=kinds("context"))
                yield field_row("turns", "wf-turns", "5", "per conversation: 5 or 3-8", classes=kinds("turns"))
                yield field_row("input tokens", "wf-in", "1024", "1024 or 200-512", classes=kinds("in"))
                yield field_row("calls", "wf-calls", "8", "model calls per session: 8 or 4-12", classes=kinds("calls"))
                yield field_row("tool result", "wf-tool", "100-1000", "tokens before each later call: 100-1000",
                                classes=kinds("tool"))
                yield field_row("output tokens", "wf-out", "256", "256 or 128-512", classes=kinds("out"))
                yield field_row("think time s", "wf-pause", "0", "before each later turn: 0, 2 or 1-5",
                                classes=kinds("pause"))
                yield field_row("shared prefix", "wf-prefix", "0", "tokens shared by every prompt",
                                classes=kinds("prefix"))
                yield select_row("thinking", "wf-think", [("server default", "default"), ("on", "on"), ("off", "off")],
                                 "default", kinds("think"))
            yield Static("", id="wf-error", classes="field-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save (ctrl+s)", id="wf-save", variant="primary")
                yield Button("Cancel (esc)", id="wf-cancel")

    def on_mount(self) -> None:
        self._show_kind()
        self.query_one("#wf-name", Input).focus()

    @property
    def kind(self) -> str:
        v = self.query_one("#wf-kind", Select).value
        return v if isinstance(v, str) else "single"

    def _show_kind(self) -> None:
        """Show the fields the chosen kind takes, hide the others (and their errors)."""
        kind = self.kind
        for w in self.query(".k-single, .k-conversation, .k-agent, .k-trace"):
            w.display = w.has_class(f"k-{kind}")
        label, hint = IN_LABEL.get(kind, IN_LABEL["single"])
        inp = self.query_one("#wf-in", Input)
        inp.placeholder = hint
        if inp.parent is not None:
            inp.parent.query_one(Label).update(label)
        if kind == "single":
            self.query_one("#wf-prefix", Input).placeholder = "tokens shared by every prompt"
        elif kind == "conversation":
            self.query_one("#wf-prefix", Input).placeholder = "a system prompt every conversation starts with"
        self._err("wf", "")

    @on(Select.Changed, "#wf-kind")
    def _kind_changed(self) -> None:
        self._show_kind()
        if self.kind == "trace":
            self._preview()

    # ---- the trace preview -------------------------------------------------------------------------
    @on(Input.Changed, "#wf-trace")
    @on(Input.Changed, "#wf-scale")
    @on(Select.Changed, "#wf-format")
    def _trace_changed(self) -> None:
        self._preview()

    def _trace_path(self) -> str:
        p = self.query_one("#wf-trace", Input).value.strip()
        return str(Path(p).expanduser().resolve()) if p else ""

    def _scale(self) -> float | None:
        try:
            v = float(self.query_one("#wf-scale", Input).value.strip() or "1")
        except ValueError:
            return None
        return v if math.isfinite(v) and v > 0 else None

    def _preview(self) -> None:
        path, fmt, scale = self._trace_path(), str(self.query_one("#wf-format", Select).value), self._scale()
        box = self.query_one("#wf-trace-preview", Static)
        if not path:
            box.update("the file's requests, rate and lengths show here")
            return
        box.update("reading the trace…")
        self._read_trace(path, fmt, scale)

    @work(thread=True, exclusive=True, group="trace-preview")
    def _read_trace(self, path: str, fmt: str, scale: float | None) -> None:
        from servescope.workloads.traces import cached_trace

        try:
            trace = cached_trace(path, fmt)
            text = trace.scaled(scale).preview() if scale else trace.preview()
            if scale and scale != 1:
                text = f"at x{scale:g} time: {text}"
            text = f"✓ {trace.format}: {text}"
        except ServescopeError as e:
            text = f"✗ {e.message}"
        except Exception as e:  # never let a strange file take the form down
            text = f"✗ cannot read it: {type(e).__name__}: {e}"
        self.app.call_from_thread(self._show_preview, path, fmt, scale, text)

    def _show_preview(self, path: str, fmt: str, scale: float | None, text: str) -> None:
        if not self.is_attached:
            return
        if (path, fmt, scale) != (self._trace_path(), str(self.query_one("#wf-format", Select).value), self._scale()):
            return  # the fields changed since: a newer preview is on its way
        self.query_one("#wf-trace-preview", Static).update(text)

    # ---- errors, cancel, save ------------------------------------------------------------------------
    def _err(self, field: str, text: str) -> None:
        show_field_error(self, field, text)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#wf-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#wf-save")
    def _save_pressed(self) -> None:
        self.action_save()

    def _val(self, fid: str) -> str:
        return self.query_one(f"#{fid}", Input).value.strip()

    def collect(self) -> WorkloadTable | None:
        """The workload table the visible fields make (errors under their fields), or None."""
        kind = self.kind
        shown = KIND_FIELDS[kind]
        for f in ("wf-name", "wf-trace", "wf-scale", "wf-context", "wf-turns", "wf-in", "wf-calls", "wf-tool",
                  "wf-out", "wf-pause", "wf-prefix", "wf"):
            self._err(f, "")
        ok = True

        def bad(fid: str, text: str) -> None:
            nonlocal ok
            self._err(fid, text)
            ok = False

        name = self._val("wf-name")
        if not name:
            bad("wf-name", "give the workload a name")
        d: WorkloadTable = {"name": name}
        if kind != "single":
            d["kind"] = kind
        d["api"] = str(self.query_one("#wf-api", Select).value) if "api" in shown else "chat"

        def length(key: str, fid: str, where: str, what: str | None = None) -> DistTable | None:
            if key not in shown:
                return None
            try:
                return parse_length(self._val(fid), where) if what is None else parse_length(self._val(fid), where, what)
            except ServescopeError as e:
                bad(fid, e.message)
                return None

        if (inp := length("in", "wf-in", "input tokens")) is not None:
            d["input_tokens"] = inp
        if (out := length("out", "wf-out", "output tokens")) is not None:
            d["output_tokens"] = out
        if (tool := length("tool", "wf-tool", "tool result tokens")) is not None:
            d["tool_result_tokens"] = tool
        rounds = "a number of {} like 5 or a range like 3-8"
        if (turns := length("turns", "wf-turns", "turns", rounds.format("turns"))) is not None:
            d["turns"] = turns
        if (calls := length("calls", "wf-calls", "calls", rounds.format("calls"))) is not None:
            d["calls"] = calls
        if "pause" in shown:
            try:
                d["think_time_s"] = parse_seconds(self._val("wf-pause"), "think time")
            except ServescopeError as e:
                bad("wf-pause", e.message)
        if "prefix" in shown:
            pre = self._val("wf-prefix") or "0"
            if not pre.isdigit():
                bad("wf-prefix", "shared prefix: a whole number of tokens (0 for none)")
            else:
                d["prefix_tokens"] = int(pre)
        if "context" in shown:
            ctx = self._val("wf-context") or "0"
            if not ctx.isdigit():
                bad("wf-context", "context tokens: a whole number of tokens, e.g. 16384")
            else:
                d["context_tokens"] = int(ctx)
        if "trace" in shown:
            path = self._trace_path()
            fmt = str(self.query_one("#wf-format", Select).value)
            if not path:
                bad("wf-trace", "give the trace file (Mooncake JSONL, BurstGPT or Azure CSV) or a session folder")
            else:
                from servescope.workloads.traces import cached_trace

                try:
                    cached_trace(path, fmt)
                except ServescopeError as e:
                    bad("wf-trace", e.message)
                d["trace"], d["format"] = path, fmt
            scale = self._scale()
            if scale is None:
                bad("wf-scale", "time scale: a number above 0 (0.5 replays twice as fast, 2 at half speed)")
            else:
                d["time_scale"] = scale
        think = self.query_one("#wf-think", Select).value
        if think != "default":
            d["thinking"] = think == "on"
        return d if ok else None

    # the Workload schema's keys -> the form field that holds them (for from_dict's errors)
    KEY_FIELDS = {"input_tokens": "wf-in", "output_tokens": "wf-out", "prefix_tokens": "wf-prefix",
                  "turns": "wf-turns", "calls": "wf-calls", "tool_result_tokens": "wf-tool",
                  "think_time_s": "wf-pause", "context_tokens": "wf-context", "time_scale": "wf-scale",
                  "trace": "wf-trace", "format": "wf-trace", "name": "wf-name"}

    def action_save(self) -> None:
        import tomli_w

        d = self.collect()
        if d is None:
            return
        try:
            w = Workload.from_dict(d, "workload")
        except ServescopeError as e:
            msg = e.message.removeprefix("workload: ")
            key = msg.split(":", 1)[0].split(" ", 1)[0]
            self._err(self.KEY_FIELDS.get(key, "wf"), msg)
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{slug(w.name)}.toml"
            body = {k: v for k, v in w.to_dict().items() if k not in ("source", "dataset", "seed")}
            path.write_text(tomli_w.dumps({"workload": body}), encoding="utf-8")
        except OSError as e:
            self._err("wf", f"cannot write to {self.folder}: {e.strerror}")
            return
        from dataclasses import replace

        self.dismiss(replace(w, source=str(path)))
