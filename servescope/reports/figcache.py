"""A finished session's figures, drawn once and kept: the drawing (SVG, and PNG when it was asked for) is stored
in the folder the figure spec names (`FigureSpec.cache_dir`: the session's figures/ folder) under a key made of
everything the figure shows (the spec's data: its series, points, tooltips, marks and captions) and of the
drawing code's version (the source of the modules that draw, and matplotlib's version). A changed spec or
changed drawing code is another key, so a kept drawing is never stale: it is drawn again and kept beside the
newest others of the same figure (`KEEP`); the oldest go.

Keeping is an optimisation, never a requirement: a folder that cannot be written (a read-only session) or a
kept file that cannot be read only means the figure is drawn again."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
from importlib import metadata
from pathlib import Path

from servescope.reports.figures import FigureSpec

__all__ = ["KEEP", "code_version", "key_of", "load", "store"]

KEEP = 4  # drawings kept per figure name (a report with and without --slo, a few comparisons)
DRAWING_MODULES = ("figures_svg.py", "figlayout.py", "figcache.py")
_version: str | None = None


def code_version() -> str:
    """The drawing code's version: its modules' source and matplotlib's version (read once per process)."""
    global _version
    if _version is None:
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        for name in DRAWING_MODULES:
            h.update((here / name).read_bytes())
        try:
            h.update(metadata.version("matplotlib").encode())
        except metadata.PackageNotFoundError:
            h.update(b"no matplotlib")
        _version = h.hexdigest()
    return _version


def _fields(o: object) -> object:
    """A dataclass as its fields (the spec's folder left out: where a drawing is kept is not what it shows)."""
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.name != "cache_dir"}
    return str(o)


def key_of(spec: FigureSpec) -> str:
    """What the figure shows and who draws it, as 20 hex digits."""
    blob = json.dumps(spec, default=_fields, sort_keys=True, allow_nan=True).encode()
    return hashlib.sha256(code_version().encode() + b"\0" + blob).hexdigest()[:20]


def _paths(folder: Path, name: str, key: str) -> tuple[Path, Path]:
    stem = f"{name}-{key}"
    return folder / f"{stem}.svg", folder / f"{stem}.png"


def load(spec: FigureSpec, png: bool, key: str | None = None) -> tuple[str, bytes | None] | None:
    """The kept drawing of this spec (its SVG element, and its PNG when `png`), or None. `key`: key_of(spec),
    when the caller has it already."""
    if spec.cache_dir is None:
        return None
    svg_p, png_p = _paths(spec.cache_dir, spec.name, key or key_of(spec))
    try:
        svg = svg_p.read_text(encoding="utf-8")
        data = png_p.read_bytes() if png else None
    except (OSError, UnicodeDecodeError):
        return None
    with contextlib.suppress(OSError):
        os.utime(svg_p)  # used: the last to go
    return svg, data


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(spec: FigureSpec, svg: str, png: bytes | None, key: str | None = None) -> None:
    """Keep the drawing (PNG first: an SVG on disk means the drawing is whole); drop the oldest beyond KEEP."""
    if spec.cache_dir is None:
        return
    key = key or key_of(spec)
    svg_p, png_p = _paths(spec.cache_dir, spec.name, key)
    try:
        spec.cache_dir.mkdir(parents=True, exist_ok=True)
        if png is not None:
            _write(png_p, png)
        _write(svg_p, svg.encode("utf-8"))
        _prune(spec.cache_dir, spec.name, keep=key)
    except OSError:
        return  # a folder we may not write to: the figure is simply drawn again next time


def _prune(folder: Path, name: str, keep: str) -> None:
    pat = re.compile(re.escape(name) + r"-([0-9a-f]{20})\.(svg|png)$")
    mine: dict[str, list[Path]] = {}
    for p in folder.iterdir():
        m = pat.match(p.name)
        if m:
            mine.setdefault(m.group(1), []).append(p)

    def used(k: str) -> float:
        return max((p.stat().st_mtime for p in mine[k] if p.suffix == ".svg"), default=0.0)

    old = sorted((k for k in mine if k != keep), key=used, reverse=True)[KEEP - 1:]
    for k in old:
        for p in mine[k]:
            with contextlib.suppress(OSError):
                p.unlink()
