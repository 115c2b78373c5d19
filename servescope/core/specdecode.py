"""Speculative decoding and LoRA as vLLM's `/metrics` tell them, over one cell: from the cell's two boundary samples
(`core.telemetry.MetricsSampler.snapshot`, read by `parse_metrics`), as `server_delta` gives the rest.

vLLM 0.32's names (vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py):
- `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
  `vllm:spec_decode_num_accepted_tokens_total` (counters, present only when the server speculates) and
  `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`;
- `vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}`: a gauge set to the time it
  was set, one series per label set ever seen (comma-separated adapter names): a series whose time moved between
  two samples was set between them, so the adapters it names ran then. vLLM counts no requests per adapter.

`parse_metrics` keeps the counters summed over label sets, and each adapter's newest time under
`lora.running.<name>` (`lora.max_lora`: the server's --max-loras)."""

from __future__ import annotations

from collections.abc import Mapping

from servescope.core.results import SpecDecode

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION = ("vllm:generation_tokens_total", "vllm:generation_tokens")
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
LORA_INFO = "vllm:lora_requests_info"
LORA_RUNNING = "lora.running."  # parse_metrics' key prefix: an adapter's newest series time
LORA_MAX = "lora.max_lora"

Parsed = Mapping[str, float | str]


def lora_keys(labels: Mapping[str, str], value: float, out: dict[str, float | str]) -> None:
    """One `vllm:lora_requests_info` sample into parse_metrics' output: each running adapter's newest time."""
    for name in labels.get("running_lora_adapters", "").split(","):
        if name:
            key = LORA_RUNNING + name
            prev = out.get(key)
            out[key] = max(value, prev) if isinstance(prev, float) else value
    try:
        out[LORA_MAX] = float(labels.get("max_lora", ""))
    except ValueError:
        pass


def _num(parsed: Parsed, name: str) -> float | None:
    v = parsed.get(name)
    return v if isinstance(v, float) else None


def spec_decode_delta(before: Parsed | None, after: Parsed | None) -> SpecDecode | None:
    """Speculative decoding over a cell from its two samples; None when the server does not speculate (it exports
    no spec-decode counters) or a sample is missing. A cell in which nothing was drafted has drafts_per_step 0 and
    no acceptance."""
    if not before or not after or any(_num(after, n) is None for n in SPEC_COUNTERS):
        return None

    def d(name: str) -> float:  # a counter's increase (one that went down started again: a restarted server)
        a, b = _num(after, name) or 0.0, _num(before, name) or 0.0
        return a - b if a >= b else a

    drafts, drafted, accepted = d(DRAFTS), d(DRAFT_TOKENS), d(ACCEPTED)
    gen_name = next((n for n in GENERATION if _num(after, n) is not None), None)
    generated = d(gen_name) if gen_name is not None else None
    steps = generated - accepted if generated is not None else None
    return SpecDecode(
        acceptance_rate=accepted / drafted if drafted > 0 else None,
        mean_accepted_tokens=accepted / drafts if drafts > 0 else None,
        drafts_per_step=drafts / steps if steps is not None and steps > 0 else (0.0 if not drafts else None),
    )


def lora_window(before: Parsed | None, after: Parsed | None) -> tuple[list[str], int | None] | None:
    """The adapters vLLM's `vllm:lora_requests_info` showed running between two samples (a series set between
    them, so the comparison needs no clock shared with the server), and its --max-loras; None when the server
    serves no adapters."""
    if not after or LORA_MAX not in after:
        return None
    before = before or {}
    running = sorted(k[len(LORA_RUNNING):] for k, v in after.items()
                     if k.startswith(LORA_RUNNING) and isinstance(v, float)
                     and not (isinstance(b := before.get(k), float) and b >= v))
    m = after.get(LORA_MAX)
    return running, int(m) if isinstance(m, float) else None


def accepted_per_position(text: str) -> list[float]:
    """vLLM's accepted tokens per draft position, summed over engines, from a /metrics text (position 0 first)."""
    from prometheus_client.parser import text_string_to_metric_families

    by_pos: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == ACCEPTED_PER_POS:
                try:
                    pos = int(s.labels.get("position", ""))
                except ValueError:
                    continue
                by_pos[pos] = by_pos.get(pos, 0.0) + float(s.value)
    return [by_pos.get(i, 0.0) for i in range(max(by_pos) + 1)] if by_pos else []
