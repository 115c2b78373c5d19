"""Your GPU against a hosted API, end to end on the simulator: a GPU-profile session priced by its hour
(`--gpu-hour`) and a hosted-mode session (`sim://tiny?hosted=1`: no /tokenize, lengths calibrated on its usage)
priced by its list price (`--price`), the same workload, compared with a plain `servescope compare A B`: its
Markdown shows the cost per 1M output tokens of both and the capacity sentence, and the figures are the
formulas of docs/hosted.md applied to what each cell measured."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import run_json, servescope

WL = '[workload]\nname = "chat"\ninput_tokens = 256\noutput_tokens = 32\n'
GPU_HOUR = 2.5
PRICE_IN, PRICE_OUT = 2.5, 10.0
RUN_JSON: dict[str, dict[str, object]] = {}  # each sweep's `run --json`, by side


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("hosted-cost")
    (tmp / "chat.toml").write_text(WL)
    common = ["-w", str(tmp / "chat.toml"), "-c", "1,4", "-n", "16", "--telemetry-interval", "off",
              "--sessions-dir", str(tmp / "s")]
    gpu = run_json("--url", "sim://tiny", "--name", "gpu", "--gpu-hour", str(GPU_HOUR), *common)
    api = run_json("--url", "sim://tiny?hosted=1&tpm=10000000", "--name", "api",
                   "--price", f"input={PRICE_IN},output={PRICE_OUT}", *common)
    RUN_JSON.update(gpu=gpu, api=api)
    yield Path(gpu["session"]), Path(api["session"])


@pytest.mark.slow  # two sweeps of 2 cells on the simulator: ~20-40 s on this 2-core machine
def test_compare_puts_the_cost_of_a_gpu_beside_an_apis(pair: tuple[Path, Path]) -> None:
    gpu, api = pair
    # --include-bound: on a busy machine the client may be bound in a cell (an answer then leaves it out)
    p = servescope("compare", str(gpu), str(api), "--include-bound")
    assert p.returncode == 0, p.stderr
    md = p.stdout
    # matched by plan with no special flag: a different tokenizer (calibrated on the API's usage) is no mismatch
    assert "Not comparable" not in md
    rows = [ln for ln in md.splitlines() if ln.startswith("|") and "cost $/1M out tok" in ln]
    assert len(rows) == 2  # one per common cell (c=1, c=4)
    for row in rows:
        vals = [c.strip() for c in row.strip("|").split("|")]
        assert vals[2] not in ("", "-") and vals[3] not in ("", "-"), row  # both sessions have a cost
    # the stored cells carry the cost, computed by the formulas from what each cell measured
    import polars as pl

    for session, gpu_side in ((gpu, True), (api, False)):
        for d in pl.read_parquet(session / "cells.parquet")["summary_json"].to_list():
            s = json.loads(d)
            cost = s["cost"]
            assert set(cost) == {"usd_per_1m_output_tokens", "usd_per_1m_total_tokens", "basis"}
            if gpu_side:
                want = GPU_HOUR / 3600 / s["output_tok_s"] * 1e6
                assert cost["basis"].startswith("gpu-hour $2.50 at ")
            else:
                want = PRICE_OUT + PRICE_IN * s["input_tokens_total"] / s["output_tokens_total"]
                assert cost["basis"].startswith("api list price")
            assert cost["usd_per_1m_output_tokens"] == pytest.approx(want, rel=1e-9)
    # the capacity sentence: the GPU's cost at its capacity at the SLOs against the API's at the same load
    m = re.search(r"(\d+) users \(the most measured; more may meet them\) cost \$([\d.]+) per 1M output tokens on "
                  r"this GPU \(gpu\) vs \$([\d.]+) on the API \(api\), which meets them at this load", md)
    assert m, md[-3000:]
    assert m.group(1) == "4"
    g = json.loads(pl.read_parquet(gpu / "cells.parquet").filter(pl.col("index") == 1)["summary_json"][0])
    a = json.loads(pl.read_parquet(api / "cells.parquet").filter(pl.col("index") == 1)["summary_json"][0])
    assert float(m.group(2)) == pytest.approx(g["cost"]["usd_per_1m_output_tokens"], abs=0.006)
    assert float(m.group(3)) == pytest.approx(a["cost"]["usd_per_1m_output_tokens"], abs=0.006)
    # the same in compare --json
    j = servescope("compare", str(gpu), str(api), "--include-bound", "--json")
    assert j.returncode == 0, j.stderr
    (row,) = json.loads(j.stdout)["cost_at_capacity"]
    assert (row["gpu"], row["api"], row["capacity"]) == ("gpu", "api", 4)
    assert row["gpu_usd_per_1m_output_tokens"] == pytest.approx(g["cost"]["usd_per_1m_output_tokens"])


@pytest.mark.slow
def test_each_sessions_report_shows_its_cost(pair: tuple[Path, Path]) -> None:
    gpu, api = pair
    for session, basis in ((gpu, "gpu-hour $2.50"), (api, "api list price")):
        p = servescope("report", str(session))
        assert p.returncode == 0, p.stderr
        head = next(ln for ln in p.stdout.splitlines() if ln.startswith("| load | ok / failed |"))
        assert head.rstrip(" |").endswith("cost $/1M out tok")
        assert "**Cost at capacity:** $" in p.stdout and basis in p.stdout
    toml = (gpu / "session.toml").read_text()
    assert "gpu_usd_per_hour = 2.5" in toml  # prices are stored (not secrets)


@pytest.mark.slow
def test_run_json_gives_each_cell_its_cost(pair: tuple[Path, Path]) -> None:
    """`run --json` cells carry `cost` (the issue's contract), the same figures the session stored."""
    import polars as pl

    for side, session in zip(("gpu", "api"), pair, strict=True):
        cells = RUN_JSON[side]["cells"]
        assert isinstance(cells, list) and len(cells) == 2
        stored = {r["index"]: json.loads(r["summary_json"])["cost"]
                  for r in pl.read_parquet(session / "cells.parquet").iter_rows(named=True)}
        for cell in cells:
            cost = cell["cost"]
            assert set(cost) == {"usd_per_1m_output_tokens", "usd_per_1m_total_tokens", "basis"}
            assert cost == stored[cell["index"]]
