"""What differs between the ledger's two storages, SQLite and PostgreSQL, and nothing else.

The rules, the group commit (`batch`), the writer thread (`writer`) and the store (`store`)
are written once over a `Backend`: how the writer's connection is opened (synchronously, on
the writer thread: the rules are synchronous functions shared with the schedule explorer),
how a batch's transaction begins, whether one is open, which errors are the storage failing,
which dialect's named queries to run (`queries.texts`), how reads run, and how a commit wakes
the long-polls of other supervisors on the same database. `open_backend` picks one from
`--db`: a path or `sqlite:///path` is SQLite, `postgresql://...` is PostgreSQL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio

from tether.supervisor.ledger import queries
from tether.supervisor.ledger.queries import Dialect
from tether.supervisor.ledger.schema import connect, open_ledger_file
from tether.supervisor.ledger.tx import ALL_POOLS, EFFECTS, Connection, ReadSession, Statements

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Wakeup:
    """What a committed batch may have made ready: claims in `pools` (`tx.ALL_POOLS` for every
    pool, `tx.EFFECTS` for the dispatcher), and task events when `events`."""

    pools: frozenset[str]
    events: bool

    def __bool__(self) -> bool:
        return bool(self.pools) or self.events


# Every claim, the dispatcher and every event watch: what to wake when what a batch made
# ready is not known (a lost notification, a commit whose answer was lost).
EVERYTHING = Wakeup(frozenset({ALL_POOLS, EFFECTS}), events=True)

Fire = Callable[[Wakeup], None]


class Cursor(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any: ...


class WriteConnection(Connection, Protocol):
    """The writer's connection: a `Connection` that also gives a cursor (the batch runs its
    savepoints on one)."""

    def cursor(self) -> Cursor: ...


class Reads(Protocol):
    """Runs one read function (the same synchronous functions the rules call) on committed
    data, off the event loop."""

    async def run(self, query: Callable[[Statements], T]) -> T: ...


class Backend(Protocol):
    """One storage. The first group of methods runs on the writer thread, inside `batch`;
    `reads` and `listen` are entered on the event loop while the store is open."""

    @property
    def dialect(self) -> Dialect:
        """Which named queries the rules run (`queries.texts`)."""
        ...

    @property
    def where(self) -> str:
        """What to name in messages: the file, or the URL without its password."""
        ...

    @property
    def joins_statements(self) -> bool:
        """Whether one execute without parameters may carry several statements (one round
        trip to a server for them all)."""
        ...

    def exists(self) -> bool:
        """Whether a ledger is there already (admin commands other than `init` refuse none)."""
        ...

    def open_writer(self) -> WriteConnection:
        """Open, check and migrate; the connection every batch runs on."""
        ...

    def live(self, db: WriteConnection) -> WriteConnection:
        """`db`, or a new connection if it was lost (before each batch)."""
        ...

    def close_writer(self, db: WriteConnection) -> None: ...

    def begin(self, db: WriteConnection) -> None:
        """Begin a batch's write transaction, holding the database's write lock."""
        ...

    def in_transaction(self, db: WriteConnection) -> bool: ...

    def is_driver_error(self, exc: BaseException) -> bool:
        """Whether `exc` came from the database driver (the batch then fails, the writer not)."""
        ...

    def is_storage_failure(self, exc: BaseException) -> bool:
        """Whether a driver error is the storage failing (503) rather than a bug (500)."""
        ...

    def announce(self, db: WriteConnection, wakeup: Wakeup) -> None:
        """Inside the batch's transaction, just before COMMIT: tell other processes."""
        ...

    def reads(self) -> AbstractAsyncContextManager[Reads]: ...

    def listen(self, fire: Fire) -> AbstractAsyncContextManager[None]:
        """While entered, call `fire` (on the event loop) with what other processes' commits
        woke."""
        ...


# SQLite's primary result codes that are about the storage, not about the statement: a full
# disk, an I/O error, a lock held too long, a read-only or damaged file.
_STORAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_PROTOCOL,
    }
)  # fmt: skip


class _SqliteReads:
    """Reads on one read-only connection, one at a time, each in a worker thread: WAL lets it
    run beside the writer and see only committed data."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._session = ReadSession(db, queries.texts("sqlite"))
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, query: Callable[[Statements], T]) -> T:
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
