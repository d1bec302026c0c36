"""`python -m supervisor.chaos explore ...`: the same as `tether-supervisor chaos explore ...`."""

import sys

from supervisor.chaos.explore import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
