"""What differs between the ledger's two storages, SQLite and PostgreSQL, and nothing else: the
`Backend` protocol and the wakeups a commit sends.

The rules, the group commit (`batch`), the writer thread (`writer`) and the store (`store`)
are written once over a `Backend`: how the writer's connection is opened (synchronously, on
the writer thread: the rules are synchronous functions shared with the schedule explorer),
how a batch's transaction begins, whether one is open, which errors are the storage failing,
which dialect's named queries to run (`queries.load`), how reads run, and how a commit wakes
the long-polls of other supervisors on the same database. SQLite's is in `backends`,
PostgreSQL's in `postgres`; `backends.open_backend` picks one from `--db`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol, TypeVar

from tether.supervisor.ledger.queries import Dialect
from tether.supervisor.ledger.tx import ALL_POOLS, EFFECTS, Connection, TypedReads

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
    def execute(self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = (), /) -> Any: ...


class WriteConnection(Connection, Protocol):
    """The writer's connection: a `Connection` that also gives a cursor (the batch runs its
    savepoints on one)."""

    def cursor(self) -> Cursor: ...


class Pipeline(Protocol):
    """The statements a batch queued on the writer's connection (`Backend.pipeline`)."""

    @property
    def lost(self) -> bool:
        """Whether the connection is gone: nothing to roll back, nothing to run again on."""
        ...


class Reads(Protocol):
    """Runs one read function (the same synchronous functions the rules call) on committed
    data, off the event loop."""

    async def run(self, query: Callable[[TypedReads], T]) -> T: ...


class Backend(Protocol):
    """One storage. The first group of methods runs on the writer thread, inside `batch`;
    `reads` and `listen` are entered on the event loop while the store is open."""

    @property
    def dialect(self) -> Dialect:
        """Which named queries the rules run (`queries.load`)."""
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

    def pipeline(self, db: WriteConnection) -> AbstractContextManager[Pipeline | None]:
        """While entered, a statement sent on `db` that asks nothing back (`Tx.run`) is
        queued and goes to the server with the next one that does, which waits for every
        answer before it; leaving sends what is left and raises the first error. None where
        each statement runs as it is sent (SQLite)."""
        ...

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
