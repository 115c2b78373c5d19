"""The app shows what a GPU box's user changes next: the Run screen's events and the Results screen's per-cell
panel carry a cell's speculative decoding (beside its TPOT), its LoRA adapters' figures and its energy per output
token, and nothing for a cell without them; the app's simulators serve the adapters a sweep's workloads name
(engine/serving.py sim_serving_args), so an adapters workload runs against sim:// from the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from servescope.core.results import CellResult
from servescope.engine import wire as w
from servescope.sessions.store import SessionWriter
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import EventLog
from servescope.tui.widgets.panels import TelemetryPanel
from servescope.workloads.spec import PRESETS
from tests.support.meta import meta_of, set_meta

from .fixtures import summary_for
from .test_session_quality import open_session, screen_text

# the --fast lane leaves this module out: 3 tests, ~10 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SERVING: dict[str, Any] = {
    "spec_decode": {"acceptance_rate": 0.385, "mean_accepted_tokens": 1.15, "drafts_per_step": 0.58},
    "adapters": {"sql": {"requests": 40, "output_tok_s": 812.5, "ttft_ms": {"p50": 198.1}, "tpot_ms": {"p50": 6.14}}},
    "energy": {"j_per_output_token": 0.321, "mean_w": 250.0},
}
CELLS = [m.CellInfo(i, "sharegpt", f"c={c}", c, None, 20, None, "in 200-512 (uniform) / out 256 (chat)")
         for i, c in enumerate((1, 4))]


async def test_run_screen_says_each_cells_serving_figures(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None, "t",
                                                       True)))
        with_figures = CellResult.from_dict({"requests_ok": 40, "tpot_ms": {"p50": 2.66}, **SERVING})
        for cell, s in zip(CELLS, (with_figures, CellResult(requests_ok=20)), strict=True):
            run.post_message(m.CellStarted(w.CellStarted(cell, 2)))
            run.post_message(m.CellFinished(w.CellFinished(cell, s, "done")))
        await pilot.pause()
        log = " ".join(" ".join(ln.text for ln in run.query_one(EventLog).lines).split())
        assert ("cell 1 spec decode: 38.5% of drafts accepted, 1.15 tok/draft (mean), 0.58 drafts/step; TPOT p50 "
                "2.66 ms") in log
        assert "cell 1 adapter sql: 40 req, 812.5 out tok/s, TTFT p50 198.1 ms, TPOT p50 6.14 ms" in log
        assert "cell 1 energy (NVML): 0.321 J/out tok, mean 250.0 W" in log
        for what in ("spec decode", "adapter", "energy"):
            assert f"cell 2 {what}" not in log  # a cell without them: nothing, no zeros


def _session(base: Path) -> Path:
    path = base / "20261201-100000-spec"
    meta = {"name": "spec", "target": {"url": "sim://tiny", "version": "0.32.0-sim", "metrics": True,
                                       "tokenizer": "server /tokenize"},
            "model": "tiny", "max_model_len": 8192, "workloads": [PRESETS["sharegpt"].to_dict()],
            "cells": [{"index": i, "workload": "sharegpt", "concurrency": c, "load_label": f"c={c}",
                       "status": "planned"} for i, c in enumerate((1, 4))]}
    wr = SessionWriter.create(path, meta_of(**meta))
    for i, c in enumerate((1, 4)):
        df, s = summary_for(c)
        if i == 0:
            s.update(SERVING)
        row = {"index": i, "workload": "sharegpt", "api": "chat", "concurrency": c, "rate": None, "arrival": None,
               "max_concurrency": None, "requests_planned": 60, "duration_s_planned": None, "warmup": 0,
               "load_label": f"c={c}", "status": "done", "reason": ""}
        wr.write_cell(row, df, CellResult.from_dict(s))
    set_meta(wr, started_at="2026-12-01T10:00:00+0000")
    wr.finish("completed")
    return path


async def test_results_screen_shows_the_highlighted_cells_figures(home: Path) -> None:
    _session(home / "sessions")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(160, 48)) as pilot:
        scr = await open_session(pilot)
        panel = scr.query_one(TelemetryPanel)
        assert panel.display
        lines = panel.gpu_lines
        assert "cell 1 spec decode: 38.5% of drafts accepted, 1.15 tok/draft (mean), 0.58 drafts/step; TPOT p50 " \
               f"{CellResult.from_dict(summary_for(1)[1]).tpot_ms.p50:,.2f} ms" in lines
        assert "cell 1 adapter sql: 40 req, 812.5 out tok/s, TTFT p50 198.1 ms, TPOT p50 6.14 ms" in lines
        assert "cell 1 energy (NVML): 0.321 J/out tok, mean 250.0 W" in lines
        shown = screen_text(app)  # drawn in the panel, whole at this width
        assert "cell 1 spec decode: 38.5% of drafts accepted" in shown and "cell 1 energy (NVML): 0.321" in shown
        scr.show_cell(1)
        await pilot.pause()
        assert not any("spec decode" in ln or "energy" in ln or "adapter" in ln for ln in panel.gpu_lines)


def test_the_apps_simulator_serves_the_sweeps_adapters(home: Path) -> None:
    """A sweep of an adapters workload against sim:// from the app (its SimPool): every request names an adapter
    the simulator serves, so the cell completes with per-adapter figures (without the adapters in the simulator's
    flags, each request was refused: model not found)."""
    from servescope.engine.spec import SweepSpec
    from servescope.tui.sweepworker import SimPool, SweepDriver
    from servescope.workloads.spec import load_toml

    (home / "lora.toml").write_text('[workload]\nname = "lora"\napi = "completions"\ninput_tokens = 32\n'
                                    'output_tokens = 8\nadapters = { sql = 0.5, chat = 0.5 }\n')
    spec = SweepSpec(url="sim://tiny", workloads=tuple(load_toml(home / "lora.toml")), concurrency=(2,), requests=8,
                     name="lora")
    pool = SimPool()
    try:
        got: list[Any] = []
        assert SweepDriver(got.append, mode="thread").run(spec, pool, home / "sessions") == "completed"
        [done] = [x for x in got if isinstance(x, m.CellFinished)]
        s: CellResult = done.summary
        assert s.requests_ok == 8 and s.requests_failed == 0
        assert s.adapters is not None and set(s.adapters) == {"sql", "chat"}
        assert sum(a.requests for a in s.adapters.values()) == 8
        # a probe (no flags of its own) reuses the sweep's simulator, which lists the adapters
        url, label = pool.resolve("sim://tiny")
        assert label == "sim://tiny"
        ids = {x["id"] for x in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
        assert {"sql", "chat"} <= ids
    finally:
        pool.stop_all()

