"""The explorer's scratch ledgers on PostgreSQL (`chaos explore --db postgresql://...`).

Each process that runs schedules gets a database of its own on the server the URL names,
created and migrated once and emptied between schedules: every row of every table but
`schema_version` deleted (children first) and every sequence restarted, identities and
`fences`, so one seed writes the same rows each time. A few milliseconds in one round trip,
where TRUNCATE takes half a second. Commits do not wait for the disk (`synchronous_commit`
off for the database, as the SQLite scratch file runs with `synchronous=OFF`). The databases
of one run share a name prefix, and the run drops them all when it ends, those of worker
processes its pool stopped included.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tether.supervisor.ledger import pg_schema
from tether.supervisor.ledger.backend_protocol import WriteConnection
from tether.supervisor.ledger.pg_schema import PgRow
from tether.supervisor.ledger.postgres import PgConnection, PostgresBackend, Queued
from tether.supervisor.ledger.queries import Dialect

PREFIX = "tether_chaos_"
_WRITES = ("INSERT", "UPDATE", "DELETE", "MERGE")


def run_prefix() -> str:
    """The name prefix of one run's databases."""
    return f"{PREFIX}{secrets.token_hex(4)}_"


def with_database(url: str, name: str) -> str:
    """`url` naming database `name` instead."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def drop_run(server: str, prefix: str) -> None:
    """Drop every database whose name starts with `prefix`, whoever is still connected."""
    with pg_schema.connect(server) as admin:
        rows = admin.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,)
        ).fetchall()
        for row in rows:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(row[0]))
            )


class CountingConnection(PgConnection):
    """The write connection, counting the rows its writes changed: what SQLite's
    `total_changes` tells the explorer (whether an event can have changed what the
    invariants read). A statement pipelined in a batch (`PostgresBackend.pipeline`) has no
    row count until its answer came back, so each statement's cursor is kept and counted
    when `changed` is read, between batches."""

    __slots__ = ("_changed", "_sent")

    def __init__(self, conn: psycopg.Connection[PgRow]) -> None:
        super().__init__(conn)
        self._changed = 0
        self._sent: list[psycopg.Cursor[PgRow]] = []

    def execute(
        self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = (), /
    ) -> psycopg.Cursor[PgRow] | Queued:
        result = super().execute(sql, parameters)
        self._sent.append(result.cursor if isinstance(result, Queued) else result)
        return result

    def executemany(
        self, sql: str, parameters: Iterable[Mapping[str, Any] | Sequence[Any]], /
    ) -> None:
        rows = list(parameters)
        super().executemany(sql, rows)
        self._changed += len(rows)

    def count_from_zero(self) -> None:
        self._changed = 0
        self._sent.clear()

    @property
    def changed(self) -> int:
        for cursor in self._sent:
            if cursor.rowcount > 0 and (cursor.statusmessage or "").startswith(_WRITES):
                self._changed += cursor.rowcount
        self._sent.clear()
        return self._changed


def emptying(conn: psycopg.Connection[PgRow]) -> sql.Composed:
    """One transaction that empties the ledger on `conn`: DELETE from each table, a table
    before those its foreign keys point at, then every sequence restarted."""
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relnamespace ="
            " current_schema()::regnamespace AND c.relname <> 'schema_version' ORDER BY 1"
        )
    ]
    parents: dict[str, set[str]] = {t: set() for t in tables}
    for child, parent in conn.execute(
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
        " WHERE contype = 'f' AND connamespace = current_schema()::regnamespace"
    ):
        if child != parent and child in parents:
            parents[child].add(parent)
    order: list[str] = []  # children first
    while parents:
        leaves = sorted(t for t in parents if not any(t in ps for ps in parents.values()))
        if not leaves:
            raise RuntimeError(f"foreign keys in a cycle among {sorted(parents)}")
        for table in leaves:
            order.append(table)
            del parents[table]
    sequences = [
        row[0]
        for row in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relkind = 'S' AND c.relnamespace ="
            " current_schema()::regnamespace ORDER BY 1"
        )
    ]
    statements: list[sql.Composable] = [sql.SQL("BEGIN")]
    statements += [sql.SQL("DELETE FROM {}").format(sql.Identifier(t)) for t in order]
    restart = sql.SQL("SELECT setval({}::regclass, 1, false)")
    statements += [restart.format(sql.Literal(sql_name)) for sql_name in sequences]
    statements.append(sql.SQL("COMMIT"))
    return sql.SQL("; ").join(statements)


class PgWorkspace:
    """This process's scratch database on `server` (see the module); the same interface as
    the SQLite `harness.Workspace`."""

    dialect: Dialect = "postgresql"

    def __init__(self, server: str, prefix: str) -> None:
        name = f"{prefix}p{os.getpid()}"
        with pg_schema.connect(server) as admin:
            database = sql.Identifier(name)
            admin.execute(sql.SQL("CREATE DATABASE {}").format(database))
            no_wait = sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
            admin.execute(no_wait.format(database))
        self.url = with_database(server, name)
        self.backend = PostgresBackend(self.url)
        self._spare: CountingConnection | None = self.open()
        self._empty = emptying(self._spare.conn)
        self._dropped: dict[str, str] = {}  # index name -> its definition, to make it again

    def open(self) -> CountingConnection:
        """A new write connection, opened as the store opens one (migrations first)."""
        conn = pg_schema.connect(self.url)
        try:
            pg_schema.migrate(conn)
        except BaseException:
            conn.close()
            raise
        return CountingConnection(conn)

    def fresh(self, drop_index: str | None = None) -> CountingConnection:
        """A connection to an emptied ledger, without index `drop_index` (a plant's)."""
        db, self._spare = self._spare, None
        if db is None:
            db = self.open()
        conn = db.conn
        for name, definition in list(self._dropped.items()):
            if name != drop_index:
                conn.execute(definition)
                del self._dropped[name]
        conn.execute(self._empty)
        if drop_index is not None and drop_index not in self._dropped:
            row = conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                " AND indexname = %s",
                (drop_index,),
            ).fetchone()
            if row is not None:
                self._dropped[drop_index] = row[0]
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(drop_index)))
        db.count_from_zero()
        return db

    def changes(self, db: WriteConnection) -> int:
        assert isinstance(db, CountingConnection)
        return db.changed

    def close_db(self, db: WriteConnection) -> None:
        """Close `db` as a crash would: an open transaction is rolled back."""
        assert isinstance(db, CountingConnection)
        db.conn.close()

    def recycle(self, db: WriteConnection) -> None:
        """Keep a schedule's last connection for the next schedule."""
        assert isinstance(db, CountingConnection)
        if self.backend.in_transaction(db) or db.conn.closed:
            db.conn.close()
            return
        if self._spare is not None:
            self._spare.conn.close()
        self._spare = db

    def __enter__(self) -> PgWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the run drops the database (`drop_run`)."""
        if self._spare is not None:
            self._spare.conn.close()
            self._spare = None


@contextlib.contextmanager
def scratch_server(server: str) -> Iterator[str]:
    """A run's prefix on `server`; its databases are dropped when the block ends."""
    prefix = run_prefix()
    try:
        yield prefix
    finally:
        drop_run(server, prefix)
