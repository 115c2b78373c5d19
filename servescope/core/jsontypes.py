"""JSON as servescope reads and writes it, typed: `Json` is a value a JSON document may hold, `JsonObject` a JSON
object (what `json.loads` gives for `{...}`, what a `--format json` output or a `to_dict()` writes). It is tighter
than `dict[str, object]`: a value that cannot be written as JSON (a Path, a Struct, a set) is a type error where it
is put in, not a failure where it is written. A document whose shape is known has a TypedDict or a Struct of its
own (the run's cells: cli/run.py CellJson; session.toml: sessions/meta.py SessionMeta); this is for the documents
servescope passes on as they are (a server's reply, an event's fields, a twin's tables) and the leaves of the typed
ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

__all__ = ["Json", "JsonObject"]

# its containers read-only, so a list[str] or a dict[str, float] is one as it is
Json: TypeAlias = "str | int | float | bool | None | Sequence[Json] | Mapping[str, Json]"
JsonObject: TypeAlias = "dict[str, Json]"
