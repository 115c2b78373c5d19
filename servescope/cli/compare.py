"""`servescope sessions | compare | report | import | export`: argparse wiring over servescope.sessions.

Each `add_*_args(p)` fills a subparser; each `*_command(args) -> int` runs it. Setup problems raise
ServescopeError (the CLI prints its one line and exits 2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypedDict

from servescope.cli.common import parse_tags, resolve_session
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine import fields
from servescope.reports.compare_doc import comparison_markdown
from servescope.reports.figures_svg import require_plots
from servescope.reports.gate_doc import gate_markdown
from servescope.reports.htmlreport import (
    compare_html,
    compare_markdown,
    compare_parts,
    report_html,
    report_markdown,
    report_parts,
)
from servescope.reports.report import render_report
from servescope.sessions.compare import compare_sessions
from servescope.sessions.gate import (
    gate,
    is_baseline_file,
    load_baseline,
    parse_allow_mismatch,
    parse_fail_on,
    save_baseline,
)
from servescope.sessions.importers import import_files
from servescope.sessions.llmd import DEFAULT_SCHEMA, export_reports
from servescope.sessions.provenance import measured_by
from servescope.sessions.quality import quality_brief
from servescope.sessions.store import load_session, scan_sessions, sessions_home
from servescope.sessions.views import cell_counts, status_text

if TYPE_CHECKING:
    from servescope.core.quality import QualitySummary
    from servescope.reports.figures import FigureSpec


def _base(args: argparse.Namespace) -> Path:
    d = getattr(args, "sessions_dir", None)
    return Path(d).expanduser() if d else sessions_home()


def short_ids(dirs: list[Path]) -> dict[Path, str]:
    """The shortest prefix (at least 15 characters: the date and time) naming each directory uniquely."""
    names = [d.name for d in dirs]
    out = {}
    for d in dirs:
        n = min(15, len(d.name))
        while n < len(d.name) and sum(1 for x in names if x.startswith(d.name[:n])) > 1:
            n += 1
        out[d] = d.name[:n]
    return out


def _slos(args: argparse.Namespace) -> dict[str, float] | None:
    """--slo, read by the one SLO parser of every command (`run`'s, a sweep file's and the app's): None when
    not given; an empty, unknown, non-positive or NaN one is an error."""
    raw = getattr(args, "slo", None)
    return None if raw is None else fields.slos(raw, "--slo")


def _write(text: str, out: str | None, what: str) -> None:
    if not out or out == "-":
        sys.stdout.write(text)
        return
    p = Path(out).expanduser()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ServescopeError(f"cannot write {p}: {e.strerror}; choose another -o path") from None
    print(f"{what} written to {p}", file=sys.stderr)


class SessionRow(TypedDict, total=False):
    """One session of `sessions --json`; a broken one has its id, dir, status and `broken` only."""

    id: Required[str]
    dir: Required[str]
    name: str
    status: Required[str]
    broken: str
    status_text: str
    model: str
    workloads: list[str]
    cells: int
    cells_done: int
    cells_planned: int
    tags: dict[str, str]
    target: str
    started_at: str
    kind: str
    quality: QualitySummary
    quality_text: str
    quality_broken: str
    pid: int | None
    reason: str


def _add_quality(row: SessionRow, s: Any) -> None:
    """A listed session's quality results: "quality" (the Contract's summary) and "quality_text" (a few words),
    or "quality_broken" (why) for a quality.json that cannot be read; nothing when it holds none."""
    if not s.has_quality:
        return
    try:
        q = s.quality()
    except ServescopeError as e:
        row["quality_broken"] = e.message
        return
    if q is not None:
        row["quality"], row["quality_text"] = q.summary(), quality_brief(q)


NAME_WIDTH = 24  # `servescope sessions` cuts a longer session name with an ellipsis


def sessions_command(args: argparse.Namespace) -> int:
    """List the sessions; a damaged one is listed as `broken: <reason>` (it never hides the others). A quality
    probe's session (kind quality) has no cells: its quality in a few words stands in the workloads column."""
    import json

    base = _base(args)
    entries = scan_sessions(base)
    ids = short_ids([e.path for e in entries])
    rows: list[SessionRow] = []
    for e in entries:
        d, s = e.path, e.session
        if s is None:
            rows.append({"id": ids[d], "dir": str(d), "status": "broken", "broken": clean_text((e.broken or "?").replace(f"{d}/", ""))})
            continue
        m = s.info
        rows.append({
            "id": ids[d], "dir": str(d), "name": clean_text(m.name or ""), "status": s.status,
            "status_text": status_text(s),
            "model": clean_text(m.model),
            "workloads": sorted({clean_text(str(w)) for w in (s.cells["workload"].to_list()
                                                              if "workload" in s.cells.columns else
                                                              [c.workload for c in m.cells if c.workload])}),
            "cells": s.cells.height,
            "cells_done": (counts := cell_counts(s))[0], "cells_planned": counts[1],
            "tags": {str(k): clean_text(str(v)) for k, v in m.tags.items()},
            "target": clean_text(m.target.url),
            "started_at": clean_text(m.started_at or ""),
            "kind": clean_text(m.kind),
        })
        _add_quality(rows[-1], s)
        if s.status == "running":
            rows[-1]["pid"] = s.runner.pid
        elif s.info.status == "running":  # it says running, but its runner is gone
            rows[-1]["reason"] = clean_text(s.runner.reason)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no sessions in {base}")
        return 0
    w = max(len(r["id"]) for r in rows)
    sw = max([11] + [len(r["status_text"]) for r in rows if "status_text" in r])
    nw = min(NAME_WIDTH, max([4] + [len(r.get("name", "")) for r in rows]))  # `api` and `gpu-box` told apart
    print(f"{'id':<{w}}  {'name':<{nw}}  {'status':<{sw}} {'model':<26} {'cells':>5}   {'workloads':<26} "
          "tags / target")
    for r in rows:
        if "broken" in r:
            print(f"{r['id']:<{w}}  {'':<{nw}}  broken: {r['broken']}")
            continue
        name = r.get("name", "") or "-"
        name = name if len(name) <= nw else name[:nw - 1] + "…"
        model = r["model"].rstrip("/").split("/")[-1][:26]
        tags = " ".join(f"{k}={v}" for k, v in r["tags"].items())
        wl = ",".join(r["workloads"])
        q = r.get("quality_text") or ("damaged" if "quality_broken" in r else "")
        if r["kind"] == "quality" and not r["cells_planned"]:
            cells, wl = f"{'-':>3} {'':<3}", f"quality: {q or 'no results'}"
        else:
            cells, wl = f"{r['cells_done']:>3}/{r['cells_planned']:<3}", ("+quality " if q else "") + wl
        wl = wl if len(wl) <= 26 else wl[:25] + "…"
        print(f"{r['id']:<{w}}  {name:<{nw}}  {r['status_text']:<{sw}} {model:<26} {cells} "
              f"{wl:<26} "
              f"{tags + '  ' if tags else ''}{r['target']}")
    broken = sum(1 for r in rows if "broken" in r)
    print(f"({len(rows)} sessions in {base}"
          + (f", {broken} broken (they open again once the named file is restored)" if broken else "")
          + "; name one by its id or directory)")
    return 0


