"""What a GPU box's user changes next, as report blocks (servescope.reports.document): speculative decoding (each
cell's acceptance beside its TPOT, and where speculation stops paying: servescope.sessions.crossover), LoRA adapters
(each adapter's requests and latencies), the prefix cache under control (the hit rate aimed at against the one
measured, whether the cache was reset before the cell), the launched servers' start-up, and energy per output token
(NVML). Each section or column appears only where a cell measured it: a session without speculation shows no
acceptance column, one without NVML no energy (and no zeros). Adapter names and server arguments are data: they go
into the document as text, which every renderer escapes."""

from __future__ import annotations

from collections.abc import Sequence

from servescope.core.results import CellResult, Startup, finite
from servescope.core.secrets import redact_command
from servescope.core.textsafe import clean_text
from servescope.reports.document import (
    Block,
    Code,
    Column,
    Content,
    Num,
    Strong,
    bullets,
    content,
    heading,
    para,
    right,
    row,
    table,
)
from servescope.sessions.crossover import Crossover, crossover_sentence, speculation_crossover
from servescope.sessions.views import CellView, fmt_num, fmt_pct

__all__ = ["ADAPTER_ROWS", "TARGET_MISS", "energy_cells", "energy_columns", "prefix_cache_warnings", "serving_blocks",
           "session_serving_blocks", "speculation_compare_blocks", "startup_blocks"]

ADAPTER_ROWS = 20  # adapters listed per cell in the report's table, then how many more
TARGET_MISS = 0.10  # a measured prefix-cache hit rate this far (absolute) from the workload's target misses it
PHASES = (("weights_s", "weights s"), ("compile_s", "compile s"), ("cuda_graphs_s", "CUDA graphs s"),
          ("engine_init_s", "engine init s"))


def _pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None else "-"


def _done(views: Sequence[CellView]) -> list[CellView]:
    return [v for v in views if v.has_summary]


# ---- energy: columns of the results table -----------------------------------------------------------------
def energy_columns(views: Sequence[CellView]) -> tuple[Column, ...]:
    """The results table's energy columns, beside the cost: only when some cell has NVML's energy."""
    if not any(v.summary.energy is not None for v in views):
        return ()
    return (right("energy J/out tok", "J per output token", "GPUs' energy over the cell / its output tokens"),
            right("GPU power W (mean)", "W", "mean over the cell"))


def energy_cells(sm: CellResult, columns: Sequence[Column]) -> tuple[Content, ...]:
    if not columns:
        return ()
    e = sm.energy
    if e is None:
        return (content(Num("-")), content(Num("-")))
    return (content(Num(fmt_num(finite(e.j_per_output_token)))), content(Num(fmt_num(finite(e.mean_w)))))


def _energy_note(views: Sequence[CellView]) -> list[Block]:
    if not any(v.summary.energy is not None for v in views):
        return []
    return [para("Energy (NVML): ", Code("energy J/out tok"), " is the trapezoid integral of every GPU's power over "
                 "the cell's measured window divided by its output tokens; ", Code("GPU power W (mean)"),
                 " that integral over the seconds the power readings cover (docs/telemetry.md).")]


# ---- a workload's section: speculation, adapters, the prefix cache --------------------------------------------
SPEC_COLUMNS = (Column("load"), right("TPOT ms p50 / p90 / p99", "ms", "p50 / p90 / p99"),
                right("acceptance rate", "share of drafted tokens", "over the cell"),
                right("accepted tokens per draft (mean)", "tokens", "mean"),
                right("drafts per step (mean)", "drafts", "mean"))


