"""The README's examples are what users copy: its sweep-file TOML blocks must load as written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from servescope.engine.spec import SweepSpec

README = Path(__file__).resolve().parent.parent / "README.md"


def sweep_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Sweep files", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```toml\n(.*?)```", section, re.S)


def test_readme_sweep_file_examples_load() -> None:
    full, server = sweep_blocks()
    sw = SweepSpec.from_table(tomllib.loads(full), "README")
    assert [w.name for w in sw.workloads] == ["sharegpt", "longin", "rag-4k"]
    assert sw.url == "http://127.0.0.1:8000" and sw.concurrency == (1, 4, 16, 32)
    # the [server] block replaces [target] url
    data = tomllib.loads(full)
    del data["target"]["url"]
    data["server"] = tomllib.loads(server)["server"]
    sw = SweepSpec.from_table(data, "README")
    assert sw.launch is not None and sw.launch.startswith("vllm serve") and len(sw.variants) == 2
