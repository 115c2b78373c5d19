"""`python -m servescope.sim ...`: run the simulator (see `servescope.sim.cli`)."""

from __future__ import annotations

import sys

from servescope.sim.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
