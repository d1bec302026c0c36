"""`python -m tether.runner` is `tether-runner`."""

import sys

from tether.runner.cli import main

sys.exit(main())
