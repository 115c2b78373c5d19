from __future__ import annotations

from collections.abc import Iterator

import pytest

from servescope.sim.launcher import SimHandle, start_sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim("tiny") as handle:
        yield handle
