"""`tether-supervisor` with a planted bug in what it makes durable, for the power-loss test
(tests/drills/test_power_loss.py), which must catch it:
`python -m tests.serve_planted PLANT ARGS...`
swaps one function of `tether.supervisor.durable` for a broken copy, then runs the CLI with
ARGS. The production code knows nothing of it (as the explorer's plants, `tether.sim.plants`):
the supervisor calls its helpers as `durable.NAME`, and this replaces the module's attribute.

    no-folder-sync   a folder is never synced: new names (a mirror, a candidate ref's
                     folder, an artifact) are durable only if something else syncs their folder
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from tether.supervisor import durable


def folder_never_synced(path: Path) -> None:
    """no-folder-sync: `durable.sync_folder` does nothing."""


PLANTS: dict[str, tuple[str, Callable[..., None]]] = {
    "no-folder-sync": ("sync_folder", folder_never_synced),
}


def main() -> int:
    name, argv = sys.argv[1], sys.argv[2:]
    attribute, replacement = PLANTS[name]
    getattr(durable, attribute)  # AttributeError: the plant lost its target
    setattr(durable, attribute, replacement)
    from tether.supervisor.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    raise SystemExit(main())
