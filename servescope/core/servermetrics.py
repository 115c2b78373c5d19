"""A server's /metrics text (Prometheus' text format), read two ways.

`MetricsReader` is the scrape's reader (core/telemetry.py's `parse_metrics`): it reads only the sample names it is
built with and skips every other family without parsing it. vLLM's /metrics is ~70 kB, mostly histogram buckets and
families servescope never shows; a family block (its `# HELP` / `# TYPE` lines and the samples after them) whose
name no wanted sample starts with is stepped over with two byte counts, its lines never split, decoded or parsed. A
block whose lines do not all start with its family's name (samples with no `# TYPE` line of their own, blank lines,
a server that does not group its families) is read line by line, so nothing wanted is lost to the shortcut.

`parse` sums every sample of the whole text over its labels with prometheus_client's parser, for tests and
benchmarks. Old and new metric names are accepted by both."""

from __future__ import annotations

import re
from collections.abc import Iterable

# new name -> older names that meant the same
ALIASES = {
    "vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",),
    "vllm:request_success": ("vllm:request_success_total",),
}

Samples = dict[str, float]  # "name" or "name{k=v,...}" summed over labels -> value

SUFFIXES = ("_total", "_sum", "_count", "_bucket", "_created", "_info")  # a sample's name = its family's + one

# one `name="value"` label (the value may hold escaped quotes and backslashes)
_LABEL = re.compile(rb'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*,?')
MAX_LABEL_SETS = 256  # label texts `labels_of` remembers
_LABELS_SEEN: dict[bytes, dict[str, str]] = {}
_HEAD = 4096  # bytes of a text that starts with a `# TYPE` line looked at for it (a family name is shorter)
_UNESCAPE = {b"\\\\": "\\", b'\\"': '"', b"\\n": "\n"}
_ESC = re.compile(rb'\\[\\"n]')


def family_names(name: str) -> set[str]:
    """The family names a sample `name` may be exposed under: itself, and itself less one of `SUFFIXES`."""
    out = {name}
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            out.add(name[: -len(suffix)])
    return out


def labels_of(raw: bytes) -> dict[str, str]:
    """A sample's label text (between its braces) as {name: value}, escapes undone (`\\\\`, `\\"`, `\\n`). The same
    text read again (an info metric's labels, at every scrape) comes from a small memo: the caller must not change
    the dict it gets."""
    got = _LABELS_SEEN.get(raw)
    if got is not None:
        return got
    out: dict[str, str] = {}
    for m in _LABEL.finditer(raw):
        v = m.group(2)
        out[m.group(1).decode("ascii")] = (_ESC.sub(lambda e: _UNESCAPE[e.group(0)].encode(), v) if b"\\" in v
                                           else v).decode("utf-8", "replace")
    if len(_LABELS_SEEN) >= MAX_LABEL_SETS:
        _LABELS_SEEN.clear()
    _LABELS_SEEN[raw] = out
    return out


def _trie(words: list[bytes]) -> bytes:
    """A regular expression matching exactly `words`, as a trie (`vllm:(?:a|b)` rather than `vllm:a|vllm:b`): the
    engine tests each byte once instead of trying every word in turn."""
    if len(words) == 1:
        return re.escape(words[0])
    ends = b"" in words
    by_first: dict[int, list[bytes]] = {}
    for w in words:
        if w:
            by_first.setdefault(w[0], []).append(w[1:])
    alts = []
    for first, rests in sorted(by_first.items()):
        # the longest prefix every rest shares goes out of the group as one literal
        common = rests[0]
        for r in rests[1:]:
            k = 0
            while k < min(len(common), len(r)) and common[k] == r[k]:
                k += 1
            common = common[:k]
        alts.append(re.escape(bytes([first]) + common) + _trie([r[len(common):] for r in rests])
                    if len(rests) > 1 else re.escape(bytes([first]) + rests[0]))
    body = alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
    return b"(?:" + body + b")?" if ends else body


