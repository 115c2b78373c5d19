"""The docs site (docs/, mkdocs.yml) builds with `mkdocs build --strict`: a broken link or anchor, a missing page or
a page left out of the nav fails it. Its generated parts (scripts/gen_docs.py: the CLI reference, the preset,
metric and compare tables, the app's screenshots) are what the code produces today, and every command's
`--help` ends with a docs page that exists."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REGENERATE = "run `.venv/bin/python scripts/gen_docs.py` and commit what it writes"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = mod
    spec.loader.exec_module(mod)
    return mod


gen_docs = _gen_docs()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with --strict into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    warnings = [ln for ln in (r.stdout + r.stderr).splitlines() if "WARNING" in ln or "ERROR" in ln]
    assert r.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + "\n".join(warnings or
                                                                                              [r.stdout, r.stderr])
    return out


def test_the_site_builds_strict_with_every_page_in_the_nav(site: Path) -> None:
    pages = {p.relative_to(DOCS).with_suffix(".html").as_posix() for p in DOCS.rglob("*.md")
             if "data" not in p.relative_to(DOCS).parts}
    built = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p for p in sorted(pages) if p.removesuffix(".html") + ".md" not in nav]
    assert not missing, f"pages missing from the nav in mkdocs.yml: {missing}"


def test_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """The check has teeth: the same configuration over a page with a link to a page that does not exist fails."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [nowhere](nowhere.md) and [here](#no-such-anchor).\n")
    cfg = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    cfg = re.sub(r"(?ms)^nav:.*", "nav:\n  - Home: index.md\n", cfg)
    (tmp_path / "mkdocs.yml").write_text(cfg)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "nowhere.md" in r.stderr + r.stdout and "no-such-anchor" in r.stderr + r.stdout


def test_the_generated_pages_are_current() -> None:
    stale = [str(path.relative_to(ROOT)) for path, text in gen_docs.text_files().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"out of date: {stale}; {REGENERATE}"


def test_the_cli_reference_has_every_command_and_flag() -> None:
    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    parser = gen_docs.top_parser()
    for name, sp in gen_docs._subcommands(parser).items():
        assert f"## servescope {name} {{#{name}}}" in text
        if name != "sim":
            for action in sp._actions:
                for flag in action.option_strings:
                    assert flag in text, f"servescope {name} {flag} is not in docs/reference/cli.md"


def test_the_preset_and_metric_tables_name_every_preset_and_metric() -> None:
    from servescope.core.results import METRICS
    from servescope.workloads.spec import COMPOSITE, PRESETS

    measuring = (DOCS / "measuring.md").read_text(encoding="utf-8")
    for name in [*PRESETS, *COMPOSITE]:
        assert f"| `{name}` |" in measuring
    metrics = (DOCS / "metrics.md").read_text(encoding="utf-8")
    for key in METRICS:
        assert f"| `{key}` |" in metrics


@pytest.mark.slow  # the app opened 9 times, one screen each: ~25 s on 2 cores
def test_the_screenshots_show_what_the_app_draws_today() -> None:
    """Each docs/img/app-*.svg says what the app says today on the recorded sessions (text compared, not pixels)."""
    stale = []
    for name, svg in gen_docs.screenshots().items():
        path = DOCS / "img" / f"{name}.svg"
        if not path.exists() or gen_docs.svg_text(path.read_text(encoding="utf-8")) != gen_docs.svg_text(svg):
            stale.append(path.name)
    assert not stale, f"screenshots out of date: {stale}; {REGENERATE}"


def test_svg_text_reads_a_screenshot_line_by_line() -> None:
    svg = gen_docs.screenshots(["app-sessions"])["app-sessions"]
    text = gen_docs.svg_text(svg)
    assert "qwen35-fp8" in text and "qwen35-gptq-int4" in text
    assert "<" not in text  # markup is gone, entities are decoded
    assert gen_docs.svg_text(svg.replace("terminal-", "other-")) == text  # ids do not count


def test_every_screenshot_is_shown_on_a_page() -> None:
    pages = "".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    for name in gen_docs.SHOTS:
        assert f"img/{name}.svg" in pages, f"docs/img/{name}.svg is on no page"


def _epilogs(p: argparse.ArgumentParser, prog: str = "servescope") -> dict[str, str]:
    out = {prog: p.format_help()}
    for name, sp in gen_docs._subcommands(p).items():
        out.update(_epilogs(sp, f"{prog} {name}"))
    return out


def test_every_help_ends_with_the_docs_page_that_covers_it(site: Path) -> None:
    helps = _epilogs(gen_docs.top_parser())
    assert "servescope run" in helps and "servescope twin fit" in helps
    for prog, text in helps.items():
        last = " ".join(text.split("\n\n")[-1].split())
        assert last.startswith("docs: docs/"), f"`{prog} --help` does not end with its docs page: {last!r}"
        for page, anchor in re.findall(r"docs/([\w/-]+\.md)(?:#([\w-]+))?", last):
            assert (DOCS / page).is_file(), f"`{prog} --help` names docs/{page}, which does not exist"
            if anchor:
                html = (site / page.replace(".md", ".html")).read_text(encoding="utf-8")
                assert f'id="{anchor}"' in html, f"`{prog} --help` names docs/{page}#{anchor}: no such anchor"


def test_the_commands_args_py_declares_end_with_their_docs_page() -> None:
    """The subcommands whose flags cli/args.py declares carry their docs line in `servescope X --help` itself."""
    from servescope.__main__ import _parser

    subs = gen_docs._subcommands(_parser())
    for name in ("run", "resume", "sessions", "compare", "gate", "report", "import", "quality", "twin", "whatif",
                 "tune", "watch", "attach", "tui"):
        sp = subs[name]
        assert sp.epilog and sp.epilog.startswith("docs: docs/"), f"servescope {name} --help has no docs line"
