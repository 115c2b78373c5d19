"""The report's serving sections (servescope.reports.serving_doc) on hand-built cells and sessions: speculative
decoding beside the TPOT only where a cell speculated, the crossover named for speculation on and off, each LoRA
adapter's figures with its name escaped, the prefix cache's target against its measured hit rate with the warnings,
the launches' start-up, energy J/out tok and mean W beside the cost (nothing, no zeros, without NVML), and compare's
crossover and J/out tok deltas; the app's pane lines (servescope.tui.widgets.serving)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from servescope.core.metrics import records_frame, summarize
from servescope.core.results import AdapterFigures, CellResult, Dist, Energy, LoraServer, SpecDecode, Startup
from servescope.reports.compare_doc import comparison_markdown
from servescope.reports.document import Document
from servescope.reports.render_html import render_html
from servescope.reports.render_md import render_markdown
from servescope.reports.report import render_report
from servescope.reports.serving_doc import (
    TARGET_MISS,
    energy_columns,
    prefix_cache_warnings,
    serving_blocks,
    session_serving_blocks,
    speculation_compare_blocks,
)
from servescope.sessions.compare import ENERGY_METRIC, compare_sessions
from servescope.sessions.store import load_session
from servescope.sessions.views import CellView, LoadPlan
from servescope.tui.widgets.serving import serving_lines
from servescope.workloads.spec import PRESETS
from tests.sessions.conftest import CellSpec, _records
from tests.sessions.synth import plan, sweep_session

SPEC = SpecDecode(acceptance_rate=0.385, mean_accepted_tokens=1.15, drafts_per_step=0.58)


def _view(c: int, s: CellResult, base: str = "w", variant: str = "", index: int | None = None) -> CellView:
    wl = f"{base} [{variant}]" if variant else base
    return CellView(c if index is None else index, wl, f"c={c}", LoadPlan(c, None), "done", "", s, base, variant)


def _md(blocks: list[Any]) -> str:
    return render_markdown(Document("t", blocks))


def _tpot(p50: float) -> Dist:
    return Dist(mean=p50, p50=p50, p90=p50 * 1.1, p99=p50 * 1.2)


def test_speculation_columns_only_where_a_cell_speculated() -> None:
    plain = [_view(c, CellResult(tpot_ms=_tpot(4.0))) for c in (1, 4)]
    assert "acceptance" not in _md(serving_blocks(plain)) and serving_blocks(plain) == []
    spec = [_view(1, CellResult(tpot_ms=_tpot(2.66), spec_decode=SPEC)),
            _view(4, CellResult(tpot_ms=_tpot(3.28), spec_decode=SpecDecode()))]
    md = _md(serving_blocks(spec))
    assert "| load | TPOT ms p50 / p90 / p99 | acceptance rate | accepted tokens per draft (mean) | drafts per step " \
           "(mean) |" in md
    assert "| c=1 | 2.66 / 2.93 / 3.19 | 38.5% | 1.15 | 0.58 |" in md
    assert "| c=4 | 3.28 / 3.61 / 3.94 | nothing drafted | - | - |" in md  # a speculating server that drafted nothing


def test_speculation_on_and_off_variants_name_the_crossover() -> None:
    off = [_view(c, CellResult(tpot_ms=_tpot(t)), variant="--max-num-seqs 128", index=i)
           for i, (c, t) in enumerate(((1, 4.0), (4, 4.2), (16, 5.5), (64, 10.5)))]
    on = [_view(c, CellResult(tpot_ms=_tpot(t), spec_decode=SPEC), variant="--speculative-config '{\"n\": 3}'",
                index=4 + i) for i, (c, t) in enumerate(((1, 2.7), (4, 3.3), (16, 5.8), (64, 12.1)))]
    md = _md(session_serving_blocks(off + on))
    assert "## Speculative decoding: on vs off" in md
    assert "**w: speculation lowers TPOT up to c=4, raises it from c=16**" in md
    assert "| c=16 | 5.50 | 5.80 | +5.5% |" in md
    assert session_serving_blocks(off) == []  # no speculation: no section


def test_adapter_table_escapes_the_names() -> None:
    hostile = "sql|x*<b>`"
    s = CellResult(adapters={hostile: AdapterFigures(requests=12, output_tok_s=180.8, ttft_ms=Dist(p50=907.77),
                                                     tpot_ms=Dist(p50=4.79)),
                             "base": AdapterFigures(requests=3, output_tok_s=20.0, ttft_ms=Dist(p50=100.0),
                                                    tpot_ms=Dist(p50=4.0))},
                   lora_server=LoraServer(adapters_running=[hostile], max_loras=1))
    blocks = serving_blocks([_view(16, s)])
    md = _md(blocks)
    assert "| load | adapter | requests | output tok/s | TTFT ms p50 | TPOT ms p50 |" in md
    assert r"| c=16 | sql\|x\*\<b\>\` | 12 | 180.8 | 907.8 | 4.79 |" in md
    assert "|  | base | 3 | 20.0 | 100.0 | 4.00 |" in md
    assert "<b>" not in md and "<b>" not in render_html(Document("t", blocks))
    assert "sql|x*&lt;b&gt;`" in render_html(Document("t", blocks))


def test_many_adapters_are_cut_with_a_count() -> None:
    ad = {f"lora-{k}": AdapterFigures(requests=1) for k in range(25)}
    md = _md(serving_blocks([_view(4, CellResult(adapters=ad))]))
    assert "lora-19" in md and "lora-20" not in md and "... and 5 more (the JSON report has them all)" in md


def test_prefix_cache_target_against_measured_with_warnings() -> None:
    ok = _view(1, CellResult(prefix_cache_target=0.5, prefix_cache_hit_rate=0.438, prefix_cache_reset=True))
    high = _view(4, CellResult(prefix_cache_target=0.5, prefix_cache_hit_rate=0.969, prefix_cache_reset=False))
    assert prefix_cache_warnings([ok]) == []  # 6 points off: within TARGET_MISS
    assert TARGET_MISS == 0.10
    warn = prefix_cache_warnings([ok, high])
    assert warn[0].startswith("--reset-prefix-cache was asked for, but the server did not offer a reset before c=4")
    assert warn[1].startswith("c=4: prefix-cache hit rate 96.9% measured, 50% aimed at (+46.9 points): the cache "
                              "held prompts of earlier cells or runs")
    md = _md(serving_blocks([ok, high]))
    assert "| load | hit rate aimed at | hit rate measured | cache reset before the cell |" in md
    assert "| c=1 | 50% | 43.8% | yes |" in md and "| c=4 | 50% | 96.9% | no: the server offers no reset |" in md
    assert "**Warning:** the prefix cache was not as the workload asked:" in md
    low = _view(8, CellResult(prefix_cache_target=0.5, prefix_cache_hit_rate=0.2, prefix_cache_reset=True))
    assert "the shared prefix was evicted or missed" in prefix_cache_warnings([low])[0]
    none = _view(8, CellResult(prefix_cache_target=0.5))
    assert "the server reported none" in prefix_cache_warnings([none])[0]


def test_startup_table_compares_the_launches() -> None:
    a = Startup(healthy_s=1.6, first_token_s=2.0, phases={"weights_s": 0.03, "engine_init_s": 5.79})
    b = Startup(healthy_s=1.5, first_token_s=1.7)
    views = [_view(c, CellResult(startup=a), variant="--max-num-seqs 128", index=i) for i, c in enumerate((1, 4))]
    views += [_view(c, CellResult(startup=b), variant="--speculative-config x", index=2 + i)
              for i, c in enumerate((1, 4))]
    md = _md(session_serving_blocks(views))
    assert "## Start-up" in md
    assert "| server | healthy s | first token s | weights s | engine init s | cells |" in md
    assert "| --max-num-seqs 128 | 1.60 | 2.00 | 0.03 | 5.79 | 2 |" in md
    assert "| --speculative-config x | 1.50 | 1.70 | - | - | 2 |" in md
    assert session_serving_blocks([_view(1, CellResult())]) == []  # not launched: no table


def test_energy_columns_only_with_nvml() -> None:
    assert energy_columns([_view(1, CellResult())]) == ()
    cols = energy_columns([_view(1, CellResult(energy=Energy(j_per_output_token=0.321, mean_w=250.0)))])
    assert [(c.header, c.unit) for c in cols] == [("energy J/out tok", "J per output token"),
                                                  ("GPU power W (mean)", "W")]


def test_app_pane_lines() -> None:
    s = CellResult(tpot_ms=_tpot(2.66), spec_decode=SPEC, energy=Energy(j_per_output_token=0.321, mean_w=250.0),
                   adapters={"\x1b[31mred": AdapterFigures(requests=5, output_tok_s=12.0, ttft_ms=Dist(p50=90.0),
                                                           tpot_ms=Dist(p50=4.0))})
    lines = serving_lines(s)
    assert lines[0] == "spec decode: 38.5% of drafts accepted, 1.15 tok/draft (mean), 0.58 drafts/step; TPOT p50 2.66 ms"
    assert lines[1] == "adapter red: 5 req, 12.0 out tok/s, TTFT p50 90.0 ms, TPOT p50 4.00 ms"  # escape removed
    assert lines[-1] == "energy (NVML): 0.321 J/out tok, mean 250.0 W"
    assert serving_lines(CellResult()) == []  # nothing, no zeros


# ---- whole reports and compare, on sessions written by the real writer ------------------------------------------
def _session(base: Path, name: str, extra: dict[str, Any]) -> Any:
    path = base / f"20261201-120000-{name}"
    spec = bool(extra.get("spec_decode"))  # speculation: TPOT half at one user, growing faster with the load
    cells = [CellSpec("sharegpt", c, ttft_growth=1.0, tpot_ms=3.0 if spec else 6.0, tpot_growth=1.0 if spec else 0.2)
             for c in (1, 4, 16)]
    planned = plan([(PRESETS[c.workload], c.concurrency, c.requests) for c in cells])
    w, ran = sweep_session(path, name, planned, model="m", max_model_len=32768, tokenizer="server /tokenize")
    for cell, c in zip(planned, cells, strict=True):
        recs, wall = _records(c)
        df = records_frame(recs)
        s = summarize(df, wall, {})
        given = CellResult.from_dict(extra)  # the serving figures, as a stored summary carries them
        s = msgspec.structs.replace(s, **{k: getattr(given, k) for k in extra})
        w.write_cell({**cell.row(), **ran, "status": "done", "reason": ""}, df, s)
    w.finish("completed")
    return load_session(path)


ENERGY = {"energy": {"j_per_output_token": 0.5, "mean_w": 300.0}}


def test_report_and_compare_on_written_sessions(tmp_path: Path) -> None:
    off = _session(tmp_path, "off", {})
    on = _session(tmp_path, "on", {"spec_decode": SPEC.to_dict(), **ENERGY})
    md_off = render_report(off)
    assert "energy" not in md_off and "acceptance" not in md_off and "J/out tok" not in md_off  # no NVML: nothing
    md_on = render_report(on)
    assert "| energy J/out tok | GPU power W (mean) |" in md_on and "| 0.5 | 300.0 |" in md_on
    assert "| c=1 |" in md_on and "| 38.5% | 1.15 | 0.58 |" in md_on
    comp = compare_sessions([off, on])
    assert ENERGY_METRIC in comp.metrics  # a row when some session measured it (as the cost's)
    md = comparison_markdown(comp, level=2)
    assert "| energy J/out tok | - | 0.5 | - |" in md  # no delta without the first session's figure
    assert "### Speculative decoding: on vs off" in md
    assert "**sharegpt: speculation (on) lowers TPOT up to c=1, raises it from c=4** against off" in md
    both = compare_sessions([_session(tmp_path, "e1", ENERGY), _session(tmp_path, "e2", {"energy": {
        "j_per_output_token": 0.6, "mean_w": 310.0}})])
    assert ENERGY_METRIC in both.metrics
    md2 = comparison_markdown(both, level=2)
    assert "| energy J/out tok | 0.5 | 0.6 | +20.0% (no interval) |" in md2
    assert "energy J/out tok +20.0%" in md2  # the headline, beside the cost
    assert speculation_compare_blocks(both.labels, [(c.workload, c.cells) for c in both.cells], 3) == []


@pytest.mark.parametrize("reset", [True, False])
def test_report_warns_of_a_missed_target(tmp_path: Path, reset: bool) -> None:
    s = _session(tmp_path, "pc", {"prefix_cache_target": 0.5, "prefix_cache_reset": reset})
    md = render_report(s)
    assert "**Prefix cache under control**" in md
    assert ("did not offer a reset" in md) is (not reset)
