"""The Compose screen: target (URL, API-key variable, probe), workloads (presets, TOML files, a form for
a new one), load (concurrency or rates, requests/duration, warmup, SLOs, tags) and quality (the share of
probe questions mixed into each cell, and a standalone quality probe of the target); a live preview of the
grid; save and load the whole sweep as TOML (ctrl+s asks where, offering the sweeps folder or the file last
used). Bad input is shown next to its field, never raised: each field as its option's parser reads it, the
rules across fields as SweepSpec.check (the CLI's own) words them, so a bad combination reads the same here as
from `servescope run`. The quality probe is its own widget, QualityProbePane (servescope/tui/screens/qualitypane.py).

Imported inside functions, to keep httpx and polars off the app's start-up; core.launch, which needs neither, takes
40 ms: core.launch, core.target, engine.runner, sim.profile, workloads.traces (benchmarks/import_cost.py; the
docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import os
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.geometry import Size
from textual.screen import Screen
from textual.widgets import (
    Button,
    Footer,
    Input,
    Label,
    Select,
    SelectionList,
    Static,
    TabbedContent,
    TabPane,
)
from textual.widgets.selection_list import Selection

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text, slug
from servescope.engine.fields import fmt_duration, fmt_num
from servescope.engine.spec import SweepSpec, form_fields, form_labels, parse_field
from servescope.tui import messages as m
from servescope.tui.qualityworker import QualityProbe
from servescope.tui.safe import plain
from servescope.tui.screens.dialogs import AskScreen
from servescope.tui.screens.qualitypane import QualityProbePane
from servescope.tui.screens.workloadform import (
    WorkloadFormScreen,
    field_row,
    list_shape,
    parse_length,
    show_field_error,
)
from servescope.tui.sweepworker import probe_target, sim_profiles
from servescope.tui.widgets.marklist import MarkedSelectionList
from servescope.tui.widgets.panels import short_path
from servescope.tui.widgets.table import ellipsize
from servescope.workloads.spec import COMPOSITE, PRESETS, Workload, context_sweep, load_toml

__all__ = ["ComposeScreen", "WorkloadFormScreen", "field_row", "parse_length", "preview_text", "rough_cell_s"]

ASSUMED_TPOT_MS = 20.0  # for the rough duration only
ASSUMED_PREFILL_TOK_S = 5000.0

LABELS = form_labels()  # each option field's label, as the sweep's options declare it (Option.form)


def mask_key(value: str | None) -> str:
    if not value:
        return ""
    return "•" * 8 + (value[-4:] if len(value) >= 12 else "")


def workloads_dir() -> Path:
    """Where workload TOML files live: $SERVESCOPE_HOME/workloads, else the user data directory."""
    env = os.environ.get("SERVESCOPE_HOME")
    if env:
        return Path(env).expanduser() / "workloads"
    from platformdirs import user_data_dir

    return Path(user_data_dir("servescope", appauthor=False)) / "workloads"


def sweeps_dir() -> Path:
    """Where ctrl+s offers to save a sweep: $SERVESCOPE_HOME/sweeps, else the user data directory's."""
    env = os.environ.get("SERVESCOPE_HOME")
    if env:
        return Path(env).expanduser() / "sweeps"
    from platformdirs import user_data_dir

    return Path(user_data_dir("servescope", appauthor=False)) / "sweeps"


def describe_profile(name: str) -> str:
    """A simulator profile's one-line description ("" when the simulator is not installed)."""
    try:
        from servescope.sim.profile import describe

        d = describe(name)
    except Exception:
        return ""
    return "" if d == "(unreadable)" else d


PREVIEW_ROWS = 4  # the preview's rows at most (80x24: the grid in one or two, the target, its SLOs and tags)


def preview_rows(text: str, width: int, rows: int = PREVIEW_ROWS) -> list[str]:
    """The preview's lines laid out in `width` columns: each line's parts (split at `, `) packed onto rows whole,
    a part wider than a row broken at its spaces; at most `rows` rows, the last ending in `…` when more was left
    (never a part cut silently)."""
    out: list[str] = []
    for line in text.split("\n"):
        parts = line.split(", ")
        cur = ""
        for i, part in enumerate(parts):
            piece = part + ("," if i < len(parts) - 1 else "")
            if cur and len(cur) + 1 + len(piece) <= width:
                cur += " " + piece
                continue
            if cur:
                out.append(cur)
            pieces = textwrap.wrap(piece, width, break_on_hyphens=False) or [""]
            out += pieces[:-1]
            cur = pieces[-1]
        out.append(cur)
    if len(out) > rows:
        last = out[rows - 1]
        out = [*out[: rows - 1], last + " …" if len(last) + 2 <= width else ellipsize(last + " …", width)]
    return out


