"""Sessions: the on-disk store, the views every reader shares, statistics, comparisons and imports (documents made
from sessions are servescope.reports)."""


def series_name(name: str, variant: str) -> str:
    """A workload (or load) name with its server variant, as results show it in a server-config sweep:
    "sharegpt [--max-num-seqs 4]"; the plain name when the server was not relaunched per variant."""
    return f"{name} [{variant}]" if variant else name
