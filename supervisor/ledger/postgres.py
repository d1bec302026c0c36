"""The ledger on PostgreSQL: the `Backend` for `postgresql://` URLs, several supervisors on one
database.

Writes: one psycopg 3 sync connection on the store's writer thread, the same group commit as
on SQLite (a batch = one transaction, a savepoint per rule), its statements pipelined
(`PostgresBackend.pipeline`): a write that asks nothing back goes with the next statement
that does, so a step's two rules cost their reads' round trips, not one per statement.
Batches from every supervisor on the database are serialized by
`pg_advisory_xact_lock(LEDGER_LOCK)` taken right after BEGIN, in READ COMMITTED: the rules
were written for one writer (read, decide, write) and keep that reasoning here without a lock
audit of each, and the event journal's `seq` becomes visible in order (commit order = seq
order under the lock). The price: supervisors' batches never overlap, each holding the lock
for the one batch it runs. Measured (bench/pgwriters.py, the
2-core machine running the server too, 32 workers per supervisor looping claim -> result):
1 supervisor 307 steps/s at 19 batches/s, 3 supervisors 384 steps/s at 24 batches/s, 32
rules per batch; more supervisors add the Python work done outside the lock, not writes.

Reads: a `psycopg_pool.ConnectionPool` (sync) of a few read-only REPEATABLE READ connections,
one worker-thread hop per read function, so that one view sees one snapshot. Not async psycopg:
the read functions are synchronous functions over `TypedReads`, shared with the rules.

Wakeups: a batch that woke anything runs `pg_notify(CHANNEL, ...)` inside its transaction
(delivered only if it commits); each supervisor LISTENs on one dedicated async connection and
wakes its own claims, event watches and dispatcher. A lost listener reconnects (tenacity) and
then wakes everything once, since a notification may have been missed meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import psycopg
import structlog
from anyio.abc import TaskStatus
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from tether.supervisor.ledger import pg_schema, queries
from tether.supervisor.ledger.backend_protocol import (
    EVERYTHING,
    Fire,
    Pipeline,
    Reads,
    Wakeup,
    WriteConnection,
)
from tether.supervisor.ledger.errors import StorageError
from tether.supervisor.ledger.pg_schema import PgRow
from tether.supervisor.ledger.queries import Dialect
from tether.supervisor.ledger.tx import ALL_POOLS, EFFECTS, ReadSession, TypedReads

T = TypeVar("T")

log = structlog.get_logger("tether.supervisor")

# The advisory lock every write batch takes ("ledger" in ASCII); pg_schema's migrations take
# another.
LEDGER_LOCK = 0x6C6564676572
CHANNEL = "tether_ledger"
# pg_notify refuses a payload of 8000 bytes or more; a batch that woke more pools than fit
# wakes them all.
MAX_PAYLOAD = 7000
# The writer's bounds: a batch waits at most this long for the lock (held by another
# supervisor's batch), and a transaction left idle this long (its process stopped mid-batch)
# is ended by the server, releasing the lock. Either fails that batch with a StorageError.
LOCK_TIMEOUT_S = 30.0
IDLE_IN_TRANSACTION_S = 60.0
READ_CONNECTIONS = 4
# The writer's prepared statements (see `PostgresBackend._bounded`).
PREPARE_THRESHOLD = 1
PREPARED_MAX = 200
READ_WAIT_S = 10.0  # how long a read waits for a pooled connection before it fails


class PgConnection:
    """psycopg's connection with the DB-API surface the ledger's rules use (`executemany`).
    While the writer pipelines a batch (`PostgresBackend.pipeline`), a statement's row count
    waits for its answer (`Queued`)."""

    __slots__ = ("conn", "pipeline")

    def __init__(self, conn: psycopg.Connection[PgRow]) -> None:
        self.conn = conn
        self.pipeline: psycopg.Pipeline | None = None

    def execute(
        self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = (), /
    ) -> psycopg.Cursor[PgRow] | Queued:
        cursor = self.conn.execute(sql, parameters)
        return cursor if self.pipeline is None else Queued(cursor, self.pipeline)

    def executemany(
        self, sql: str, parameters: Iterable[Mapping[str, Any] | Sequence[Any]], /
    ) -> None:
        with self.conn.cursor() as cursor:
            cursor.executemany(sql, list(parameters))

    def cursor(self) -> psycopg.Cursor[PgRow]:
        return self.conn.cursor()


class Queued:
    """A statement sent in pipeline mode: its rows are fetched as psycopg fetches them (a
    read waits for the answers to everything queued before it); its row count is known once
    the pipeline is synced, which reading it does."""

    __slots__ = ("cursor", "pipeline")

    def __init__(self, cursor: psycopg.Cursor[PgRow], pipeline: psycopg.Pipeline) -> None:
        self.cursor = cursor
        self.pipeline = pipeline

    def fetchone(self) -> PgRow | None:
        return self.cursor.fetchone()

    def fetchall(self) -> list[PgRow]:
        return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        self.pipeline.sync()
        return self.cursor.rowcount


class _Pipelined:
    """`Pipeline` (the backend protocol's) over psycopg's connection."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[PgRow]) -> None:
        self.conn = conn

    @property
    def lost(self) -> bool:
        return self.conn.closed or self.conn.broken


def _pg(db: WriteConnection) -> psycopg.Connection[PgRow]:
    assert isinstance(db, PgConnection)
    return db.conn


def is_storage_failure(exc: BaseException) -> bool:
    """The server or the connection failing (SQLSTATE classes 08, 40, 53, 55, 57, 58, and a
    connection psycopg found closed), not a statement's mistake."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


@dataclasses.dataclass
class PostgresBackend:
    """A PostgreSQL database shared by any number of supervisors (see the module)."""

    url: str
    read_connections: int = READ_CONNECTIONS
    dialect: Dialect = "postgresql"
    # This process's name in its notifications: its own commits it has woken already.
    origin: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def where(self) -> str:
        return pg_schema.redact(self.url)

    @property
    def joins_statements(self) -> bool:
        return True  # psycopg sends a query without parameters as one simple query

    # -- the writer thread --------------------------------------------------------------------

    def exists(self) -> bool:
        with pg_schema.connect(self.url) as conn:
            try:
                return pg_schema.schema_version(conn) > 0
            except psycopg.Error as exc:
                one_line = pg_schema.one_line(exc, self.url)
                raise StorageError(f"cannot read {self.where}: {one_line}") from exc

    def open_writer(self) -> WriteConnection:
        conn = pg_schema.connect(self.url)
        try:
            pg_schema.migrate(conn)
            return self._bounded(conn)
        except BaseException:
            conn.close()
            raise

    def live(self, db: WriteConnection) -> WriteConnection:
        if not _pg(db).closed:
            return db
        log.warning("the ledger's write connection was lost; reconnecting", db=self.where)
        conn = pg_schema.connect(self.url)
        try:
            return self._bounded(conn)
        except psycopg.Error as exc:
            conn.close()
            one_line = pg_schema.one_line(exc, self.url)
            raise StorageError(f"cannot reconnect to {self.where}: {one_line}") from exc
        except BaseException:
            conn.close()
            raise

    def _bounded(self, conn: psycopg.Connection[PgRow]) -> PgConnection:
        """The writer's connection with its lock wait and idle transaction bounded, and its
        prepared statements (psycopg prepares a query run 5 times) on their generic plans.
        Left to choose, the server kept a custom plan for the claim query (its `LIMIT ?`) and
        planned it anew at every claim: 0.29-0.32 ms of server time in its bind, against
        0.02-0.04 ms on the generic plan, the same index walk. The rules' other statements
        are key lookups, planned alike either way.

        psycopg forgets every statement it prepared whenever a command answers `ROLLBACK`,
        `ROLLBACK TO rule` (a refused rule) included, and prepares a statement again only
        after `prepare_threshold` runs (5 by default). Measured on one supervisor, serial
        claim+result loops of 3.2-4.1 ms: each refusal cost the next 6 loops 1.7-2.5 ms each,
        on the writer under the advisory lock. Prepared at its second run, a statement is back
        after one: the next 2 loops pay ~2 ms each, then none. Room for 200, twice psycopg's
        default, so that the writer's statements (some 130 named queries) are not
        deallocated in turn. (Threshold 0 cannot be: a joined statement cannot be prepared.)"""
        conn.prepare_threshold = PREPARE_THRESHOLD
        conn.prepared_max = PREPARED_MAX
        try:
            conn.execute(
                f"SET lock_timeout = {int(LOCK_TIMEOUT_S * 1000)};"
                f" SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_S * 1000)};"
                " SET plan_cache_mode = force_generic_plan"
            )
        except psycopg.Error as exc:
            one_line = pg_schema.one_line(exc, self.url)
            raise StorageError(f"cannot set up {self.where}: {one_line}") from exc
        return PgConnection(conn)

    def close_writer(self, db: WriteConnection) -> None:
        _pg(db).close()

    def begin(self, db: WriteConnection) -> None:
        # One round trip: a statement without parameters may hold two.
        db.execute(f"BEGIN; SELECT pg_advisory_xact_lock({LEDGER_LOCK})")

    def in_transaction(self, db: WriteConnection) -> bool:
        status = _pg(db).info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    @contextlib.contextmanager
    def pipeline(self, db: WriteConnection) -> Iterator[Pipeline | None]:
        """psycopg's pipeline mode: the rules' writes ride their next read's round trip. On
        an error the pipeline is synced before psycopg leaves it, so that psycopg has no
        answer left to fail on (it would log each)."""
        assert isinstance(db, PgConnection)
        with db.conn.pipeline() as pipeline:
            db.pipeline = pipeline
            try:
                yield _Pipelined(db.conn)
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    pipeline.sync()
                raise
            finally:
                db.pipeline = None

    def is_driver_error(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.Error)

    def is_storage_failure(self, exc: BaseException) -> bool:
        return is_storage_failure(exc)

    def announce(self, db: WriteConnection, wakeup: Wakeup) -> None:
        db.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.encode(wakeup)))

    def encode(self, wakeup: Wakeup) -> str:
        payload = {"origin": self.origin, "pools": sorted(wakeup.pools), "events": wakeup.events}
        text = json.dumps(payload, separators=(",", ":"))
        if len(text.encode()) > MAX_PAYLOAD:
            payload["pools"] = [ALL_POOLS, EFFECTS]
            text = json.dumps(payload, separators=(",", ":"))
        return text

    def decode(self, text: str) -> Wakeup | None:
        """The wakeup another process's notification carries; None for this process's own,
        and everything for one that cannot be read."""
        try:
            payload = json.loads(text)
            if payload["origin"] == self.origin:
                return None
            return Wakeup(frozenset(str(p) for p in payload["pools"]), bool(payload["events"]))
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable ledger notification; waking everything", payload=text[:200])
            return EVERYTHING

    # -- reads --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reads(self) -> AsyncIterator[Reads]:
        pool = ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.read_connections,
            kwargs={"row_factory": pg_schema.pg_row, **pg_schema.liveness(self.url)},
            configure=_read_only,
            # Each connection is checked as it is handed out: after a server restart or a
            # failover every idle one is dead, and each would fail a read.
            check=ConnectionPool.check_connection,
            open=False,
            name="tether-ledger-reads",
        )
        try:
            await anyio.to_thread.run_sync(lambda: pool.open(wait=True, timeout=READ_WAIT_S))
        except PoolTimeout as exc:
            await anyio.to_thread.run_sync(pool.close)
            raise StorageError(f"cannot connect to {self.where} for reads: {exc}") from exc
        try:
            yield _PgReads(pool, self.url, self.where, self.read_connections)
        finally:
            await anyio.to_thread.run_sync(pool.close)

    # -- wakeups ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def listen(self, fire: Fire) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            await tg.start(self._listen_forever, fire)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    async def _listen_forever(self, fire: Fire, *, task_status: TaskStatus[None]) -> None:
        """Listen until cancelled. The first connection must succeed (the store does not open
        without it); later ones are retried with backoff for as long as it takes, and each
        wakes everything once it listens (something may have been missed)."""
        try:
            await self._listen_once(fire, on_listening=task_status.started)
        except psycopg.OperationalError as exc:
            one_line = pg_schema.one_line(exc, self.url)
            raise StorageError(f"cannot listen to {self.where}: {one_line}") from exc
        while True:
            retrying = AsyncRetrying(
                wait=wait_exponential(multiplier=0.05, max=5.0),
                retry=retry_if_exception_type(psycopg.OperationalError),
                before_sleep=lambda state: log.warning(
                    "cannot listen to the ledger's database; retrying",
                    db=self.where,
                    error=" ".join(str(state.outcome.exception() if state.outcome else "").split()),
                ),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    await self._listen_once(fire, on_listening=lambda: fire(EVERYTHING))

    async def _listen_once(self, fire: Fire, *, on_listening: Callable[[], None]) -> None:
        """Connect, LISTEN, call `on_listening`, and fire each notification until the
        connection is lost (then return). Failing to connect raises."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.url,
                autocommit=True,
                connect_timeout=pg_schema.CONNECT_TIMEOUT_S,
                **pg_schema.liveness(self.url),
            )
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            raise StorageError(f"cannot listen to {self.where}: {exc}") from exc
        async with conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            on_listening()
            try:
                async for note in conn.notifies():
                    wakeup = self.decode(note.payload)
                    if wakeup:
                        fire(wakeup)
            except psycopg.OperationalError as exc:
                log.warning(
                    "lost the ledger's notifications; reconnecting",
                    db=self.where,
                    error=pg_schema.one_line(exc, self.url),
                )


