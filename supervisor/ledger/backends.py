"""The SQLite `Backend` (`backend_protocol`), and `open_backend`, which picks a storage from
`--db`: a path or `sqlite:///path` is SQLite, `postgresql://...` is PostgreSQL (`postgres`,
imported only then, since psycopg is an extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import anyio

from tether.supervisor.ledger import queries
from tether.supervisor.ledger.backend_protocol import Backend, Fire, Reads, Wakeup, WriteConnection
from tether.supervisor.ledger.queries import Dialect
from tether.supervisor.ledger.schema import connect, open_ledger_file
from tether.supervisor.ledger.tx import ReadSession, TypedReads

T = TypeVar("T")


# SQLite's primary result codes that are about the storage, not about the statement: a full
# disk, an I/O error, a lock held too long, a read-only or damaged file.
_STORAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_PROTOCOL,
    }
)


class _SqliteReads:
    """Reads on one read-only connection, one at a time, each in a worker thread: WAL lets it
    run beside the writer and see only committed data."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._session = ReadSession(db, queries.load("sqlite"))
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, query: Callable[[TypedReads], T]) -> T:
        session = self._session
        return await anyio.to_thread.run_sync(lambda: query(session), limiter=self._limiter)


@dataclasses.dataclass(frozen=True)
class SqliteBackend:
    """One SQLite file: one process writes it (`BEGIN IMMEDIATE`), wakeups stay in-process."""

    path: Path
    synchronous: str = "FULL"
    dialect: Dialect = "sqlite"

    @property
    def where(self) -> str:
        return str(self.path)

    @property
    def joins_statements(self) -> bool:
        return False  # sqlite3 runs one statement per execute

    def pipeline(self, db: WriteConnection) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # no server: each statement runs as it is sent

    def exists(self) -> bool:
        return self.path.exists()

    def open_writer(self) -> WriteConnection:
        return open_ledger_file(self.path, synchronous=self.synchronous)

    def live(self, db: WriteConnection) -> WriteConnection:
        return db

    def close_writer(self, db: WriteConnection) -> None:
        _sqlite(db).close()

    def begin(self, db: WriteConnection) -> None:
        db.execute("BEGIN IMMEDIATE")

    def in_transaction(self, db: WriteConnection) -> bool:
        return _sqlite(db).in_transaction

    def is_driver_error(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.Error)

    def is_storage_failure(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in _STORAGE_CODES

    def announce(self, db: WriteConnection, wakeup: Wakeup) -> None:
        """Nothing: only this process writes the file, and the store wakes its own."""

    @contextlib.asynccontextmanager
    async def reads(self) -> AsyncIterator[Reads]:
        path, synchronous = self.path, self.synchronous
        reader = await anyio.to_thread.run_sync(
            lambda: connect(path, synchronous=synchronous, readonly=True)
        )
        try:
            yield _SqliteReads(reader)
        finally:
            await anyio.to_thread.run_sync(reader.close)

    @contextlib.asynccontextmanager
    async def listen(self, fire: Fire) -> AsyncIterator[None]:
        yield


def _sqlite(db: WriteConnection) -> sqlite3.Connection:
    assert isinstance(db, sqlite3.Connection)
    return db


SQLITE = SqliteBackend(Path(":memory:"))  # the batch's default: its `begin` and error codes


class LedgerUrlError(ValueError):
    """`--db` names no storage the ledger has; the message is the line to print."""


POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SCHEME = "sqlite:///"


def is_postgres(db: str | Path) -> bool:
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


def sqlite_path(db: str | Path) -> Path:
    """The file `db` names: a path, or `sqlite:///path` (SQLAlchemy's form: `sqlite:///x.db`
    is relative, `sqlite:////var/x.db` absolute). Anything else with a scheme is refused."""
    if isinstance(db, Path):
        return db
    if db.startswith(SQLITE_SCHEME):
        rest = db[len(SQLITE_SCHEME) :]
        if not rest:
            raise LedgerUrlError(f"ledger URL {db!r} names no file")
        return Path(rest)
    if is_postgres(db):
        raise LedgerUrlError("this ledger is a PostgreSQL database, not a file")
    scheme, sep, _ = db.partition("://")
    if sep and scheme.replace("+", "").isalnum():
        raise LedgerUrlError(
            f"ledger URL scheme {scheme!r} is not supported"
            " (give a file path, sqlite:///path or postgresql://...)"
        )
    if not db:
        raise LedgerUrlError("the ledger location is empty")
    return Path(db)


def open_backend(db: str | Path, *, synchronous: str = "FULL") -> Backend:
    """The storage `--db` names (see `sqlite_path`; `postgresql://` for PostgreSQL, which
    needs the `postgresql` extra installed). `synchronous` is SQLite's."""
    if is_postgres(db):
        try:
            from tether.supervisor.ledger.postgres import PostgresBackend
        except ImportError as exc:
            raise LedgerUrlError(
                f"a PostgreSQL ledger needs psycopg: pip install 'tether[postgresql]' ({exc})"
            ) from None
        assert isinstance(db, str)
        return PostgresBackend(db)
    return SqliteBackend(sqlite_path(db), synchronous=synchronous)
