"""`tether-supervisor migrate --from <sqlite ledger> --to <postgresql URL>`: the arguments
read, the copy made (supervisor/ledger/copy.py), one line answered."""

from __future__ import annotations

import os
from pathlib import Path

from tether.supervisor import writer_lock
from tether.supervisor.admin import AdminError
from tether.supervisor.ledger import backends
from tether.supervisor.ledger.copy import copy_ledger
from tether.supervisor.ledger.errors import LedgerError
from tether.supervisor.ledger.pg_schema import SCHEMES, redact, scheme


def sqlite_path(source: str) -> Path:
    """The SQLite ledger `--from` names: a path or `sqlite:///path`, read as `--db` reads it
    (`backends.sqlite_path`); a PostgreSQL URL or another scheme is refused in one line."""
    try:
        return backends.sqlite_path(source)
    except backends.LedgerUrlError as exc:
        raise AdminError(
            f"--from must be a SQLite ledger (a path or sqlite:///path), not {redact(source)!r}"
        ) from exc


def run(source: str, target: str, artifacts: Path | None = None) -> str:
    """Copy the SQLite ledger `source` into the empty PostgreSQL ledger `target`; answer the
    summary line. Raises `AdminError` with the one line to print."""
    path = sqlite_path(source)
    if scheme(target) not in SCHEMES:
        raise AdminError(f"--to must be a postgresql:// URL, not {redact(target)!r}")
    held = _hold_unless_read_only(path)
    try:
        return copy_ledger(path, target, artifacts).summary()
    except LedgerError as exc:
        raise AdminError(exc.detail) from exc
    finally:
        if held is not None:
            os.close(held)


def _hold_unless_read_only(path: Path) -> int | None:
    """The ledger's writer lock for the copy: a copy of a file being served would miss what the
    supervisor commits meanwhile. A file on a folder this user cannot write (a read-only copy)
    has no lock file to take, and no supervisor of this user can be serving it."""
    if not path.is_file() or not os.access(path.parent, os.W_OK):
        return None
    try:
        return writer_lock.hold(path)
    except writer_lock.LedgerHeld as exc:
        raise AdminError(str(exc)) from None
