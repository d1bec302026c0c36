"""Import packages as a runner-only install would see them: every module named by --forbid is
refused, as if its distribution were not installed.

Run as a script by tests/runner/test_runner_only_install.py, never imported: a module already
imported when the refusing finder goes in would get past it, so this file imports the
standard library only. Prints one JSON object on its last line: `failures`, a list of
[module, error] pairs; `imported`, the modules walked; `helped`, the argv lists whose
`--help` exited 0.

    python tests/runner_only_probe.py --forbid starlette,tether.supervisor --walk tether
        [--runner-help]

A forbidden name may be a package inside another (`tether.supervisor`): it and everything under
it are refused, and the walk passes over it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import pkgutil
import sys
import types
from collections.abc import Sequence


def is_forbidden(fullname: str, forbidden: frozenset[str]) -> bool:
    """True when `fullname` or a package it is in is named in `forbidden`."""
    parts = fullname.split(".")
    return any(".".join(parts[:n]) in forbidden for n in range(1, len(parts) + 1))


class Refuse(importlib.abc.MetaPathFinder):
    """Refuses any forbidden module, before any other finder looks."""

    def __init__(self, forbidden: frozenset[str]) -> None:
        self.forbidden = forbidden

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if is_forbidden(fullname, self.forbidden):
            message = f"No module named {fullname!r} (not installed on a runner-only server)"
            raise ModuleNotFoundError(message, name=fullname)
        return None


def walk(package: str, failures: list[list[str]], forbidden: frozenset[str]) -> list[str]:
    """Import `package` and every module under it but the forbidden ones; `__main__` modules
    are left out, since importing one runs its program."""

    def on_error(name: str) -> None:
        if not is_forbidden(name, forbidden):  # a forbidden package is passed over, not a fault
            failures.append([name, repr(sys.exc_info()[1])])

    try:
        root = importlib.import_module(package)
    except Exception as exc:
        failures.append([package, repr(exc)])
        return []
    names = [package]
    prefix = f"{package}."
    for info in pkgutil.walk_packages(root.__path__, prefix, onerror=on_error):
        if info.name.rpartition(".")[2] == "__main__" or is_forbidden(info.name, forbidden):
            continue
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failures.append([info.name, repr(exc)])
    return names


def runner_help(argv: list[str], failures: list[list[str]]) -> bool:
    """Run `tether-runner <argv>` in this process; True when it printed help and exited 0."""
    out = io.StringIO()
    try:
        from tether.runner.cli import main

        with contextlib.redirect_stdout(out):
            main(argv)
    except SystemExit as exc:
        if exc.code == 0 and "usage:" in out.getvalue():
            return True
        failures.append([f"tether-runner {' '.join(argv)}", f"exit {exc.code}"])
    except Exception as exc:
        failures.append([f"tether-runner {' '.join(argv)}", repr(exc)])
    else:
        failures.append([f"tether-runner {' '.join(argv)}", "returned instead of exiting"])
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forbid", default="", help="comma-separated module names")
    parser.add_argument("--walk", nargs="*", default=[])
    parser.add_argument("--runner-help", action="store_true")
    args = parser.parse_args()
    forbidden = frozenset(name for name in args.forbid.split(",") if name)
    sys.meta_path.insert(0, Refuse(forbidden))

    failures: list[list[str]] = []
    for name in sorted(sys.modules):
        if is_forbidden(name, forbidden):  # imported at start-up, past the finder
            failures.append([name, "imported before the probe began"])
    imported = [name for package in args.walk for name in walk(package, failures, forbidden)]
    helped = []
    if args.runner_help:
        for argv in (["--help"], ["run", "--help"]):
            if runner_help(argv, failures):
                helped.append(argv)
    print(json.dumps({"failures": failures, "imported": imported, "helped": helped}))


if __name__ == "__main__":
    main()