# the parser is built on every start: these mirror servescope.sessions.stats / gate without importing polars
# (tests/sessions/test_significance.py checks that they agree)


def compare_command(args: argparse.Namespace) -> int:
    import json

    if len(args.sessions) < 2:
        raise ServescopeError("compare needs at least two sessions (ids or directories); see `servescope sessions`")
    slos = _slos(args)
    base = Path(args.sessions_dir).expanduser() if args.sessions_dir else None
    sessions = [resolve_session(r, base) for r in args.sessions]
    check_comparable(args.sessions, sessions)
    _check_label(args)
    fmt = getattr(args, "format", None) or ("json" if args.json else "md")
    if args.json and fmt != "json":
        raise ServescopeError(f"--json and --format {fmt} ask for two formats: give one of them")
    figures = _figures_dir(args, fmt)
    if fmt == "html" or figures is not None:
        require_plots()  # before the work: one line on how to install matplotlib
        progress = _Progress("compare")
        comp, reps = compare_parts(sessions, label_key=args.label, slos=slos, min_effect=args.min_effect,
                                   include_bound=args.include_bound)
        text = (compare_html(comp, reps, progress=progress) if fmt == "html" else
                compare_markdown(comp, figures or Path("."), _out_path(args.output), reps, progress=progress))
        progress.done()
        _write(text, args.output, "comparison")
        return 0
    comp = compare_sessions(sessions, label_key=args.label, slos=slos, min_effect=args.min_effect,
                            include_bound=args.include_bound)
    text = json.dumps(comp.to_dict(), indent=2, default=str) + "\n" if fmt == "json" else comparison_markdown(comp)
    _write(text, args.output, "comparison")
    return 0