class MetricsReader:
    """Reads the samples named in `names` from a /metrics text, skipping every other family unread.

    `samples(data)` gives (name, label text, value) for each sample line of a wanted name, in the text's order: the
    label text is what stood between the braces (b"" without), for `labels_of`; the value a float (a line whose value
    does not read as one is left out, as is a malformed line).

    Where it looks: the format puts a family's samples after its `# TYPE` line, grouped; one regular expression finds
    the `# TYPE` lines of the wanted families (any name a wanted sample is exposed under: `family_names`), and only
    the lines from each to the next comment line are read. A text with no `# TYPE` line at all is read line by line."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self._wanted = frozenset(n.encode() for n in self.names)
        # family name -> the wanted sample names exposed under it, each with the line end before it
        self._in: dict[bytes, tuple[bytes, ...]] = {}
        for n in sorted(self.names):
            for f in family_names(n):
                self._in[f.encode()] = (*self._in.get(f.encode(), ()), b"\n" + n.encode())
        fams = sorted(self._in)
        alt = _trie(fams) if fams else b"(?!)"
        # a literal start ("\n# TYPE "): the regular expression engine jumps from one to the next
        self._type = re.compile(rb"\n# TYPE (" + alt + rb")[ \t\r\n][^\n]*")

    def samples(self, data: bytes) -> list[tuple[str, bytes, float]]:
        out: list[tuple[str, bytes, float]] = []
        find = data.find
        n = len(data)
        seen = False
        first = self._type.match(b"\n" + data[:_HEAD]) if data.startswith(b"# TYPE ") else None
        for m in (first, *self._type.finditer(data)):
            if m is None:
                continue
            seen = True
            pos = m.end() - (m.string is not data)  # the TYPE line's end (`first` read one more byte than the text)
            end = find(b"\n#", pos)  # the family's samples run to the next comment line
            if end < 0:
                end = n
            for key in self._in[m.group(1)]:  # each wanted sample of this family, wherever a line starts with it
                at = find(key, pos, end)
                while at >= 0:
                    stop = find(b"\n", at + 1, end)
                    self._line(data[at + 1: end if stop < 0 else stop], len(key) - 1, out)
                    at = find(key, at + 1, end) if stop >= 0 else -1
        if not seen and not data.startswith(b"# TYPE ") and find(b"\n# TYPE ") < 0:
            wanted = self._wanted  # no family says its type: every line may be a wanted sample
            for line in data.split(b"\n"):
                brace, space = line.find(b"{"), line.find(b" ")
                cut = brace if brace >= 0 and (space < 0 or brace < space) else space
                if cut > 0 and line[:cut] in wanted:
                    self._line(line, cut, out)
        return out

    @staticmethod
    def _line(line: bytes, cut: int, out: list[tuple[str, bytes, float]]) -> None:
        """One sample line whose name is `line[:cut]` (if the name ends there: else another sample's line)."""
        labels = b""
        if line[cut:cut + 1] == b"{":  # the labels end at the last "}" (a value and a timestamp hold none)
            close = line.rfind(b"}")
            if close < 0:
                return  # not a sample line we can read
            labels = line[cut + 1: close]
            rest = line[close + 1:]
        elif line[cut:cut + 1] in (b" ", b"\t"):
            rest = line[cut:]
        else:
            return  # a longer name that starts with this one
        parts = rest.split()
        if not parts:
            return
        try:
            value = float(parts[0])
        except ValueError:
            return
        out.append((line[:cut].decode("ascii"), labels, value))


def parse(text: str) -> dict[str, float]:
    """Sum each sample over its labels: {'vllm:request_success_total': 50.0, ...}; also keeps
    `vllm:cache_config_info` labels under 'cache_config.<label>'."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name == "vllm:cache_config_info":
                for k, v in s.labels.items():
                    try:
                        out[f"cache_config.{k}"] = float(v)
                    except ValueError:
                        pass
                continue
            if name.endswith("_bucket"):
                continue
            out[name] = out.get(name, 0.0) + float(s.value)
    for new, olds in ALIASES.items():
        for old in olds:
            if new not in out and old in out:
                out[new] = out[old]
    return out