def _spec_blocks(views: Sequence[CellView]) -> list[Block]:
    cells = [v for v in _done(views) if v.summary.spec_decode is not None]
    if not cells:
        return []
    rows = []
    for v in cells:
        sd = v.summary.spec_decode
        assert sd is not None
        tpot = v.summary.tpot_ms
        rows.append(row(v.load, Num(" / ".join(fmt_num(tpot.stat(p)) for p in ("p50", "p90", "p99"))),
                        Num(_pct(finite(sd.acceptance_rate)) if sd.acceptance_rate is not None else "nothing drafted"),
                        Num(fmt_num(finite(sd.mean_accepted_tokens))), Num(fmt_num(finite(sd.drafts_per_step)))))
    return [para(Strong("Speculative decoding"), " (from the server's ", Code("/metrics"), " counters over each cell: "
                 "acceptance rate = accepted / drafted tokens; accepted tokens per draft; drafts per step = drafts / "
                 "the requests' steps, below 1 where the proposer had nothing to offer):"),
            table(SPEC_COLUMNS, rows)]


ADAPTER_COLUMNS = (Column("load"), Column("adapter"), right("requests", "requests", "ok"),
                   right("output tok/s", "tok/s", "the adapter's output tokens / the cell's wall time"),
                   right("TTFT ms p50", "ms", "p50"), right("TPOT ms p50", "ms", "p50"))


def _adapter_blocks(views: Sequence[CellView]) -> list[Block]:
    cells = [v for v in _done(views) if v.summary.adapters]
    if not cells:
        return []
    rows = []
    for v in cells:
        adapters = v.summary.adapters or {}
        for k, (name, a) in enumerate(adapters.items()):
            if k == ADAPTER_ROWS:
                rows.append(row(v.load, f"... and {len(adapters) - ADAPTER_ROWS} more (the JSON report has them all)",
                                None, None, None, None))
                break
            rows.append(row(v.load if k == 0 else "", name, Num(str(a.requests)),
                            Num(fmt_num(finite(a.output_tok_s))), Num(fmt_num(finite(a.ttft_ms.p50))),
                            Num(fmt_num(finite(a.tpot_ms.p50)))))
    out: list[Block] = [para(Strong("LoRA adapters"), " (each request names its adapter as its model; ", Code("base"),
                             ": the base model's requests; the most requested first; ok requests only):"),
                        table(ADAPTER_COLUMNS, rows, empty="")]
    ran = [(v, ls) for v in cells if (ls := v.summary.lora_server) is not None]
    if ran:
        out.append(para("Adapters the server ran during each cell (its ", Code("vllm:lora_requests_info"),
                        "; vLLM counts no requests per adapter):"))
        out.append(bullets(content(f"{v.load}: ", ", ".join(ls.adapters_running) or "none",
                                   f" (max_loras {ls.max_loras})" if ls.max_loras is not None else None)
                           for v, ls in ran))
    return out


PREFIX_COLUMNS = (Column("load"), right("hit rate aimed at", "share of prompt tokens", "the workload's target"),
                  right("hit rate measured", "share of prompt tokens", "over the cell"),
                  Column("cache reset before the cell"))


def prefix_cache_warnings(views: Sequence[CellView]) -> list[str]:
    """One line for each thing wrong with the prefix cache's control: a reset asked for (--reset-prefix-cache) that
    the server did not offer, a measured hit rate more than TARGET_MISS from the workload's target."""
    out: list[str] = []
    refused = [v.load for v in _done(views) if v.summary.prefix_cache_reset is False]
    if refused:
        out.append(f"--reset-prefix-cache was asked for, but the server did not offer a reset before {', '.join(refused)}"
                   " (vLLM serves POST /reset_prefix_cache when started with VLLM_SERVER_DEV_MODE=1): these cells' hit "
                   "rates include what earlier cells and runs left in the cache")
    for v in _done(views):
        target, got = v.summary.prefix_cache_target, finite(v.summary.prefix_cache_hit_rate)
        if target is None:
            continue
        if got is None:
            out.append(f"{v.load}: the workload aims at a {target:.0%} prefix-cache hit rate, but the server reported "
                       "none (no cached tokens in the usage, no prefix-cache counters in /metrics)")
        elif abs(got - target) > TARGET_MISS:
            why = ("the cache held prompts of earlier cells or runs (--reset-prefix-cache empties it before each cell)"
                   if got > target and not v.summary.prefix_cache_reset else
                   "more of the prompts were cached than their shared prefix" if got > target else
                   "the shared prefix was evicted or missed (a cache too small for the load, or the users' first "
                   "requests arriving together)")
            out.append(f"{v.load}: prefix-cache hit rate {got:.1%} measured, {target:.0%} aimed at "
                       f"({(got - target) * 100:+.1f} points): {why}")
    return out


