"""Command-line conventions both programs share: every bad usage is one clear line on stderr
and a non-zero exit; every command answers --help."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_EXIT = 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line naming the program and the fix."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(USAGE_EXIT)


def fail(prog: str, message: str, code: int = 1) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(code)
