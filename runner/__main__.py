"""`python -m runner` is `tether-runner`."""

import sys

from runner.cli import main

sys.exit(main())
