"""Command-line conventions every tether program shares: bad usage is one clear line on stderr
and exit 2; any other failure is one line and exit 1; every command has --help."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_EXIT = 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line naming the program and the fix, not a
    usage block. Subcommands made with `add_subparsers` use this class too."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)", USAGE_EXIT)


def fail(prog: str, message: str, code: int = 1) -> NoReturn:
    """Write `<prog>: error: <message>` to stderr and exit with `code`."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(code)
