"""The README is the front door: short, the two set-up commands first and unchanged, and every link in it
leads somewhere. The examples users copy live in the docs now and are checked where they are: the sweep-file
TOML blocks of docs/measuring.md (*Sweep files*) must load as written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from servescope.engine.spec import SweepSpec
from servescope.workloads.spec import fixed, load_toml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MEASURING = ROOT / "docs" / "measuring.md"
TUNE = ROOT / "docs" / "tune.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"

SETUP = """```bash
python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/servescope demo   # install, then a sweep against the built-in simulator
./scripts/test.sh                                                                   # the whole test suite (installs what it needs; real vLLM included)
```"""


def test_readme_is_short_and_opens_with_the_two_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    first_block = text[text.index("```"):]
    assert first_block.startswith(SETUP), "the README's first block must be the two set-up commands, unchanged"
    assert text.index("```") < text.index("\n## "), "the set-up commands come before any section"
    # the command CI runs is the README's test command
    assert "exec ./scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_links_and_picture_exist() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[\w-]+)?\)", text)
    assert "docs/img/app-run.svg" in links and "docs/performance.md" in links
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def sweep_blocks() -> list[str]:
    text = MEASURING.read_text(encoding="utf-8")
    section = text.split("\n## Sweep files", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```toml\n(.*?)```", section, re.S)


def test_docs_sweep_file_examples_load() -> None:
    full, server = sweep_blocks()
    sw = SweepSpec.from_table(tomllib.loads(full), "docs")
    assert [w.name for w in sw.workloads] == ["sharegpt", "longin", "rag-4k"]
    assert sw.url == "http://127.0.0.1:8000" and sw.concurrency == (1, 4, 16, 32)
    # the [server] block replaces [target] url
    data = tomllib.loads(full)
    del data["target"]["url"]
    data["server"] = tomllib.loads(server)["server"]
    sw = SweepSpec.from_table(data, "docs")
    assert sw.launch is not None and sw.launch.startswith("vllm serve") and len(sw.variants) == 2


def test_tunes_bench_toml_is_a_whole_workload_file(tmp_path: Path) -> None:
    """docs/tune.md's example runs `-w bench.toml`: the file is there, whole, to copy (it was prose to type out)."""
    text = TUNE.read_text(encoding="utf-8")
    example = text.split("\n## Example", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```toml\n(.*?)```", example, re.S)
    assert "-w bench.toml" in example
    (tmp_path / "bench.toml").write_text(block, encoding="utf-8")
    [w] = load_toml(tmp_path / "bench.toml")
    assert (w.name, w.input_tokens, w.output_tokens) == ("bench", fixed(256), fixed(32))


def test_getting_started_says_how_servescope_is_on_the_path() -> None:
    """It switched from `.venv/bin/servescope` to bare `servescope` without a word; and the docs site's tools need an
    install the README user's venv can do (its pip has no `--group`)."""
    for page in (GETTING_STARTED, README):
        text = page.read_text(encoding="utf-8")
        first_bare = re.search(r"^servescope (?:run|sessions|compare|report|watch|quality)\b", text, re.M)
        assert first_bare is not None and "source .venv/bin/activate" in text[:first_bare.start()], page
        assert ".venv/bin/pip install 'mkdocs-material>=9.5'" in text, page