class PreviewText(Static):
    """The preview under the form: its lines packed into the width it has (`preview_rows`), as many rows as they
    take up to PREVIEW_ROWS, what does not fit cut with `…`."""

    def update(self, content: Any = "", *, layout: bool = True) -> None:
        self.text = str(content)
        super().update(content, layout=layout)

    def render(self) -> Any:
        text = getattr(self, "text", "")
        return "\n".join(preview_rows(text, self.content_size.width or 10_000))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(preview_rows(getattr(self, "text", ""), width or 10_000))


class ComposeScreen(Screen[None]):
    BINDINGS = [
        Binding("f5", "probe", "Probe"),
        Binding("ctrl+r", "run_sweep", "Run"),
        Binding("ctrl+s", "save_sweep", "Save"),
        Binding("ctrl+o", "load_sweep", "Load"),
        Binding("ctrl+n", "new_workload", "Workload"),
        Binding("f6", "tab('tab-target')", "Target pane", show=False),
        Binding("f7", "tab('tab-workloads')", "Workloads pane", show=False),
        Binding("f8", "tab('tab-load')", "Load pane", show=False),
        Binding("f9", "tab('tab-quality')", "Quality pane", show=False),
    ]

    def __init__(self, url: str = "sim://tiny", api_key_env: str = "OPENAI_API_KEY",
                 workloads_folder: Path | None = None) -> None:
        super().__init__()
        self.initial_url = url
        self.initial_key_env = api_key_env
        self.workloads_folder = workloads_folder or workloads_dir()
        self.items: dict[str, Workload | str] = {}  # selection value -> Workload (or composite name)
        self.probed: m.ProbeInfo | None = None
        self.probed_url = ""  # the URL field's value the probe result is for
        self.loaded_spec: SweepSpec | None = None  # the sweep last loaded (ctrl+o): the settings the form does not show
        self._shown: set[str] = set()  # the fields showing an error validate() found
        self._bad: list[str] = []  # the fields (or "workloads", "preview") with an error, as validate() last found

    # ---- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        profiles = sim_profiles()
        with TabbedContent(id="compose-tabs", initial="tab-target"):
            with TabPane("Target F6", id="tab-target"), VerticalScroll(classes="pane", can_focus=False):
                yield field_row(LABELS["url"], "url", self.initial_url, "http://127.0.0.1:8000 or sim://tiny")
                yield Horizontal(Label("simulator", classes="field-label"),
                                 Select([(plain(f"{p}: {describe_profile(p)}".rstrip(": ")), p) for p in profiles],
                                        prompt="pick a built-in profile", id="sim-profile"), classes="field-row")
                yield Static("", id="sim-desc", classes="hint field-note", markup=False)
                yield field_row(LABELS["launch"], "launch", "", "vllm serve MODEL --port 8000 (servescope starts it)")
                yield field_row(LABELS["variants"], "variants", "", "with launch: --max-num-seqs 4 ; --max-num-seqs 16")
                yield field_row(LABELS["model"], "model", "", "optional: the only served model by default")
                yield field_row(LABELS["key-env"], "key-env", self.initial_key_env, "environment variable NAME")
                yield Static("", id="key-status", classes="hint", markup=False)
                with Horizontal(classes="buttons"):
                    yield Button("Probe (F5)", id="probe", variant="primary")
                yield Static("Not probed yet: press F5 to ask the server what it serves.", id="probe-result", markup=False)
            with TabPane("Workloads F7", id="tab-workloads"), VerticalScroll(classes="pane", can_focus=False):
                yield MarkedSelectionList(id="workloads")
                yield field_row("add TOML file", "wl-file", "", "path/to/workload.toml, then enter")
                with Horizontal(classes="buttons"):
                    yield Button("Add file", id="wl-add")
                    yield Button("New workload (ctrl+n)", id="wl-new")
                yield Static("", id="wl-selected", classes="hint", markup=False)
                yield Static(f"workloads folder: {short_path(self.workloads_folder)}", classes="hint", markup=False)
            with TabPane("Load F8", id="tab-load"), VerticalScroll(classes="pane", can_focus=False):
                yield field_row(LABELS["concurrency"], "concurrency", "1,4,16",
                                "closed loop users, e.g. 1,4,16 (empty, no rates: the workload's own)")
                yield field_row(LABELS["rates"], "rates", "", "or open-loop requests/s, e.g. 0.5,2,5")
                yield field_row(LABELS["requests"], "requests", "100",
                                "measured per cell (empty, no duration: the workload's own, else 100)")
                yield field_row(LABELS["duration"], "duration", "", "and/or per cell, e.g. 60s")
                yield field_row(LABELS["warmup"], "warmup", "0", "requests per cell not counted")
                yield field_row(LABELS["repeat"], "repeat", "1", "runs of each cell, interleaved (3: medians with intervals)")
                yield field_row(LABELS["slos"], "slos", "", "e.g. ttft_ms=3000,tpot_ms=50")
                yield field_row(LABELS["tags"], "tags", "", "e.g. quant=FP8,gpu=H100")
                yield field_row(LABELS["name"], "name", "", "session name (optional)")
                yield field_row("sweep file", "sweep-file", "", "the TOML file ctrl+o loads (ctrl+s asks where)")
                with Horizontal(classes="buttons"):
                    yield Button("Save sweep (ctrl+s)", id="save-sweep")
                    yield Button("Load sweep (ctrl+o)", id="load-sweep")
            with TabPane("Quality F9", id="tab-quality"), VerticalScroll(classes="pane", can_focus=False):
                yield field_row(LABELS["quality-share"], "quality-share", "", "e.g. 0.05 (empty: off)")
                yield Static("probe questions mixed into each cell of the sweep, about this share of its requests; "
                             "each cell then reports accuracy and divergence at its load", id="quality-share-note",
                             classes="hint", markup=False)
                yield QualityProbePane(self.quality_target)
        with Horizontal(id="preview-bar"):
            yield PreviewText("", id="preview", markup=False)
            yield Button("Run (ctrl+r)", id="run", variant="success")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._fill_workloads(selected={"preset:sharegpt"})
        self._key_status()
        self._sim_desc()
        self.update_preview()

    # ---- workloads list -------------------------------------------------------------------------
    def _fill_workloads(self, selected: set[str] | None = None, extra: list[Workload] | None = None) -> None:
        sl = self.query_one("#workloads", SelectionList)
        keep = set(sl.selected) if selected is None else selected
        self.items = {k: v for k, v in self.items.items() if k.startswith("file:")}
        opts: list[tuple[str, Workload | str, str]] = []
        for w in PRESETS.values():
            opts.append((f"preset:{w.name}", w, f"{w.name:<15} {list_shape(w)}"))
        for name, desc in COMPOSITE.items():
            opts.append((f"composite:{name}", name, f"{name:<15} {desc}"))
        files = sorted(self.workloads_folder.glob("*.toml")) if self.workloads_folder.is_dir() else []
        for f in files:
            try:
                for w in load_toml(f):
                    self.items[f"file:{f}#{w.name}"] = w
            except ServescopeError as e:
                self.notify(e.message, severity="warning", timeout=8, markup=False)
        for w in extra or []:
            self.items[f"file:{w.source}#{w.name}"] = w
        for k, item in self.items.items():
            if k.startswith("file:") and not isinstance(item, str):
                # the file, unless it is the one the form names after the workload (a short list at 80 columns)
                src = Path(item.source).name
                opts.append((k, item, f"{item.name:<15} {list_shape(item)}"
                             + (f"  [{src}]" if src != f"{slug(item.name)}.toml" else "")))
        self.items.update({k: v for k, v, _ in opts})
        sl.clear_options()
        sl.add_options([Selection(plain(label), k, k in keep) for k, _, label in opts])

    def selected_workloads(self) -> list[Workload]:
        out: list[Workload] = []
        for k in self.query_one("#workloads", SelectionList).selected:
            v = self.items.get(k)
            if k.startswith("composite:"):
                out.extend(context_sweep())
            elif v is not None and not isinstance(v, str):
                out.append(v)
        return out

    # ---- validation -----------------------------------------------------------------------------
    def _val(self, fid: str) -> str:
        return self.query_one(f"#{fid}", Input).value.strip()

    def _err(self, fid: str, text: str) -> None:
        show_field_error(self, fid, text)

    # form field id -> SweepSpec field, from the spec's options (Option.form); the spec's own parsers check each
    # one, and its check() the rules across them (one validation path, the CLI's)
    FORM = form_fields()
    FIELDS = ("url", "launch", "variants", "key-env", "concurrency", "rates", "requests", "duration", "warmup", "repeat",
              "slos", "tags", "quality-share")
    IDS = {name: fid for fid, name in FORM.items()}  # SweepSpec field -> form field id

    def _check(self, fid: str) -> tuple[Any, str]:
        """(parsed value, error) of one field on its own, by the parser its option declares. The rules across
        fields are SweepSpec.check's (`validate`)."""
        v = self._val(fid)
        try:
            if fid == "url":
                if self._val("launch"):
                    return v, ""  # a launched server's URL comes from its command
                if not v:
                    return None, "give a URL like http://127.0.0.1:8000 or sim://tiny"
                if v.startswith("sim://"):
                    return v, ""
                from servescope.core.target import normalize_url

                return normalize_url(v), ""
            if fid == "key-env" and (not v or not v.replace("_", "").isalnum()):
                return None, "give an environment variable name, e.g. OPENAI_API_KEY"
            if fid == "warmup" and not v:
                return 0, ""
            if fid == "repeat" and not v:
                return 1, ""
            if fid == "quality-share" and not v:
                return 0.0, ""  # empty: no probe questions in the cells
            return parse_field(self.FORM[fid], v, fid), ""
        except ServescopeError as e:
            return None, e.message

    def validate(self) -> tuple[SweepSpec | None, dict[str, str]]:
        """The sweep the form holds, else None and every error by field id. Each field is read on its own
        first; once all read, the sweep's rules across fields apply (SweepSpec.check, which the CLI and sweep
        files go through too, so the message is theirs), each under the field it names. No workload is under
        "workloads", any other sweep-wide error under "preview"."""
        errors: dict[str, str] = {}
        vals: dict[str, object] = {}
        for f in self.FIELDS:
            vals[f], err = self._check(f)
            if err:
                errors[f] = err
        if errors:
            return None, errors
        form: dict[str, object] = {n: self._val(fid) for fid, n in self.FORM.items()}
        form["warmup"] = form["warmup"] or "0"
        form["repeat"] = form["repeat"] or "1"
        form["quality_share"] = form["quality_share"] or "0"
        # a launched server's URL comes from its command: the URL field is not read then
        form["url"] = "sim://" if self._val("launch") else vals["url"]
        form["workloads"] = self.selected_workloads()  # the exact objects (file workloads: only the selected ones)
        # the app's sweeps stop climbing once past saturation (headless runs ask for it: --stop-after-saturation);
        # a loaded sweep file says for itself (stop_after_saturation = false runs every load)
        spec, by_name = SweepSpec.from_form(form, self.loaded_spec or APP_DEFAULTS)
        if spec is None:
            return None, {("workloads" if name == "workloads" else self.IDS.get(name, "preview")): text
                          for name, text in by_name.items()}
        return spec, {}

    def _show(self, errors: dict[str, str], also: tuple[str, ...] = ()) -> None:
        """validate()'s errors under their fields; those it showed before and no longer finds are cleared, and
        so are the fields in `also` without one (an error set by other means, such as a failed probe, stays)."""
        for f in self.FIELDS:
            if f in errors or f in self._shown or f in also:
                self._err(f, errors.get(f, ""))
        self._shown = {f for f in errors if f in self.FIELDS}

    def collect(self, show: bool = True) -> SweepSpec | None:
        """The sweep as a SweepSpec, or None (with `show`, every error next to its field)."""
        spec, errors = self.validate()
        if show:
            self._show(errors, self.FIELDS)
        self._bad = list(errors)
        if "preview" in errors:
            self.query_one("#preview", Static).update(f"✗ {errors['preview']}")
        return spec

    def update_preview(self, changed: str = "") -> None:
        """The preview line, and the form's errors as they now stand (`changed`: the field just edited)."""
        names = [str(getattr(self.items.get(k), "name", k.split(":", 1)[-1]))
                 for k in self.query_one("#workloads", SelectionList).selected]
        self.query_one("#wl-selected", Static).update(
            f"selected ({len(names)}): {', '.join(names)}" if names else "selected: none (space toggles a workload)")
        sweep, errors = self.validate()
        self._bad = list(errors)
        self._show(errors, (changed,) if changed else ())
        pv = self.query_one("#preview", Static)
        if sweep is None:
            if "workloads" in errors:
                pv.update("✗ pick at least one workload (F7)")
            elif "preview" in errors:
                pv.update(f"✗ {errors['preview']}")
            else:
                pv.update(f"✗ fix: {', '.join(errors)}")
            return
        speed = self.probed.get("speed") if self.probed and self.probed_url == self._val("url") else None
        pv.update(preview_text(sweep, speed))

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        fid = event.input.id or ""
        if fid == "key-env":
            self._key_status()
        if fid == "url":
            self._sim_desc()
        if fid in ("url", "launch") and self.probed is not None and self._val("url") != self.probed_url:
            self.probed = None  # the result was for another target: never show it as this one's
            self.query_one("#probe-result", Static).update(
                f"target changed to {self._val('url') or '(none)'}: not probed yet (F5)")
        if fid in self.FIELDS or fid in self.FORM:
            self.update_preview(fid)

    @on(SelectionList.SelectedChanged)
    def _sel_changed(self) -> None:
        self.update_preview()

    def _key_status(self) -> None:
        name = self._val("key-env")
        val = os.environ.get(name) if name else None
        st = self.query_one("#key-status", Static)
        st.update(f"{name} is set: {mask_key(val)}" if val else f"{name or '(no name)'} is not set: requests go without a key")

    @on(Select.Changed, "#sim-profile")
    def _profile(self, event: Select.Changed) -> None:
        if isinstance(event.value, str):
            self.query_one("#url", Input).value = f"sim://{event.value}"

    def _sim_desc(self) -> None:
        """Under the simulator list: what the URL's simulator profile simulates (empty for a real server)."""
        url = self._val("url")
        prof = url.removeprefix("sim://") if url.startswith("sim://") else ""
        self.query_one("#sim-desc", Static).update(
            f"sim://{prof}: {describe_profile(prof)}" if prof and describe_profile(prof) else "")

    # ---- actions ----------------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        """Show the pane and put the cursor in its first field (so typing goes there at once)."""
        self.query_one(TabbedContent).active = tab
        first = self.query_one(f"#{tab}").query("Input, Select, SelectionList").first()
        first.focus()
        if isinstance(first, SelectionList) and first.highlighted is None and first.option_count:
            first.highlighted = 0  # a visible cursor: space toggles the highlighted workload

    @on(Button.Pressed, "#probe")
    def action_probe(self) -> None:
        if self._val("launch"):  # a bad command is shown under its field
            self.query_one("#probe-result", Static).update(
                "launch target: servescope starts the server when the sweep runs (ctrl+r), waits for /health, then "
                "shows its KV budget and log in the Run screen. Clear `or launch` to probe a running server.")
            return
        url, err = self._check("url")
        key_env, kerr = self._check("key-env")
        self._err("url", err)
        self._err("key-env", kerr)
        if err or kerr:
            self.query_one("#probe-result", Static).update("✗ fix the URL first")
            return
        self.query_one("#probe-result", Static).update(
            f"probing {url}…" + (" (starting the simulator)" if url.startswith("sim://") else ""))
        self._probe(url, key_env)

    @work(thread=True, exclusive=True, group="probe")
    def _probe(self, url: str, key_env: str) -> None:
        try:
            info = probe_target(self.app.sims, url, key_env)  # type: ignore[attr-defined]
            self.post_message(m.TargetProbed(url, info))
        except ServescopeError as e:
            self.post_message(m.TargetProbed(url, None, e.message))
        except Exception as e:
            self.post_message(m.TargetProbed(url, None, f"unexpected {type(e).__name__}: {e}"))

    @on(m.TargetProbed)
    def _probed(self, msg: m.TargetProbed) -> None:
        res = self.query_one("#probe-result", Static)
        if msg.info is None:
            self.probed = None
            res.update(f"✗ {clean_text(msg.error)}")
            self._err("url", clean_text(msg.error))
            self.notify(clean_text(msg.error), title="probe failed", severity="error", timeout=8, markup=False)
            return
        self.probed, self.probed_url = msg.info, msg.url
        i = msg.info
        lines = [f"✓ {i['url']}  vLLM {i['version'] or '? (no /version)'}  "
                 f"/metrics: {'yes' if i['metrics'] else 'no'}"]
        for mid, mml in i["models"]:
            lines.append(f"  model {clean_text(mid)}  max length {mml or '?'}")
        if not i["models"]:
            lines.append("  no models served")
        lines.append("  local GPUs: " + (", ".join(i["gpus"]) if i["gpus"] else "none seen by NVML"))
        if i.get("speed"):
            lines.append(f"  one request alone: TTFT {i['speed']['ttft_ms']:.0f} ms, "
                         f"TPOT {i['speed']['tpot_ms']:.3g} ms/token (the preview's estimate uses it)")
        res.update("\n".join(lines))
        self.update_preview()
        if len(i["models"]) > 1 and not self._val("model"):
            self._err("model", "several models: type the one to benchmark")

    # ---- the quality probe (Quality pane: QualityProbePane) ----------------------------------------------
    @property
    def quality(self) -> QualityProbe | None:
        """The quality probe running (or last run) from the Quality pane."""
        return self.query_one(QualityProbePane).quality

    def quality_target(self) -> tuple[str, str, str | None] | str:
        """The Target pane's server for the quality probe: (URL, API-key variable, model), else why not (the
        Target pane's bad fields marked)."""
        if self._val("launch"):
            return ("✗ the Target pane launches its server only when a sweep runs: give the URL of a running "
                    "server there (clear `or launch`), or give the sweep a quality share")
        url, err = self._check("url")
        key_env, kerr = self._check("key-env")
        model, merr = self._check("model")
        self._err("url", err)
        self._err("key-env", kerr)
        self._err("model", merr)
        if err or kerr or merr:
            return "✗ fix the Target pane first (F6)"
        return url, key_env, model

    @on(Button.Pressed, "#run")
    def action_run_sweep(self) -> None:
        sweep = self.collect()
        if sweep is None:
            self.update_preview()
            self.notify("fix the marked fields first", severity="error", markup=False)
            return
        self.app.start_sweep(sweep)  # type: ignore[attr-defined]

    def _sweep_path(self) -> Path | None:
        p = self._val("sweep-file")
        if not p:
            self._err("sweep-file", f"give the sweep file's path, e.g. {short_path(sweeps_dir() / 'sweep.toml')}")
            return None
        self._err("sweep-file", "")
        return Path(p).expanduser()

    def save_path(self) -> Path:
        """Where ctrl+s offers to save: the sweep file last saved or loaded (the `sweep file` field), else the
        sweeps folder, under the session's name; never the working directory unasked."""
        p = self._val("sweep-file")
        path = Path(p).expanduser() if p else sweeps_dir() / f"{slug(self._val('name') or 'sweep')}.toml"
        return (path if path.suffix else path.with_suffix(".toml")).absolute()

    @on(Button.Pressed, "#save-sweep")
    def action_save_sweep(self) -> None:
        """Ask where (a path to edit: enter saves, esc writes nothing), then write the sweep as it is now."""
        spec = self.collect()
        if spec is None:
            self.notify("fix the marked fields before saving", severity="error", markup=False)
            return
        self.app.push_screen(AskScreen("Save the sweep as TOML (a file already there is replaced)",
                                       str(self.save_path()), label="file"), partial(self._save, spec))

    def _save(self, spec: SweepSpec, answer: str | None) -> None:
        if answer is None:
            return  # esc: nothing written
        if not answer.strip():
            self._err("sweep-file", "give a file name, e.g. sweep.toml")
            self.notify("not saved: no file name", severity="error", markup=False)
            return
        path = Path(answer.strip()).expanduser()
        path = (path if path.suffix else path.with_suffix(".toml")).absolute()
        try:
            spec.save(path)
        except ServescopeError as e:
            self._err("sweep-file", e.message)
            self.notify(e.message, title="not saved", severity="error", markup=False)
            return
        self._err("sweep-file", "")
        self.query_one("#sweep-file", Input).value = str(path)  # ctrl+s offers it again, ctrl+o reads it
        self.notify(f"saved {path}; run it headless with `servescope run --sweep {short_path(path)}`", markup=False)

    @on(Button.Pressed, "#load-sweep")
    def action_load_sweep(self) -> None:
        path = self._sweep_path()
        if path is None:
            return
        try:
            spec = SweepSpec.from_toml(path)
        except ServescopeError as e:
            self._err("sweep-file", e.message)
            self.notify("the sweep file has a problem (see next to the field)", severity="error", markup=False)
            return
        self.apply_sweep(spec)
        self.notify(f"loaded {path}", markup=False)

    def apply_sweep(self, spec: Any) -> None:
        """Fill the form from a SweepSpec; what the form does not show (tokenizer, transport, telemetry,
        timeouts) is kept and applies when the sweep runs or is saved again."""
        def put(fid: str, v: Any) -> None:
            self.query_one(f"#{fid}", Input).value = "" if v is None else str(v)

        self.loaded_spec = spec
        put("launch", spec.launch)
        put("variants", " ; ".join(spec.variants))
        if not spec.launch:
            put("url", spec.url)
        put("key-env", spec.api_key_env)
        put("model", spec.model)
        put("concurrency", ",".join(map(str, spec.concurrency)) if spec.concurrency else None)
        put("rates", ",".join(fmt_num(r) for r in spec.rates) if spec.rates else None)
        put("requests", spec.requests)
        put("duration", fmt_duration(spec.duration_s) if spec.duration_s else None)
        put("warmup", spec.warmup)
        put("repeat", spec.repeat)
        put("slos", ",".join(f"{k}={fmt_num(v)}" for k, v in spec.slos.items()) or None)
        put("tags", ",".join(f"{k}={v}" for k, v in spec.tags.items()))
        put("name", spec.name)
        put("quality-share", fmt_num(spec.quality_share) if spec.quality_share else None)
        extra = [w for w in spec.workloads if w.source not in ("preset", "inline")]
        inline = [w for w in spec.workloads if w.source == "inline"]
        keys: set[str] = set()
        for w in spec.workloads:
            if w.source == "preset":
                keys.add("composite:context-sweep" if w.name.startswith("context-sweep/") else f"preset:{w.name}")
            else:
                keys.add(f"file:{w.source}#{w.name}")
        self._fill_workloads(selected=keys, extra=extra + inline)
        self.update_preview()

    @on(Button.Pressed, "#wl-new")
    def action_new_workload(self) -> None:
        def done(w: Any) -> None:
            if w is not None:
                sel = set(self.query_one("#workloads", SelectionList).selected) | {f"file:{w.source}#{w.name}"}
                self._fill_workloads(selected=sel, extra=[w])
                self.update_preview()
                self.notify(f"saved workload {w.name} to {w.source}", markup=False)

        self.app.push_screen(WorkloadFormScreen(self.workloads_folder), done)

    @on(Button.Pressed, "#wl-add")
    @on(Input.Submitted, "#wl-file")
    def _add_file(self) -> None:
        p = self._val("wl-file")
        if not p:
            self._err("wl-file", "give the path of a workload TOML file")
            return
        try:
            ws = load_toml(Path(p).expanduser())
        except ServescopeError as e:
            self._err("wl-file", e.message)
            return
        self._err("wl-file", "")
        sel = set(self.query_one("#workloads", SelectionList).selected) | {f"file:{w.source}#{w.name}" for w in ws}
        self._fill_workloads(selected=sel, extra=ws)
        self.update_preview()
        self.notify(f"added {len(ws)} workload(s) from {p}", markup=False)


