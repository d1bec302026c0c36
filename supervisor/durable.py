"""Making what the supervisor writes survive a power cut (docs/design.md, Power loss and the
disk): a file's bytes are durable once the file is synced, its name once its folder is synced,
a new folder once its parent is. Every durable write of the supervisor goes through here: the
ledger file's creation, the artifact store's folders and files, the mirrors, backups.

SQLite and git sync their own files (`synchronous`, `core.fsync`); what neither does is sync the
folder a new name went into, which is what these do. Callers reach them as `durable.NAME(...)`,
so that a test can start the supervisor with one of them replaced (a planted missing sync).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def sync_file(path: Path) -> None:
    """Sync `path`'s bytes (and its size) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: Path) -> None:
    """Sync `path`'s entries: the names created, renamed or removed in it become durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folders(paths: Iterable[Path]) -> None:
    """`sync_folder` on each of `paths`, in order (a child before its parent)."""
    for path in paths:
        sync_folder(path)


def made_folder(path: Path, mode: int = 0o700) -> None:
    """`mkdir -p path` whose every new folder is durable: each one created is followed by a sync
    of its parent. A folder already there is left as it is."""
    missing: list[Path] = []
    at = path
    while not at.is_dir():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:
            if not folder.is_dir():
                raise
        sync_folder(folder.parent)


def created(path: Path) -> None:
    """A file just created (or renamed in) at `path`: sync its bytes, then its folder."""
    sync_file(path)
    sync_folder(path.parent)


def sync_tree(root: Path) -> None:
    """Sync every file and folder under `root` (and `root` itself), deepest first: a tree built
    aside, about to be renamed into place."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            sync_file(Path(folder) / name)
        sync_folder(Path(folder))