class _Progress:
    """What `report`/`compare` with figures is doing, on stderr (never stdout: the report may go there): one line
    as the work starts, one per figure as it is drawn (`figure 3 of 12: chat latency`), and the time it took."""

    def __init__(self, command: str) -> None:
        import time

        self.command = command
        self.started = time.monotonic()
        self.figures = 0
        self._say("reading the sessions and building the report")

    def _say(self, text: str) -> None:
        print(f"servescope {self.command}: {text}", file=sys.stderr, flush=True)

    def __call__(self, done: int, total: int, spec: FigureSpec) -> None:
        self.figures = total
        self._say(f"drawing figure {done + 1} of {total}: {clean_text(spec.title)}")

    def done(self) -> None:
        import time

        self._say(f"{self.figures} figure{'s' if self.figures != 1 else ''} drawn; done in "
                  f"{time.monotonic() - self.started:.1f} s")


def check_comparable(refs: list[str], sessions: list[Any]) -> None:
    """Sessions that can be compared, before any work: never one session twice (`compare A A` compared a session
    with itself and called every figure within noise), and never a quality probe's session (quality results, no
    speed cells) against one holding no quality results: they share nothing to compare."""
    seen: dict[Path, str] = {}
    for ref, s in zip(refs, sessions, strict=True):
        p = Path(s.path).resolve()
        if p in seen:
            what = f"{ref} is given twice" if seen[p] == ref else f"{seen[p]} and {ref} are the same session ({s.path})"
            raise ServescopeError(f"{what}; compare two different sessions (see `servescope sessions`)")
        seen[p] = ref
    probes = [s for s in sessions if s.cells.height == 0 and s.has_quality]
    bare = [s for s in sessions if not _holds_quality(s)]
    if probes and bare:
        q, r = probes[0].path, bare[0].path
        raise ServescopeError(f"{q.name} is a quality session (quality results, no speed cells) and {r.name} holds no "
                              f"quality results: they have nothing in common to compare; compare {q.name} with "
                              f"another quality session, or add quality results to the sweep's session with "
                              f"`servescope quality --url URL --save {r}` (its server's URL) and compare again")


def _holds_quality(s: Any) -> bool:
    """Quality results of the probe (quality.json) or of cells that mixed probe questions in (--quality-share)."""
    return bool(s.has_quality or any(c is not None and c.quality is not None for c in s.summaries()))


def _check_label(args: argparse.Namespace) -> None:
    if getattr(args, "label", None) is not None and not args.label.strip():
        raise ServescopeError("--label: empty; give a tag key such as quant (or leave the flag out to label "
                              "sessions by name)")


def _figures_dir(args: argparse.Namespace, fmt: str) -> Path | None:
    """--figures DIR (Markdown only: the HTML has its figures inline); given empty, it is an error."""
    d = getattr(args, "figures", None)
    if d is not None and not d.strip():
        raise ServescopeError("--figures: empty; give the directory the figure files go to (or leave the flag out "
                              "for Mermaid charts)")
    if not d:
        return None
    if fmt != "md":
        raise ServescopeError(f"--figures writes figure files for a Markdown report; --format {fmt} "
                              + ("has its figures inline: leave --figures out" if fmt == "html" else
                                 "has no figures: use --format md or html"))
    return Path(d).expanduser()


def _out_path(out: str | None) -> Path | None:
    return Path(out).expanduser() if out and out != "-" else None