def _mean(d: Any) -> float:
    if d.dist == "fixed":
        return float(d.value)
    if d.dist == "uniform":
        return float(d.min + d.max) / 2
    return float(d.mean)


def rough_cell_s(w: Any, conc: int | None, rate: float | None, requests: int | None, duration_s: float | None,
                 warmup: int, tpot_ms: float = ASSUMED_TPOT_MS, times: tuple[float, ...] = ()) -> float:
    """A cell's duration, roughly. A trace cell lasts as long as its (scaled) trace up to the last request it
    sends, plus that request; a conversation's requests are its turns, one after another per user, each after
    its think time; the rest: requests / users x one request's time (or requests / rate)."""
    if w.kind == "trace":
        from servescope.workloads.traces import cached_trace

        try:
            t = cached_trace(w.trace, w.trace_format)
        except ServescopeError:
            return 0.0
        n = len(times) if requests is None else min(requests, len(times))
        reqs = t.requests[:n] or t.requests
        inp = sum(r.input_tokens for r in reqs) / max(1, len(reqs))
        out = sum(r.output_tokens for r in reqs) / max(1, len(reqs))
        last = times[n - 1] if n and n <= len(times) else (times[-1] if times else 0.0)
        end = last + inp / ASSUMED_PREFILL_TOK_S + out * tpot_ms / 1000
        return min(end, duration_s) if duration_s else end
    inp = _mean(w.input_tokens)
    out = _mean(w.output_tokens) * (2 if w.thinking else 1)
    e2e = inp / ASSUMED_PREFILL_TOK_S + out * tpot_ms / 1000  # a later turn's history is mostly a cached prefix
    if w.multi_turn:
        rounds = max(1.0, _mean(w.rounds))
        e2e += _mean(w.think_time_s) * (rounds - 1) / rounds  # each later turn waits its think time first
    if duration_s is not None and requests is None:
        return duration_s + e2e
    n = (requests or 100) + warmup
    if rate and w.multi_turn:  # a rate starts conversations: n turns make n / turns of them, each turns long
        rounds = max(1.0, _mean(w.rounds))
        est = n / rounds / rate + rounds * e2e
    else:
        est = n / rate + e2e if rate else n / max(1, conc or 1) * e2e
    return min(est, duration_s + e2e) if duration_s else est