def _prefix_blocks(views: Sequence[CellView]) -> list[Block]:
    cells = [v for v in _done(views)
             if v.summary.prefix_cache_target is not None or v.summary.prefix_cache_reset is not None]
    if not cells:
        return []
    rows = []
    for v in cells:
        s = v.summary
        reset = {True: "yes", False: "no: the server offers no reset", None: "not asked"}[s.prefix_cache_reset]
        rows.append(row(v.load, Num(f"{s.prefix_cache_target:.0%}" if s.prefix_cache_target is not None else "-"),
                        Num(_pct(finite(s.prefix_cache_hit_rate))), reset))
    out: list[Block] = [para(Strong("Prefix cache under control"), " (the workload's target hit rate, the one measured "
                             "from the usage's cached tokens or the server's counters, and whether the cache was "
                             "emptied before the cell: ", Code("--reset-prefix-cache"), "):"),
                        table(PREFIX_COLUMNS, rows)]
    warn = prefix_cache_warnings(views)
    if warn:
        out += [para(Strong("Warning:"), " the prefix cache was not as the workload asked:"), bullets(warn)]
    return out


def serving_blocks(views: Sequence[CellView]) -> list[Block]:
    """A workload's serving figures, after its results table: its cells' speculative decoding (beside their TPOT),
    LoRA adapters, prefix cache under control, and what the energy columns are ([] when it has none of them)."""
    return [*_spec_blocks(views), *_adapter_blocks(views), *_prefix_blocks(views), *_energy_note(views)]


# ---- session level: speculation on vs off, start-up ---------------------------------------------------------
def _unit(views: Sequence[CellView]) -> str:
    return "c=" if all(v.concurrency is not None for v in views) else "req/s"


def _crossover_table(c: Crossover, unit: str, off: str, on: str) -> Block:
    rows = []
    for x, a, b in c.points:
        load = f"c={x:g}" if unit == "c=" else f"{x:g} req/s"
        rows.append(row(load, Num(fmt_num(a)), Num(fmt_num(b)), Num(fmt_pct((b - a) / a * 100 if a else None))))
    return table((Column("load"), right(f"TPOT ms p50: {off}", "ms", "p50, median over repeats"),
                  right(f"TPOT ms p50: {on}", "ms", "p50, median over repeats"), right("change", "%", "on vs off")),
                 rows)


def _speculation_blocks(views: Sequence[CellView], level: int) -> list[Block]:
    """Per workload run both with and without speculation (server variants): where speculation stops lowering the
    TPOT p50."""
    out: list[Block] = []
    for base in dict.fromkeys(v.base for v in views):
        cells = [v for v in _done(views) if v.base == base and v.x is not None and v.status in ("done", "")]
        on = [v for v in cells if v.summary.spec_decode is not None]
        off = [v for v in cells if v.summary.spec_decode is None]
        if not on or not off:
            continue
        unit = _unit(cells)
        c = speculation_crossover([(float(v.x), v.summary) for v in cells if v.x is not None])
        if c is None:
            continue
        ons = sorted({redact_command(clean_text(v.variant)) or v.workload for v in on})
        offs = sorted({redact_command(clean_text(v.variant)) or v.workload for v in off})
        out += [para(Strong(f"{base}: {crossover_sentence(c, unit=unit)}"), " (TPOT p50, lower is better; with "
                     "speculation: ", "; ".join(ons), "; without: ", "; ".join(offs), ")."),
                _crossover_table(c, unit, "off", "on")]
    if out:
        out.insert(0, heading(level, "Speculative decoding: on vs off"))
        out.insert(1, para("At low load a decode step is memory-bound, so verifying drafted tokens costs almost nothing "
                           "more than one token; at high load the step is compute-bound and every drafted row is paid "
                           "for, accepted or not. The crossover is the first load at which the cells with speculation "
                           "no longer have the lower TPOT p50 (each load's median over its repeats)."))
    return out