def gate_command(args: argparse.Namespace) -> int:
    """0: no significant regression beyond a threshold; 1: one at least (the line names it); 2: bad input
    (raised as ServescopeError)."""
    import json
    import tempfile

    refs = list(args.sessions)
    slos = _slos(args)
    if len(refs) > 2:
        raise ServescopeError("gate takes two sessions, BASELINE CANDIDATE (the baseline may be a baseline file)")
    base = Path(args.sessions_dir).expanduser() if args.sessions_dir else None
    if len(refs) == 1:
        if not args.save_baseline:
            raise ServescopeError('gate needs BASELINE CANDIDATE, e.g. servescope gate base.json SESSION --fail-on '
                                  '"output_tok_s:-5%"; or one SESSION with --save-baseline FILE')
        n = save_baseline(resolve_session(refs[0], base), Path(args.save_baseline).expanduser())
        print(f"baseline written to {args.save_baseline} ({n:,} bytes)", file=sys.stderr)
        return 0
    thresholds = parse_fail_on(args.fail_on)
    allow = parse_allow_mismatch(args.allow_mismatch)
    with tempfile.TemporaryDirectory(prefix="servescope-gate-") as tmp:
        if is_baseline_file(refs[0]):
            baseline = load_baseline(Path(refs[0]).expanduser(), Path(tmp))
            base_name = f"{Path(refs[0]).name} (baseline file of {baseline.path.name.removeprefix('baseline-')})"
        else:
            baseline = resolve_session(refs[0], base)
            base_name = baseline.path.name
        candidate = resolve_session(refs[1], base)
        result = gate(baseline, candidate, thresholds, min_effect=args.min_effect, slos=slos, allow=allow,
                      names=(base_name, candidate.path.name))
        if args.save_baseline:
            save_baseline(candidate, Path(args.save_baseline).expanduser())
    md = gate_markdown(result)
    if args.markdown:
        _write(md, args.markdown, "gate summary")
    if args.json:
        print(f"servescope gate: {result.line()}", file=sys.stderr)
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    else:
        print(f"servescope gate: {result.line()}")
        if not args.markdown:
            sys.stdout.write("\n" + md)
    return result.exit_code


def report_command(args: argparse.Namespace) -> int:
    slos = _slos(args)
    base = Path(args.sessions_dir).expanduser() if args.sessions_dir else None
    main = resolve_session(args.session, base)
    others = [resolve_session(r, base) for r in args.compare]
    if others:
        check_comparable([args.session, *args.compare], [main, *others])
    _check_label(args)
    figures = _figures_dir(args, args.format)
    if args.format == "html" or figures is not None:
        require_plots()
        progress = _Progress("report")
        parts = report_parts(main, others, slos=slos, label_key=args.label, include_bound=args.include_bound)
        text = (report_html(parts, progress=progress) if args.format == "html" else
                report_markdown(parts, figures or Path("."), _out_path(args.output), progress=progress))
        progress.done()
        _write(text, args.output, "report")
        return 0
    text = render_report(main, others, fmt=args.format, slos=slos, label_key=args.label,
                         include_bound=args.include_bound)
    _write(text, args.output, "report")
    return 0


def import_command(args: argparse.Namespace) -> int:
    path = import_files(args.files, sessions_dir=Path(args.sessions_dir).expanduser() if args.sessions_dir else None,
                        save=Path(args.save).expanduser() if args.save else None, name=args.name,
                        workload=args.workload, tags=parse_tags(args.tag), fmt=args.from_)
    s = load_session(path)
    src = measured_by(s.info)
    print(f"imported {s.cells.height} cell(s) from {clean_text(src.tool_name)} as session {path}")
    print("per-request data: " + ("yes (every metric recomputed with servescope's formulas)" if src.rebuilt else
                                  "no (the tool's aggregates only" + ("; rerun vllm bench serve with --save-detailed)"
                                                                      if src.tool == "vllm-bench" else ")")))
    print(f"token counts: {clean_text(src.token_basis)}")
    print("this import lacks:")
    for k, v in src.lacks.items():
        print(f"  {k}: {clean_text(v)}")
    return 0


def export_command(args: argparse.Namespace) -> int:
    """`servescope export SESSION --format llmd-report [--llmd-schema 0.1|0.2] -o DIR`: one report per cell (schema
    0.1 by default), every file built before any is written."""
    if args.llmd_schema is not None and args.format != "llmd-report":
        raise ServescopeError(f"--llmd-schema applies only to --format llmd-report, not {args.format}; leave it out")
    if not args.output.strip():
        raise ServescopeError("-o: empty; give the folder the reports go to")
    base = Path(args.sessions_dir).expanduser() if args.sessions_dir else None
    s = resolve_session(args.session, base)
    written = export_reports(s, Path(args.output).expanduser(), args.llmd_schema or DEFAULT_SCHEMA)
    for p in written:
        print(p)
    print(f"{len(written)} llm-d benchmark report(s) written to {Path(args.output).expanduser()} (schema "
          f"{args.llmd_schema or DEFAULT_SCHEMA})", file=sys.stderr)
    return 0