APP_DEFAULTS = SweepSpec().replace(stop_after_saturation=True)  # where the app's Compose differs from `run`


def preview_text(spec: Any, speed: dict[str, float] | None = None) -> str:
    """The grid, its requests and a duration estimate: from the TPOT the probe measured on this target
    (`speed`), else a guess (at ASSUMED_TPOT_MS) that says so. A trace is one cell (its own times, not the load
    levels); a conversation's requests are its turns; a quality share adds its probe questions."""
    from servescope.engine.runner import plan_cells

    try:
        cells = plan_cells(spec)
    except ServescopeError as e:  # a trace file that went bad since it was added
        return f"✗ {e.message}"
    reqs = sum((c.requests or 0) + c.warmup for c in cells)
    tpot = float(speed["tpot_ms"]) if speed and speed.get("tpot_ms") else None
    secs = sum(rough_cell_s(c.workload, c.load.concurrency, c.load.rate, c.requests, c.duration_s, c.warmup,
                            tpot if tpot is not None else ASSUMED_TPOT_MS, tuple(c.load.times or ()))
               for c in cells)
    basis = f"at {tpot:.3g} ms/token, probed" if tpot is not None else "guess: F5 measures"
    nv = max(1, len({c.variant for c in cells}))
    traces = {c.workload.name for c in cells if c.workload.kind == "trace"}
    grid_cells = [c for c in cells if c.workload.kind != "trace"]
    nw = len({c.workload.name for c in grid_cells})
    nl = len(grid_cells) // max(1, nw * nv)
    dur = f"{secs / 60:.0f} min" if secs >= 120 else f"{secs:.0f} s"
    multi = any(c.workload.multi_turn for c in cells)
    req_text = (f"{reqs} requests" + (" (turns)" if multi else "")) if reqs else "duration-limited"
    if spec.quality_share:  # the mixer keeps probe questions near this share of each cell's requests
        req_text += f" + ~{spec.quality_share * 100:g}% quality probes"
    slo = ",".join(f"{k}={v:g}" for k, v in spec.slos.items())
    grid = (f"{nw} workload{'s' if nw != 1 else ''} x {nl} load level{'s' if nl != 1 else ''}" if grid_cells else "")
    if traces:
        replay = f"{len(traces)} trace replay{'s' if len(traces) != 1 else ''}"
        grid = f"{grid} + {replay}" if grid else replay
    # two lines: the grid, its requests and time (two rows beside the Run button at 80 columns), then the target
    return (grid + (f" x {nv} server variants" if nv > 1 else "") + " = "
            f"{len(cells)} cells, {req_text}, ~{dur} ({basis})\n"
            + (f"launch {spec.target_text}" if spec.launch else f"target {spec.url}")
            + (f", SLOs {slo}" if slo else "")
            + (f", tags {', '.join(f'{k}={v}' for k, v in spec.tags.items())}" if spec.tags else ""))
