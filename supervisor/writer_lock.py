"""One writer per ledger file: `serve` holds an exclusive lock on `<ledger>.lock`, beside a
SQLite ledger, for as long as it runs (docs/design.md, Power loss and the disk). Two
dispatchers on one file could each send an effect, so a second `serve` is refused with the
holder's pid and host. The lock is `flock(2)`'s: the kernel frees it when the process ends,
however it ends (SIGKILL, a crash), so a stale lock file never keeps a supervisor out.

Admin commands (tokens, `repo`, `check`, `backup`) never take it: they run their rules beside a
running supervisor, which SQLite serialises, and the ones that only read open the file
read-only. `migrate` takes it for the copy: a copy of a ledger being served would miss what
the supervisor commits meanwhile. A PostgreSQL ledger takes no lock here: several
supervisors share one by design.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path


class LedgerHeld(Exception):
    """The ledger cannot be locked for `serve`; the message is the line to print."""


def lock_path(ledger: Path) -> Path:
    return ledger.with_name(f"{ledger.name}.lock")


def hold(ledger: Path) -> int:
    """Lock `ledger` for this process's writer; return the lock's descriptor, to keep open
    for the process's life. `LedgerHeld` when another process holds it (or it cannot be
    made)."""
    path = lock_path(ledger)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise LedgerHeld(f"cannot lock ledger {ledger}: {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        said = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process just starting"
        os.close(fd)
        raise LedgerHeld(
            f"ledger {ledger} is served by another supervisor ({said}; lock {path}): a ledger"
            " file has one writer, so stop that one first (several supervisors share a"
            " PostgreSQL ledger)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    return fd
