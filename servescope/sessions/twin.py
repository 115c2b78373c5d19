"""The twin a session holds, as stored data for reports: SESSION/twin/profile.toml's [fit] table (what was fitted,
from where, the residuals and the measured range) and SESSION/twin/confirm.jsonl (each predicted cell that was
later run for real: predicted, measured and the error per figure). Written by `servescope.engine.twin` and
`servescope.engine.whatif`; read here, without the engine, for `servescope report`."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text, md_escape
from servescope.sessions.store import Session

TWIN_DIR = "twin"
PROFILE_FILE = "profile.toml"
CONFIRM_FILE = "confirm.jsonl"
FIGURE_LABELS = {"output_tok_s": "output tok/s", "ttft_ms.p50": "TTFT p50 ms", "tpot_ms.p50": "TPOT p50 ms"}
FIT_LABELS = {**FIGURE_LABELS, "ttft_ms.mean": "TTFT mean ms", "tpot_ms.mean": "TPOT mean ms"}


@dataclass
class TwinRecord:
    """The files as read: each key is checked where the report reads it (a twin from another version may
    lack some, or hold others)."""

    fit: dict[str, object]
    efficiency: dict[str, object]
    confirmations: list[dict[str, object]] = field(default_factory=list)


def twin_record(session: Session) -> TwinRecord | None:
    """The session's twin, None when it has none; a damaged file is a one-line ServescopeError."""
    d = session.path / TWIN_DIR
    prof = d / PROFILE_FILE
    if not prof.is_file():
        return None
    try:
        data = tomllib.loads(prof.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ServescopeError(f"{prof}: cannot read the twin ({clean_text(str(e))}); delete it and run "
                              f"`servescope twin fit {session.path}` again") from None
    fit = _table(data.get("fit"))
    eff = _table(data.get("efficiency"))
    rows: list[dict[str, object]] = []
    conf = d / CONFIRM_FILE
    if conf.is_file():
        for i, line in enumerate(conf.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ServescopeError(f"{conf}:{i}: not a JSON line; the file is damaged: delete the line") from None
            if isinstance(row, dict):
                rows.append(_table(row))
    return TwinRecord(fit, eff, rows)


def _table(v: object) -> dict[str, object]:
    return {str(k): x for k, x in v.items()} if isinstance(v, Mapping) else {}


def _list(v: object) -> list[object]:
    return v if isinstance(v, list) else []


def _pct(v: object) -> str:
    return f"{v:+.1%}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _num(v: object) -> str:
    return f"{v:,.4g}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def twin_section(rec: TwinRecord, level: int = 2) -> list[str]:
    """The report's section on the twin: how it was fitted and its track record."""
    h = "#" * level
    f = rec.fit
    out = [f"{h} Capacity twin", "",
           "A simulator fitted to this session (`servescope twin fit`): the model's shape from "
           f"{md_escape(clean_text(str(f.get('shape_from', '?'))))}; the KV cache from "
           f"{md_escape(clean_text(str(f.get('kv_from', '?'))))}; limits from "
           f"{md_escape(clean_text(str(f.get('limits_from', '?'))))}. Fitted: "
           + ", ".join(f"{md_escape(str(k))} {_num(rec.efficiency.get(str(k)))}" for k in _list(f.get("fitted")))
           + ".", ""]
    res = _table(f.get("residual_rms_ln"))
    if res:
        out += ["Fit residual (root mean square of ln(twin / measured) over the fitted cells): "
                + ", ".join(f"{FIT_LABELS.get(k, md_escape(str(k)))} {v:.1%}" for k, v in res.items()
                            if isinstance(v, (int, float))) + ".", ""]
    out += [f"Warning: {md_escape(clean_text(str(w)))}" + "\n" for w in _list(f.get("warnings"))]
    rng = _table(f.get("range"))
    if rng:
        out += ["Measured range (predictions outside it are extrapolations): "
                + ", ".join(f"{md_escape(str(k).replace('_', ' '))} {_num(v[0])}-{_num(v[1])}" for k, v in rng.items()
                            if isinstance(v, list) and len(v) == 2) + ".", ""]
    if rec.confirmations:
        out += [f"{h}# Track record: predictions later run for real (`whatif --confirm`)", "",
                "| when | workload | load | settings | figure | predicted | measured | error |",
                "|---|---|---|---|---|---|---|---|"]
        for r in rec.confirmations:
            load = f"c={r.get('concurrency')}" if r.get("concurrency") else f"{r.get('rate')} req/s"
            for k, label in FIGURE_LABELS.items():
                p, m, e = (_table(r.get(x)).get(k) for x in ("predicted", "measured", "error"))
                out.append(f"| {md_escape(str(r.get('at', '')))} | {md_escape(clean_text(str(r.get('workload', ''))))} | "
                           f"{load} | {md_escape(clean_text(str(r.get('settings', ''))))} | {label} | {_num(p)} | "
                           f"{_num(m)} | {_pct(e)} |")
        errs = [abs(e) for r in rec.confirmations for e in _table(r.get("error")).values()
                if isinstance(e, (int, float)) and math.isfinite(e)]
        if errs:
            errs.sort()
            out += ["", f"Error = predicted / measured - 1; median |error| {errs[len(errs) // 2]:.1%}, largest "
                        f"{errs[-1]:.1%} over {len(errs)} figures."]
        out.append("")
    return out