def _read_only(conn: psycopg.Connection[Any]) -> None:
    """Each read function sees one snapshot and cannot write."""
    conn.isolation_level = IsolationLevel.REPEATABLE_READ
    conn.read_only = True


class _PgReads:
    """Read functions on pooled connections, each in a worker thread, in a transaction of its
    own. A read whose connection was lost (a server restart) is run once more on a fresh one:
    a read changes nothing, so running it again is safe."""

    def __init__(self, pool: ConnectionPool[Any], url: str, where: str, size: int) -> None:
        self._pool = pool
        self._url = url
        self._where = where
        self._sql = queries.load("postgresql")
        self._limiter = anyio.CapacityLimiter(size)

    async def run(self, query: Callable[[TypedReads], T]) -> T:
        return await anyio.to_thread.run_sync(lambda: self._run(query), limiter=self._limiter)

    def _run(self, query: Callable[[TypedReads], T]) -> T:
        for tries_left in (1, 0):
            try:
                with self._pool.connection(timeout=READ_WAIT_S) as conn:
                    return query(ReadSession(PgConnection(conn), self._sql))
            except PoolTimeout as exc:
                raise StorageError(f"no connection to {self._where} for a read: {exc}") from exc
            except psycopg.Error as exc:
                if not is_storage_failure(exc):
                    raise
                if tries_left:
                    continue
                one_line = pg_schema.one_line(exc, self._url)
                raise StorageError(f"the ledger could not read: {one_line}") from exc
        raise AssertionError("unreachable")
