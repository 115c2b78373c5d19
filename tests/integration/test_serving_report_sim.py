"""The report of a sweep a GPU box's user runs, end to end on the simulator through the CLI: speculation off and on
as two server variants, an adapters workload (its adapter named with Markdown and HTML syntax) and a workload aiming
at a prefix-cache hit rate, with --reset-prefix-cache. The Markdown report names the crossover load, lists each
adapter's figures (escaped), compares the two launches' start-up and shows the prefix cache's aim against its
measured hit rate; the HTML report escapes the adapter's name too. Compare across sessions is tested on written
sessions (tests/reports/test_serving_doc.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import servescope

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
WORKLOADS = """
[[workload]]
name = "chat-spec"
input_tokens = 256
output_tokens = 128
spec_acceptance = 0.6

[[workload]]
name = "lora"
input_tokens = 128
output_tokens = 32
adapters = { "sql|<x>" = 0.7, chat = 0.3 }

[[workload]]
name = "rag-half"
input_tokens = 512
output_tokens = 16
prefix_cache_hit_rate = 0.5
"""


@pytest.mark.slow  # two launches, 12 cells in real time: about 45 s on 2 cores
def test_report_of_speculation_adapters_and_the_prefix_cache(tmp_path: Path) -> None:
    (tmp_path / "mix.toml").write_text(WORKLOADS)
    p = servescope("run", "--launch", f"{sys.executable} -m servescope.sim --profile tiny",
                   "--server-variant", "--max-num-seqs 128", "--server-variant", f"--speculative-config '{NGRAM}'",
                   "-w", str(tmp_path / "mix.toml"), "-c", "1,64", "-n", "64", "--duration", "4s",
                   "--reset-prefix-cache", "--save", str(tmp_path / "s"))
    assert p.returncode == 0, p.stderr[-3000:]
    table = p.stdout + p.stderr  # the run's per-cell table has the same figures
    assert "speculative decoding (/metrics):" in table and "adapter sql|<x>:" in table
    assert "prefix cache hit rate:" in table and "aimed at by the workload" in table
    r = servescope("report", str(tmp_path / "s"), "-o", str(tmp_path / "r.md"))
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "r.md").read_text()
    # speculation: each speculating cell's acceptance beside its TPOT, and the crossover named
    assert "| load | TPOT ms p50 / p90 / p99 | acceptance rate | accepted tokens per draft (mean) | drafts per step " \
           "(mean) |" in md
    assert "## Speculative decoding: on vs off" in md
    assert "**chat-spec: speculation lowers TPOT up to c=1, raises it from c=64**" in md
    # adapters: a row per adapter, the name escaped for Markdown
    assert "| load | adapter | requests | output tok/s | TTFT ms p50 | TPOT ms p50 |" in md
    rows = re.findall(r"^\| (?:c=\d+)? ?\| (sql\\\|\\<x\\>|chat) \| (\d+) \|", md, re.M)
    assert {name for name, _ in rows} == {r"sql\|\<x\>", "chat"}, rows
    assert "<x>" not in md.replace("`", "")
    # start-up: one row per launch
    start = md[md.index("## Start-up"):md.index("## Notes")]
    assert "| server | healthy s | first token s |" in start
    assert "| --max-num-seqs 128 |" in start and "| --speculative-config" in start
    # the prefix cache: aimed at 50%, reset before every cell
    pc = md[md.index("## Results: rag-half [--max-num-seqs 128]".replace("[", r"\[").replace("]", r"\]")):]
    assert "| load | hit rate aimed at | hit rate measured | cache reset before the cell |" in pc
    assert re.search(r"\| c=1 \| 50% \| 4\d\.\d% \| yes \|", pc), pc[:2000]
    assert "did not offer a reset" not in md
    h = servescope("report", str(tmp_path / "s"), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert h.returncode == 0, h.stderr[-3000:]
    html = (tmp_path / "r.html").read_text()
    assert "sql|&lt;x&gt;" in html and "<x>" not in html
    assert "speculation lowers TPOT up to c=1, raises it from c=64" in html
