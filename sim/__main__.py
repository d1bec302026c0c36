"""`python -m tether.sim explore ...`: the same as `tether-supervisor chaos explore ...`."""

import sys

from tether.sim.explore import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
