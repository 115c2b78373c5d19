"""The TOML side of a sweep file: line numbers for error messages, unknown keys with a suggestion, and the
workloads of a sweep (presets and TOML files by name, others inline)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from servescope.core.errors import ServescopeError
from servescope.workloads.spec import Workload, context_sweep, resolve


def check_keys(table: Mapping[str, object], known: set[str], section: str, at: Callable[[str, str], str]) -> None:
    for k in table:
        if k not in known:
            near = difflib.get_close_matches(k, sorted(known), n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"expected one of {', '.join(sorted(known))}"
            shown = k if re.fullmatch(r"[A-Za-z0-9_\-]+", k) else repr(k)  # a key is data: one line
            raise ServescopeError(f"{at(section, shown)}: unknown key; {hint}")


class SectionLines:
    """Line numbers of keys in a TOML text, for error messages (file:line)."""

    def __init__(self, text: str, prefix: str = "") -> None:
        self.index: dict[tuple[str, str], int] = {}
        section = ""
        for n, line in enumerate(text.splitlines(), 1):
            s = line.strip()
            m = re.match(r"^\[\[?\s*([A-Za-z0-9_.\-\"]+)\s*\]\]?", s)
            if m:
                section = m.group(1).strip('"')
                if prefix and section.startswith(prefix):
                    section = section[len(prefix):]
                elif prefix and section == prefix.rstrip("."):
                    section = ""
                elif prefix:
                    section = "\0"
                self.index.setdefault((section.split(".")[0], ""), n)
                continue
            m = re.match(r"^([A-Za-z0-9_\-]+)\s*=", s)
            if m:
                self.index.setdefault((section, m.group(1)), n)

    def locate(self, section: str, key: str) -> int | None:
        return self.index.get((section, key)) or self.index.get((section, ""))


def table_workloads(data: Mapping[str, object], base_dir: Path | None, at: Callable[[str, str], str]) -> list[Workload]:
    names = data.get("workloads", [])
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ServescopeError(f"{at('', 'workloads')}: must be a list of preset names or TOML paths")
    resolved = [str((base_dir / n).resolve()) if (n.endswith(".toml") or "/" in n) and base_dir is not None
                and not Path(n).is_absolute() and not n.startswith("context-sweep/") else n for n in names]
    try:
        out: list[Workload] = resolve(resolved) if resolved else []
    except ServescopeError as e:
        raise ServescopeError(f"{at('', 'workloads')}: {e.message}") from None
    inline = data.get("workload", [])
    if isinstance(inline, dict):
        inline = [inline]
    if not isinstance(inline, list):
        raise ServescopeError(f"{at('workload', '')}: [[workload]] must be tables")
    for i, item in enumerate(inline):
        if not isinstance(item, dict):
            raise ServescopeError(f"{at('workload', '')}: [[workload]] {i + 1} must be a table")
        src = item.get("source")
        src = src if isinstance(src, str) and src not in ("preset",) else "inline"
        out.append(Workload.from_dict({**item, "source": src}, f"{at('workload', '')}: [[workload]] {i + 1}"))
    return out


def workload_refs(workloads: Sequence[Workload], inline_all: bool = False) -> tuple[list[str], list[dict[str, object]]]:
    """Presets by name (context-sweep's five as one name when all are there), TOML files by path unless
    `inline_all`, everything else as an inline table."""
    names: list[str] = []
    inline: list[dict[str, object]] = []
    cs = {w.name for w in context_sweep()}
    have_all_cs = cs <= {w.name for w in workloads if w.source == "preset"}
    for w in workloads:
        if w.source == "preset":
            ref = "context-sweep" if (w.name in cs and have_all_cs) else w.name
            if ref not in names:
                names.append(ref)
        elif not inline_all and w.source.endswith(".toml"):
            if w.source not in names:
                names.append(w.source)
        else:
            d: dict[str, object] = {k: v for k, v in w.to_dict().items() if k != "source" or inline_all}
            if not d.get("dataset"):
                d.pop("dataset", None)
            if w.description:
                d["description"] = w.description
            inline.append(d)
    return names, inline
