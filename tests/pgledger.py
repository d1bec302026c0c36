"""The ledger's tests on both storages: one migrated PostgreSQL database for the whole test
session, emptied before each test that opens a ledger on it (a few milliseconds, where a
database of its own costs half a second), and reading a ledger by SQL on either storage.

A test module runs on both by taking the `backend` fixture (conftest), parametrized
`sqlite` / `postgresql`, so `pytest -k postgresql` picks one. PostgreSQL is
`pgdb.pg_server_url()`; without it those tests are skipped with one line (failed under CI).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from tether.supervisor.ledger.queries import to_pyformat

if TYPE_CHECKING:  # psycopg is imported only where PostgreSQL is used
    import psycopg
    from psycopg import sql

    from tether.supervisor.ledger.pg_schema import PgRow

Backend = Literal["sqlite", "postgresql"]
BACKENDS: tuple[Backend, ...] = ("sqlite", "postgresql")
# Emptying waits this long for a lock a connection left open by the last test still holds.
LOCK_WAIT_MS = 5000


@dataclasses.dataclass
class SharedDatabase:
    """The session's migrated PostgreSQL ledger database and one connection to empty it."""

    url: str
    conn: psycopg.Connection[PgRow]
    empty_statement: sql.Composed

    def empty(self) -> str:
        """Delete every row and restart every sequence (`fences` and the identities); the
        URL, for the next test's ledger."""
        self.conn.execute(self.empty_statement)
        return self.url


@pytest.fixture(scope="session")
def pg_ledger_database() -> Iterator[SharedDatabase]:
    from tether.sim.pgscratch import emptying
    from tether.supervisor.ledger.pg_schema import connect, migrate

    from . import pgdb

    with pgdb.fresh_database() as url, connect(url) as conn:
        migrate(conn)
        conn.execute(f"SET lock_timeout = {LOCK_WAIT_MS}")
        yield SharedDatabase(url, conn, emptying(conn))


def ledger_db_at(backend: Backend, path: Path, request: pytest.FixtureRequest) -> Path | str:
    """Where a test's ledger is: the file `path` on SQLite, the emptied shared database on
    PostgreSQL."""
    if backend == "sqlite":
        return path
    shared: SharedDatabase = request.getfixturevalue("pg_ledger_database")
    return shared.empty()


def rows(db: Path | str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run `statement` (with `?` placeholders) on the ledger at `db`, a file or a URL, and
    commit; its rows as tuples (none for a write)."""
    return [tuple(r) for r in _run(db, statement, params)]


def records(db: Path | str, statement: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """`rows`, each a dict by column name."""
    return [dict(zip(r.keys(), r, strict=True)) for r in _run(db, statement, params)]


def _run(db: Path | str, statement: str, params: Sequence[Any]) -> list[Any]:
    """The rows (`sqlite3.Row` or `PgRow`) of `statement`, committed."""
    if isinstance(db, Path):
        lite = sqlite3.connect(str(db), isolation_level=None)
        lite.row_factory = sqlite3.Row
        try:
            return lite.execute(statement, params).fetchall()
        finally:
            lite.close()
    from tether.supervisor.ledger.pg_schema import connect

    with connect(db) as conn:
        cursor = conn.execute(to_pyformat(statement), params)
        return cursor.fetchall() if cursor.description else []