def _launches(views: Sequence[CellView]) -> list[tuple[str, Startup, int]]:
    """Each launch the cells record, in cell order: (variant, its start, how many cells it served)."""
    out: list[tuple[str, Startup, int]] = []
    for v in sorted(_done(views), key=lambda v: v.index):
        st = v.summary.startup
        if st is None:
            continue
        variant = redact_command(clean_text(v.variant)) if v.variant else "(the launch command)"
        if out and out[-1][0] == variant and out[-1][1] == st:
            out[-1] = (variant, st, out[-1][2] + 1)
        else:
            out.append((variant, st, 1))
    return out


def startup_blocks(views: Sequence[CellView], level: int) -> list[Block]:
    """A table of the launched servers' start-up (each variant's launch and each relaunch): seconds to a healthy
    server and to the first token, and the phases vLLM's log names (columns only for those some launch has)."""
    launches = _launches(views)
    if not launches:
        return []
    phases = [(k, h) for k, h in PHASES if any((st.phases or {}).get(k) is not None for _, st, _ in launches)]
    columns = (Column("server"), right("healthy s", "s", "from starting the command"),
               right("first token s", "s", "from starting the command"), *(right(h, "s") for _, h in phases),
               right("cells", "cells"))
    rows = [row(variant, Num(fmt_num(finite(st.healthy_s))), Num(fmt_num(finite(st.first_token_s))),
                *(Num(fmt_num(finite((st.phases or {}).get(k)))) for k, _ in phases), Num(str(n)))
            for variant, st, n in launches]
    return [heading(level, "Start-up"),
            para("Each launch of the server (each variant's, each relaunch): seconds from starting its command to a "
                 "healthy ", Code("/health"), " and to the first token of a one-token request sent as soon as it was"
                 + (", and the phases its log names" if phases else "") + "."),
            table(columns, rows)]


def session_serving_blocks(views: Sequence[CellView], level: int = 2) -> list[Block]:
    """The session-level sections: speculation on vs off (where both ran) and the servers' start-up."""
    return [*_speculation_blocks(views, level), *startup_blocks(views, level)]


# ---- compare: speculation across sessions -------------------------------------------------------------------
def speculation_compare_blocks(labels: Sequence[str], cells: Sequence[tuple[str, Sequence[Sequence[CellView]]]],
                               level: int) -> list[Block]:
    """For each session against the first, each workload where one speculates and the other does not: the
    crossover sentence. `cells`: (workload, per session its repeats of the cell) for every compared cell."""
    out: list[Block] = []
    for i in range(1, len(labels)):
        for w in dict.fromkeys(wl for wl, _ in cells):
            mine = [(v, s) for wl, per in cells if wl == w for s in (0, i) for v in per[s] if v.x is not None]
            if not mine:
                continue
            first = [v for v, s in mine if s == 0]
            other = [v for v, s in mine if s == i]
            spec_first = any(v.summary.spec_decode is not None for v in first)
            spec_other = any(v.summary.spec_decode is not None for v in other)
            if spec_first == spec_other:
                continue
            c = speculation_crossover([(float(v.x), v.summary) for v, _ in mine if v.x is not None])
            if c is None:
                continue
            on, off = (labels[0], labels[i]) if spec_first else (labels[i], labels[0])
            unit = _unit([v for v, _ in mine])
            out += [para(Strong(f"{w}: {crossover_sentence(c, what=f'speculation ({on})', unit=unit)}"),
                         f" against {off} (TPOT p50, lower is better)."),
                    _crossover_table(c, unit, off, on)]
    return [heading(level, "Speculative decoding: on vs off"), *out] if out else []
