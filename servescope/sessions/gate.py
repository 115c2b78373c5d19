"""`servescope gate`: fail a pull request (exit 1) when a named figure regresses beyond its threshold *and* the
regression is beyond noise.

- `--fail-on "output_tok_s:-5%,ttft_ms.p99:+10%"`: a figure (a rate such as `output_tok_s` or
  `goodput_req_s`, a token mean, or a distribution statistic such as `ttft_ms.p99`) and a signed threshold in
  percent: `-5%` fails when the figure drops by more than 5%, `+10%` when it rises by more than 10%.
- A cell (matched by workload and load, as `compare` matches them) fails a threshold when its delta is beyond
  it and the delta's 95% bootstrap interval lies wholly on that side of 0 (and |delta| is at least the
  minimum effect): servescope.sessions.stats.
- Sessions that measured differently (servescope.sessions.compare.mismatches, for every figure; and, for the
  figures they touch, the definitions of another tool's session: servescope.sessions.comparability) are not gated:
  bad input, unless `--allow-mismatch` names what may differ.
- A baseline is a session (directory or id) or a baseline file written by `--save-baseline FILE`
  (`BASELINE_FORMAT`, below): the session's metadata, its cell table and its measured requests, so every
  interval is computed as from the session itself.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import polars as pl

from servescope import __version__
from servescope.core.errors import ServescopeError, error_text
from servescope.core.metrics import REQUEST_SCHEMA
from servescope.core.textsafe import clean_text
from servescope.sessions.comparability import FACTS
from servescope.sessions.compare import Comparison, MetricSpec, compare_sessions, fmt_pct, interval_pct
from servescope.sessions.stats import CONFIDENCE, MIN_EFFECT_PCT, Judgement, Verdict, figure_problem
from servescope.sessions.store import Session, load_session, toml_clean

__all__ = ["BASELINE_FORMAT", "EXAMPLE", "MISMATCH_NAMES", "GateResult", "GateRow", "Threshold", "gate",
           "load_baseline", "parse_allow_mismatch", "parse_fail_on", "save_baseline"]

EXAMPLE = "output_tok_s:-5%,ttft_ms.p99:+10%"
BASELINE_FORMAT = 1
_ITEM = re.compile(r"^(?P<figure>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?):(?P<limit>[+-]\d+(?:\.\d+)?)%$")

# what --allow-mismatch accepts -> the fact names compare reports (cli/args.py's help lists the keys)
MISMATCH_NAMES: dict[str, tuple[str, ...]] = {
    "servescope_version": ("servescope version",), "warmup": ("warmup",), "max_model_len": ("max model length",),
    "tokenizer": ("tokenizer",), "host": ("client host",), "lengths": ("input tokens", "output tokens"),
    # another tool's session (sessions/comparability.py's facts)
    **{f.key: (f.label,) for f in FACTS if f.figures or f.percentiles},  # the facts that leave figures unjudged
}


@dataclass(frozen=True)
class Threshold:
    figure: str
    limit_pct: float  # signed: -5 fails on a drop of more than 5%, +10 on a rise of more than 10%

    @property
    def direction(self) -> str:
        return "up" if self.limit_pct > 0 else "down"

    @property
    def text(self) -> str:
        return f"{self.figure}:{self.limit_pct:+g}%"

    def beyond(self, delta: float) -> bool:
        return delta > self.limit_pct if self.limit_pct > 0 else delta < self.limit_pct


def parse_fail_on(text: str | None) -> list[Threshold]:
    """'output_tok_s:-5%,ttft_ms.p99:+10%' -> thresholds; a ServescopeError naming the bad part otherwise."""
    if not text or not text.strip():
        raise ServescopeError(f'--fail-on is empty; name figures and signed thresholds, e.g. --fail-on "{EXAMPLE}"')
    out: list[Threshold] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        m = _ITEM.match(item)
        if m is None:
            raise ServescopeError(f"bad --fail-on item {clean_text(item)!r}: write FIGURE:+N% or FIGURE:-N% (a sign "
                                  f'and a percent), e.g. --fail-on "{EXAMPLE}"')
        fig, limit = m.group("figure"), float(m.group("limit"))
        why = figure_problem(fig)
        if why is not None:
            raise ServescopeError(f"bad --fail-on item {clean_text(item)!r}: {clean_text(why)}; figures are rates "
                                  "(output_tok_s, total_tok_s, request_s, goodput_req_s), token means "
                                  "(input_tokens_mean, output_tokens_mean) or a distribution's mean/p50/p90/p95/p99 "
                                  f'(ttft_ms.p99, tpot_ms.p50, itl_ms.p99, ...), e.g. --fail-on "{EXAMPLE}"')
        if limit == 0:
            raise ServescopeError(f"bad --fail-on item {clean_text(item)!r}: a threshold of 0% fails on any "
                                  f'significant change; give a size, e.g. --fail-on "{EXAMPLE}"')
        out.append(Threshold(fig, limit))
    if not out:
        raise ServescopeError(f'--fail-on names no figure; e.g. --fail-on "{EXAMPLE}"')
    return out


def _mismatch_fact(line: str) -> set[str]:
    """The fact names (compare's) a line of Comparison.mismatches is about: `warmup: a 8, b 0` -> {"warmup"};
    `chat: mean measured input tokens differ ...` -> {"input tokens"}."""
    head, _, rest = line.partition(": ")
    for what in ("input", "output"):
        if rest.startswith(f"mean measured {what} tokens"):
            return {f"{what} tokens"}
    return {head}


def parse_allow_mismatch(text: str | None) -> set[str]:
    """'host,servescope_version' -> the fact names compare uses; 'all' allows every one."""
    if not text:
        return set()
    out: set[str] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "all":
            out |= {n for names in MISMATCH_NAMES.values() for n in names}
        elif part in MISMATCH_NAMES:
            out |= set(MISMATCH_NAMES[part])
        else:
            raise ServescopeError(f"bad --allow-mismatch item {clean_text(part)!r}: use all or any of "
                                  f"{', '.join(MISMATCH_NAMES)}, e.g. --allow-mismatch host,servescope_version")
    return out


class GateRowDict(TypedDict):
    """A judged figure in `servescope gate --json`."""

    workload: str
    load: str
    figure: str
    threshold_pct: float
    baseline: float | None
    candidate: float | None
    delta_pct: float | None
    ci: list[float] | None
    verdict: Verdict | None
    failed: bool


class ThresholdDict(TypedDict):
    figure: str
    limit_pct: float


class GateDict(TypedDict):
    """`servescope gate --json`."""

    servescope_version: str
    exit_code: int
    result: str
    line: str
    baseline: str
    candidate: str
    thresholds: list[ThresholdDict]
    confidence: float
    min_effect_pct: float
    interval: str
    mismatches_allowed: list[str]
    only_in: list[str]
    rows: list[GateRowDict]
    failures: list[GateRowDict]


@dataclass
class GateRow:
    workload: str
    load: str
    threshold: Threshold
    baseline: float | None
    candidate: float | None
    judgement: Judgement
    failed: bool

    def to_dict(self) -> GateRowDict:
        j = self.judgement
        return {"workload": self.workload, "load": self.load, "figure": self.threshold.figure,
                "threshold_pct": self.threshold.limit_pct, "baseline": self.baseline, "candidate": self.candidate,
                "delta_pct": j.delta_pct, "ci": [j.ci[0], j.ci[1]] if j.ci is not None else None,
                "verdict": j.verdict, "failed": self.failed}

    def text(self) -> str:
        """'output_tok_s at sharegpt c=4: -8.1% [-10.2, -6.0] worse (threshold -5%)'."""
        j = self.judgement
        ci = f" {interval_pct(j.ci)}" if j.ci is not None else " (no interval)"
        return (f"{self.threshold.figure} at {self.workload} {self.load}: {fmt_pct(j.delta_pct)}{ci} "
                f"{j.verdict or 'not judged'} (threshold {self.threshold.limit_pct:+g}%)")


@dataclass
class GateResult:
    baseline: str  # label (and where from)
    candidate: str
    thresholds: list[Threshold]
    rows: list[GateRow]
    min_effect: float
    interval: str
    mismatches: list[str] = field(default_factory=list)  # allowed ones (a refused one raised)
    only_in: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateRow]:
        return [r for r in self.rows if r.failed]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0

    def line(self) -> str:
        """The one line a CI log shows: which figure failed (the worst first), or that none did."""
        fails = sorted(self.failures, key=lambda r: -abs(r.judgement.delta_pct or 0.0))
        if fails:
            more = f" (and {len(fails) - 1} more)" if len(fails) > 1 else ""
            return f"FAIL: {fails[0].text()}, beyond noise{more}"
        cells = len({(r.workload, r.load) for r in self.rows})
        return (f"PASS: no significant regression beyond {', '.join(t.text for t in self.thresholds)} "
                f"over {cells} common cell{'s' if cells != 1 else ''}")

    def to_dict(self) -> GateDict:
        return {"servescope_version": __version__, "exit_code": self.exit_code,
                "result": "fail" if self.failures else "pass", "line": self.line(),
                "baseline": self.baseline, "candidate": self.candidate,
                "thresholds": [{"figure": t.figure, "limit_pct": t.limit_pct} for t in self.thresholds],
                "confidence": CONFIDENCE, "min_effect_pct": self.min_effect, "interval": self.interval,
                "mismatches_allowed": self.mismatches, "only_in": self.only_in,
                "rows": [r.to_dict() for r in self.rows], "failures": [r.to_dict() for r in self.failures]}


def gate(baseline: Session, candidate: Session, thresholds: Sequence[Threshold],
         min_effect: float = MIN_EFFECT_PCT, slos: Mapping[str, float] | None = None,
         allow: set[str] | None = None, names: tuple[str, str] | None = None) -> GateResult:
    """Judge `candidate` against `baseline` on each threshold's figure in every common cell.

    ServescopeError (exit 2) when the sessions share no cell, measured differently (unless allowed), or no
    cell gives a figure an interval (no per-request data)."""
    figures = tuple(dict.fromkeys(t.figure for t in thresholds))
    comp: Comparison = compare_sessions([baseline, candidate], slos=slos,
                                        metrics=tuple(MetricSpec.of(f) for f in figures), min_effect=min_effect)
    if comp.no_common:  # sessions holding quality results compare without a common cell: a gate needs one
        raise ServescopeError(comp.no_common.replace("Only their quality is compared.", "").strip()
                              + " Gate sessions that ran the same workloads and concurrencies.")
    allow = allow or set()
    refused: dict[str, None] = {}  # the facts that differ and were not allowed
    lines: dict[str, None] = {}  # a figure's own reasons, refused: "itl_ms.p99: not comparable (ITL definition)"
    allowed_figures: dict[str, None] = {}  # and allowed
    for c in comp.cells:
        refused.update((x, None) for x in (x.strip() for x in c.not_comparable.split(",")) if x and x not in allow)
        for t in thresholds:  # another tool's definitions: the figures they touch only (sessions.comparability)
            for x in (x.strip() for x in c.figure_why.get(t.figure, "").split(",") if x.strip()):
                (allowed_figures if x in allow else lines)[f"{t.figure}: not comparable ({x})"] = None
                if x not in allow:
                    refused[x] = None
    if refused:
        allow_names = [n for n, labels in MISMATCH_NAMES.items() if set(refused) & set(labels)]
        details = [m for m in comp.mismatches if _mismatch_fact(m) & set(refused)]
        raise ServescopeError("the sessions measured differently, no gate is called: "
                              + "; ".join([*details, *lines])
                              + f"; pass --allow-mismatch {','.join(allow_names)} if that is intended")
    rows = []
    for c in comp.cells:
        for t in thresholds:
            j = (c.judgements.get(t.figure) or [None, None])[1] or Judgement(None, None, None)
            vals = c.values[t.figure]
            failed = (j.delta_pct is not None and t.beyond(j.delta_pct) and j.significant(t.direction)
                      and abs(j.delta_pct) >= min_effect)
            rows.append(GateRow(c.workload, c.load, t, vals[0], vals[1], j, failed))
    for t in thresholds:
        if not any(r.judgement.ci is not None for r in rows if r.threshold == t):
            raise ServescopeError(f"cannot gate {t.figure}: no common cell has it with per-request data to "
                                  "give it an interval (an import without --save-detailed?)")
    base, cand = names or (comp.labels[0], comp.labels[1])
    return GateResult(base, cand, list(thresholds), rows, min_effect, comp.interval,
                      [*comp.mismatches, *allowed_figures], [f"{w} {ld}" for w, ld, _ in comp.only_in])


# ---- baseline files -------------------------------------------------------------------------------------
def save_baseline(session: Session, path: Path) -> int:
    """Write `session` as a baseline file (JSON; gzip when the name ends in .gz); returns its size in bytes.

    Format (BASELINE_FORMAT 1): {"servescope_baseline": 1, "servescope_version", "source": the session's
    directory name, "meta": session.toml as a table, "cells": cells.parquet's rows, "requests": {cell index:
    {column: [values]}}}: each cell's measured (non-warmup) requests with every stamp, the chunk stamps as
    `chunk_us` (microseconds after the request was sent) and without error texts."""
    requests: dict[str, dict[str, list[object]]] = {}
    idx = session.cells["index"].to_list() if "index" in session.cells.columns else []
    for i in idx:
        df = session.requests(int(i))
        if df.height == 0:
            continue
        if "warmup" in df.columns:
            df = df.filter(~pl.col("warmup"))
        keep = [c for c in REQUEST_SCHEMA if c in df.columns and c not in ("error", "chunk_ns")]
        cols = df.select(keep).to_dict(as_series=False)
        if "chunk_ns" in df.columns:
            cols["chunk_us"] = df.select(
                ((pl.col("chunk_ns") - pl.col("sent_ns")) // 1000).alias("c"))["c"].to_list()
        requests[str(int(i))] = cols
    doc = {"servescope_baseline": BASELINE_FORMAT, "servescope_version": __version__, "source": session.path.name,
           "meta": session.meta, "cells": session.cells.to_dicts(), "requests": requests}
    data = json.dumps(doc, default=str, separators=(",", ":")).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as e:
        raise ServescopeError(f"cannot write {path}: {e.strerror}; choose another --save-baseline path") from None
    return len(data)


def is_baseline_file(ref: str) -> bool:
    p = Path(ref).expanduser()
    return p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz") or p.name.endswith(".gz"))


def load_baseline(path: Path, workdir: Path) -> Session:
    """A baseline file as a session (rebuilt under `workdir`); a ServescopeError naming the file otherwise."""
    import tomli_w

    where = str(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, ValueError, EOFError) as e:
        raise ServescopeError(f"{where}: not a servescope baseline file ({clean_text(str(e))[:120]}); write one "
                              "with `servescope gate SESSION --save-baseline FILE`") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("servescope_baseline"), int):
        raise ServescopeError(f"{where}: not a servescope baseline file (no servescope_baseline key); write one "
                              "with `servescope gate SESSION --save-baseline FILE`")
    if doc["servescope_baseline"] > BASELINE_FORMAT:
        raise ServescopeError(f"{where}: baseline format {doc['servescope_baseline']} is newer than this "
                              f"servescope reads ({BASELINE_FORMAT}); upgrade servescope")
    meta, cells, requests = doc.get("meta"), doc.get("cells"), doc.get("requests")
    if not isinstance(meta, dict) or not isinstance(cells, list) or not isinstance(requests, dict):
        raise ServescopeError(f"{where}: a baseline file needs meta, cells and requests; it is damaged: "
                              "write it again with --save-baseline")
    src = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(doc.get("source") or "session"))[:80]
    d = workdir / f"baseline-{src}"  # never `..` or an absolute path
    for c in meta.get("cells") or []:  # the file holds the requests of the cells that had any: those are promised
        if isinstance(c, dict) and "requests_file" in c:
            c["requests_file"] = str(c.get("index")) in requests
    try:
        (d / "requests").mkdir(parents=True)
        (d / "session.toml").write_text(tomli_w.dumps(toml_clean(meta)), encoding="utf-8")
        if cells:
            pl.DataFrame(cells, infer_schema_length=None).write_parquet(d / "cells.parquet")
        for i, cols in requests.items():
            if not isinstance(cols, dict):
                raise ValueError(f"requests[{i}] is not a table")
            chunk_us = cols.pop("chunk_us", None)
            schema = {k: REQUEST_SCHEMA[k] for k in cols if k in REQUEST_SCHEMA}
            df = pl.DataFrame(cols, schema_overrides=schema, infer_schema_length=None)
            if chunk_us is not None:
                df = df.with_columns(pl.Series("chunk_us", chunk_us, dtype=pl.List(pl.Int64)))
                df = df.with_columns(chunk_ns=pl.col("chunk_us") * 1000 + pl.col("sent_ns")).drop("chunk_us")
            df.write_parquet(d / "requests" / f"cell-{int(i):04d}.parquet")
    except ServescopeError:
        raise
    except Exception as e:  # noqa: BLE001 - any decoding problem of an outside file is one line
        why = (clean_text(str(e)).splitlines() or [error_text(e)])[0][:160]
        raise ServescopeError(f"{where}: the baseline file is damaged ({why}); write it again with "
                              "--save-baseline") from None
    return load_session(d)
