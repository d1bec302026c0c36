"""`tether-supervisor migrate --from <sqlite ledger> --to <postgresql URL>`: the arguments
read, the copy made (supervisor/ledger/copy.py), one line answered."""

from __future__ import annotations

from pathlib import Path

from supervisor.admin import AdminError
from supervisor.ledger.copy import copy_ledger
from supervisor.ledger.errors import LedgerError
from supervisor.ledger.pg_schema import SCHEMES, redact, scheme

SQLITE_PREFIX = "sqlite:///"


def sqlite_path(source: str) -> Path:
    """A path, or `sqlite:///path` (`sqlite:////abs/path` for an absolute one, as SQLAlchemy
    writes them), as the ledger file's path."""
    if source.startswith(SQLITE_PREFIX) and len(source) > len(SQLITE_PREFIX):
        return Path(source[len(SQLITE_PREFIX) :])
    if "://" in source or not source:
        raise AdminError(
            f"--from must be a SQLite ledger (a path or sqlite:///path), not {redact(source)!r}"
        )
    return Path(source)


def run(source: str, target: str) -> str:
    """Copy the SQLite ledger `source` into the empty PostgreSQL ledger `target`; answer the
    summary line. Raises `AdminError` with the one line to print."""
    path = sqlite_path(source)
    if scheme(target) not in SCHEMES:
        raise AdminError(f"--to must be a postgresql:// URL, not {redact(target)!r}")
    try:
        return copy_ledger(path, target).summary()
    except LedgerError as exc:
        raise AdminError(exc.detail) from exc
