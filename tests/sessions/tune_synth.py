"""A saved `servescope tune` session without running one: session.toml with a [tune] table as
servescope.engine.tunerun.tune_table writes it (a goodput search over --max-num-seqs, 5 measured cells, one
measured again), for the report, compare and app tests. `why` texts carry markup-like brackets: data, not markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w


def _step(n: int, seqs: int, c: int, why: str, value: float, relaunch: bool = False,
          band: tuple[float, float] | None = None) -> dict[str, Any]:
    return {"step": n, "server_args": f"--max-num-seqs {seqs}", "concurrency": c, "why": why,
            "objective": value, "relaunch": relaunch, "band": list(band) if band else [],
            "cell": f"cells/{n:03d}-c{c}-max-num-seqs{seqs}"}


def tune_table(best_seqs: int = 32) -> dict[str, Any]:
    return {
        "objective": "goodput", "unit": "req/s",
        "search": [{"flag": "--max-num-seqs", "values": ["8", "16", "32"], "scale": "log"}],
        "loads": [2, 4, 8, 16], "grid_cells": 12, "budget": 6, "cells_measured": 5, "relaunches": 2,
        "confirmed": True, "stop": "no unmeasured cell has a chance of beating the best", "seconds": 41.4,
        "fits": "",
        "best": {"server_args": f"--max-num-seqs {best_seqs}", "concurrency": 8, "objective": 24.5,
                 "ci": [18.0, 30.9], "serve": f"servescope sim --profile tiny --max-num-seqs {best_seqs}"},
        "runner_up": {"server_args": "--max-num-seqs 16", "concurrency": 8, "objective": 21.25, "measured": True,
                      "why": "measured 21.2 req/s at c=8, 13% below the best [bold]x[/bold]"},
        "path": [_step(1, 16, 4, "design", 11.4), _step(2, 16, 8, "design", 21.25),
                 _step(3, 32, 16, "design", 0.0, relaunch=True),
                 _step(4, 32, 8, "chance 62% to beat 21.2", 26.0, band=(15.0, 29.5)),
                 _step(5, 32, 8, "measure again: the best", 23.0)],
        "predicted": [{"server_args": f"--max-num-seqs {s}", "concurrency": c, "low": 1.0, "mid": 2.0, "high": 3.0}
                      for s in (8, 16, 32) for c in (2, 4, 8, 16)],
    }


def write_tune_session(d: Path, name: str = "tune-short", best_seqs: int = 32, status: str = "completed") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "schema_version": 4, "servescope_version": "0.1.0", "started_at": "2026-12-07T01:28:37+0000",
        "status": status, "kind": "tune", "name": name, "model": "tiny",
        "target": {"url": "servescope sim --profile tiny"}, "slos": {"ttft_ms": 500.0, "tpot_ms": 30.0},
    }
    if status == "completed":
        meta["tune"] = tune_table(best_seqs)
    (d / "session.toml").write_text(tomli_w.dumps(meta))
    return d
