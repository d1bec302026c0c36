"""`tether-supervisor migrate --from <sqlite ledger> --to <postgresql URL>`: the arguments
read, the copy made (supervisor/ledger/copy.py), one line answered."""

from __future__ import annotations

from pathlib import Path

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
    try:
        return copy_ledger(path, target, artifacts).summary()
    except LedgerError as exc:
        raise AdminError(exc.detail) from exc
