"""Where a session's figures come from: the `[source]` table of an imported session, typed, and what every session
was measured with (the facts `compare` and `gate` set side by side, sessions.comparability).

A session servescope measured has no `[source]` table: it was measured by servescope, with servescope's
definitions (core/metrics.py). An imported session (`servescope import`, sessions.importers) records the tool that
measured it, its version, the files read, whether per-request records were rebuilt from them (then every figure is
computed with servescope's formulas from the tool's own timestamps), the basis of its token counts, its load, its
warmup and ramp as the tool's file says, and the definition of each figure as it stands in this session: where
records were rebuilt that is servescope's formula over the tool's stamps (its TTFT clock stops where the tool
stamped the first token; its ITL is servescope's only when the file kept each chunk's time), else the tool's own.
Sessions imported before this table existed carry an `[import]` table (vllm bench serve): `source_meta` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec

from servescope.core.errors import ServescopeError

# the tools a session can come from, by the names `servescope import --from` takes, as people write them
TOOL_NAMES = {
    "servescope": "servescope", "vllm-bench": "vllm bench serve", "guidellm": "GuideLLM", "aiperf": "AIPerf",
    "inference-perf": "inference-perf", "llmd-report": "llm-d benchmark report",
}
IMPORT_FORMATS = ("vllm-bench", "guidellm", "aiperf", "inference-perf", "llmd-report")

SERVER_USAGE = "server usage"
CLIENT_TOKENIZER = "client tokenizer"

# ---- the definitions, as one short text each (two sessions compare these texts) -------------------------------
TTFT_ANY = "request sent -> first chunk carrying a token (content or reasoning)"
TTFT_CONTENT = "request sent -> first chunk carrying content (reasoning not counted)"
ITL_POOLED = "every gap between token-carrying chunks after the first, pooled over requests"
ITL_MEAN_GAP = "each request's mean gap between first and last token (no per-chunk times): spread evenly"
TPOT_SERVESCOPE = "per request (E2E - TTFT) / (output tokens - 1)"
E2E_SERVESCOPE = "request sent -> end of stream"
PCT_LINEAR = "linear interpolation between the two nearest values"
THROUGHPUT_WALL = "output tokens of successful requests / (first request sent -> last request ended)"

# servescope's own (core/metrics.py); an import that rebuilt records shares the formulas, not always the stamps
SERVESCOPE_DEFINITIONS: dict[str, str] = {
    "ttft": TTFT_ANY, "itl": ITL_POOLED, "tpot": TPOT_SERVESCOPE, "e2e": E2E_SERVESCOPE, "percentiles": PCT_LINEAR,
    "throughput": THROUGHPUT_WALL,
}

# the definitions of the figures each tool reports itself (what an import of its aggregates keeps)
TOOL_DEFINITIONS: dict[str, dict[str, str]] = {
    "vllm-bench": {**SERVESCOPE_DEFINITIONS, "itl": "every gap between chunks after the first, pooled (vllm bench)"},
    "guidellm": {
        "ttft": TTFT_ANY,
        "itl": "per request (last token - first token) / (output tokens - 1), its distribution over requests",
        "tpot": "per request (last token - request start) / output tokens (first token included)",
        "e2e": E2E_SERVESCOPE,
        "percentiles": "GuideLLM's: the value at the rank (no interpolation)",
        "throughput": "a rate sampled over the benchmark's time, its mean (GuideLLM)",
    },
    "aiperf": {
        "ttft": TTFT_ANY,
        "itl": "every gap between response chunks after the first, pooled (AIPerf's inter_chunk_latency)",
        "tpot": TPOT_SERVESCOPE + " (AIPerf's inter_token_latency)",
        "e2e": E2E_SERVESCOPE,
        "percentiles": PCT_LINEAR,
        "throughput": "output tokens / the benchmark's duration (AIPerf)",
    },
    "inference-perf": {
        "ttft": TTFT_CONTENT,
        "itl": "gaps between token times, a chunk's tokens all stamped at its arrival, pooled (inference-perf)",
        "tpot": "per request (last token - first token) / (output tokens - 1)",
        "e2e": E2E_SERVESCOPE,
        "percentiles": PCT_LINEAR,
        "throughput": THROUGHPUT_WALL,
    },
}


class SourceMeta(msgspec.Struct, frozen=True, kw_only=True):
    """session.toml's `[source]` table: what an imported session's figures come from (module docstring)."""

    tool: str  # a key of TOOL_NAMES
    tool_version: str | None = None
    harness: str | None = None  # a report's own measuring tool and version (an llm-d report: "inference-perf 0.3.0")
    format: str = ""  # the files' format as read ("GuideLLM benchmarks JSON (version 2)")
    files: list[str] = msgspec.field(default_factory=list)
    dates: list[str] = msgspec.field(default_factory=list)
    rebuilt: bool = False  # per-request records rebuilt: every figure is servescope's formula over the tool's stamps
    token_basis: str = "unknown"  # of this session's figures: SERVER_USAGE, CLIENT_TOKENIZER or "unknown"
    tool_token_basis: str | None = None  # of the tool's own figures, when it differs from token_basis
    tokenizer: str | None = None  # the tool's tokenizer (its prompts were sized with it)
    loop: str = "unknown"  # "closed", "open", "closed and open" or "unknown"
    load: str = ""  # the load as the file states it ("concurrency 1, 4")
    warmup: str = "unknown"  # "none", "N requests", "S s", "P% of the requests" or "unknown"
    ramp: str = "unknown"  # "none", "S s" or "unknown"
    streaming: bool | None = None
    ignore_eos: bool | None = None
    requests: list[int] = msgspec.field(default_factory=list)  # measured requests per cell, in cell order
    definitions: dict[str, str] = msgspec.field(default_factory=dict)  # figure -> its definition in this session
    lacks: dict[str, str] = msgspec.field(default_factory=dict)  # what the files cannot give, and why
    reported: list[dict[str, float]] = msgspec.field(default_factory=list)  # per cell: the tool's own headline figures
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def tool_name(self) -> str:
        """'GuideLLM 0.8.1', 'vllm bench serve'."""
        name = TOOL_NAMES.get(self.tool, self.tool)
        name = f"{name} {self.tool_version}" if self.tool_version else name
        return f"{name} ({self.harness})" if self.harness else name

    @property
    def imported(self) -> bool:
        return self.tool != "servescope"

    @classmethod
    def from_dict(cls, table: Mapping[str, object], where: str) -> SourceMeta:
        """The `[source]` table, validated: a ServescopeError naming the file and the key otherwise."""
        try:
            return msgspec.convert(dict(table), cls, strict=True)
        except msgspec.ValidationError as e:
            raise ServescopeError(f"{where}: source: {str(e).replace('`', '')}; the file is damaged: restore it "
                                  "from a copy") from None

    def to_dict(self) -> dict[str, object]:
        """The table as session.toml stores it (None left out: TOML has no null)."""
        out: dict[str, object] = {}
        for k, v in msgspec.structs.asdict(self).items():
            if v is None:
                continue
            out[k] = [dict(r) for r in v] if k == "reported" else v
        return out


def servescope_source(version: str) -> SourceMeta:
    """What a session servescope measured was measured with."""
    return SourceMeta(tool="servescope", tool_version=version, format="servescope session", rebuilt=True,
                      token_basis=SERVER_USAGE, loop="unknown", warmup="unknown", ramp="unknown", streaming=True,
                      definitions=dict(SERVESCOPE_DEFINITIONS))


def legacy_import(table: Mapping[str, object]) -> SourceMeta:
    """An `[import]` table (a `vllm bench serve` import written before `[source]`) as a SourceMeta."""
    detailed = table.get("detailed") is True
    files = table.get("files")
    dates = table.get("dates")
    lacks = table.get("lacks")
    reported = table.get("vllm_reported")
    return SourceMeta(
        tool="vllm-bench", format="vllm bench serve --save-result JSON", rebuilt=detailed,
        files=[str(f) for f in files] if isinstance(files, list) else [],
        dates=[str(d) for d in dates] if isinstance(dates, list) else [],
        token_basis=SERVER_USAGE, streaming=True, warmup="unknown", ramp="none",
        definitions=dict(SERVESCOPE_DEFINITIONS if detailed else TOOL_DEFINITIONS["vllm-bench"]),
        lacks={str(k): str(v) for k, v in lacks.items()} if isinstance(lacks, Mapping) else {},
        reported=[{str(k): float(v) for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                  for r in reported if isinstance(r, Mapping)] if isinstance(reported, list) else [])


class _Meta(Protocol):
    """What measured_by reads of a session's metadata (sessions.meta.SessionMeta, which imports this module)."""

    @property
    def source(self) -> SourceMeta | None: ...

    @property
    def import_(self) -> Mapping[str, object] | None: ...

    @property
    def servescope_version(self) -> str: ...


def measured_by(info: _Meta) -> SourceMeta:
    """What a session was measured with: its `[source]`, else its older `[import]` table, else servescope."""
    if info.source is not None:
        return info.source
    if info.import_ is not None:
        return legacy_import(info.import_)
    return servescope_source(info.servescope_version)
