"""The real ledger, run synchronously on a scratch SQLite file (or a scratch PostgreSQL
database, `pgscratch`) with a virtual clock.

No event loop and no writer thread: rules go straight to `Transactions`, the same group commit
the store uses, so one schedule costs milliseconds. Ids come from a counter, so one seed always
writes the same ledger.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from tether.sim.plants import Plant
from tether.supervisor.ledger import queries, reaper
from tether.supervisor.ledger.backend_protocol import Backend, WriteConnection
from tether.supervisor.ledger.backends import SqliteBackend
from tether.supervisor.ledger.batch import Rule, RuleOutcome, Transactions
from tether.supervisor.ledger.queries import Dialect
from tether.supervisor.ledger.schema import open_ledger_file
from tether.supervisor.ledger.tx import LedgerConfig, ReadSession, Row

START = 1_000_000.0
SHM = Path("/dev/shm")  # noqa: S108 - a private mkdtemp inside it, never a fixed name
SIDECARS = ("-wal", "-shm", "-journal")


@contextlib.contextmanager
def scratch_root() -> Iterator[Path]:
    """A private directory for scratch ledgers, removed afterwards; under /dev/shm when it
    exists, so nothing touches a disk."""
    base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix="tether-chaos-", dir=base))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _remove(path: Path) -> None:
    for suffix in ("", *SIDECARS):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


class Scratch(Protocol):
    """Where one process's schedules run: a scratch ledger emptied between schedules."""

    @property
    def dialect(self) -> Dialect: ...
    @property
    def backend(self) -> Backend: ...

    def fresh(self, drop_index: str | None = None) -> WriteConnection:
        """A connection to an empty, migrated ledger, without index `drop_index`."""
        ...

    def open(self) -> WriteConnection:
        """A new connection to the same ledger, opened as the store opens it."""
        ...

    def close_db(self, db: WriteConnection) -> None:
        """Close `db` as a crash would: an open transaction is rolled back."""
        ...

    def changes(self, db: WriteConnection) -> int:
        """Rows changed through `db` so far: when it has not moved, nothing was written."""
        ...

    def recycle(self, db: WriteConnection) -> None: ...
    def close(self) -> None: ...


class Workspace:
    """One process's scratch directory: the file schedules run on, migrated once, and an empty,
    migrated ledger in memory that resets it between schedules (SQLite's backup API: a fraction
    of a millisecond, where copying and reopening costs several)."""

    dialect: Dialect = "sqlite"

    def __init__(self, root: Path) -> None:
        self.dir = root / f"p{os.getpid()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = self.dir / "ledger.db"
        _remove(self.ledger)
        self.backend = SqliteBackend(self.ledger, synchronous="OFF")
        self._template = sqlite3.connect(":memory:")
        migrated = _scratch_file(self.ledger)
        migrated.backup(self._template)
        self._spare: sqlite3.Connection | None = migrated

    def fresh(self, drop_index: str | None = None) -> sqlite3.Connection:
        """A connection to the schedule file, which now holds an empty, migrated ledger."""
        db, self._spare = self._spare, None
        if db is None:
            db = _scratch_file(self.ledger)
        self._template.backup(db)
        if drop_index is not None:
            db.execute(f"DROP INDEX IF EXISTS {drop_index}")
        return db

    def open(self) -> sqlite3.Connection:
        """Integrity check and migrations, as `SqliteLedger.open` does."""
        return _scratch_file(self.ledger)

    def close_db(self, db: WriteConnection) -> None:
        _sqlite(db).close()

    def changes(self, db: WriteConnection) -> int:
        return _sqlite(db).total_changes

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None
        self._template.close()

    def recycle(self, db: WriteConnection) -> None:
        """Keep a schedule's last connection for the next schedule."""
        db = _sqlite(db)
        if db.in_transaction:
            db.close()
            return
        if self._spare is not None:
            self._spare.close()
        self._spare = db


def _scratch_file(path: Path) -> sqlite3.Connection:
    """The scratch ledger opened as the store opens a ledger file, less what a throwaway file
    needs: no syncs (`synchronous=OFF`), and its lock kept by this one connection until it
    closes (`locking_mode=EXCLUSIVE`: no shared-memory locking around each statement, about a
    tenth of a schedule's time). Only one connection is ever open on the file."""
    db = open_ledger_file(path, synchronous="OFF")
    db.execute("PRAGMA locking_mode = EXCLUSIVE")
    return db


def _sqlite(db: WriteConnection) -> sqlite3.Connection:
    assert isinstance(db, sqlite3.Connection)
    return db


class Harness:
    """The ledger of one schedule, its virtual clock and its id counter.

    A planted bug's index (`Plant.drop_index`) is dropped from the fresh ledger; swapping its
    function is `plants.planted`'s part.
    """

    def __init__(
        self, workspace: Scratch, *, config: LedgerConfig, plant: Plant | None = None
    ) -> None:
        self.workspace = workspace
        self.config = config
        self.now = START
        self._ids = 0
        self.sql = queries.load(workspace.dialect)
        self.db = workspace.fresh(plant.drop_index if plant is not None else None)
        self.transactions = self._transactions()

    def _transactions(self) -> Transactions:
        return Transactions(
            db=self.db,
            config=self.config,
            clock=lambda: self.now,
            new_id=self.new_id,
            backend=self.workspace.backend,
        )

    def new_id(self) -> str:
        self._ids += 1
        return f"T{self._ids}"

    def run(self, rules: Sequence[Rule]) -> list[RuleOutcome]:
        """One group-commit batch, committed before this returns."""
        return self.transactions.run(rules).outcomes

    def crash_before_commit(self, rules: Sequence[Rule]) -> int:
        """Run `rules` as one batch, then die before `COMMIT` and restart: nothing of them
        survives. Return the leases refreshed by the restart."""
        self.transactions.run(rules, commit=False)
        return self.restart()

    def restart(self) -> int:
        """A supervisor crash between transactions and its restart; return the leases
        refreshed.

        Closing the connection rolls back an open transaction, as a power cut would; the ledger
        is reopened the way the store opens it (the file's integrity check, migrations), then
        `refresh_after_restart`.
        """
        self.workspace.close_db(self.db)
        return self._boot()

    def _boot(self) -> int:
        self.db = self.workspace.open()
        self.transactions = self._transactions()
        [outcome] = self.run([reaper.refresh_after_restart])
        if outcome.error is not None:
            raise outcome.error
        refreshed: int = outcome.value
        return refreshed

    def states(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self.query("SELECT id, state FROM tasks ORDER BY id")]

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        """Rows of the explorer's own SQL (`?` placeholders, in either dialect)."""
        rows: list[Row] = self.db.execute(portable(self.workspace.dialect, sql), params).fetchall()
        return rows

    @property
    def changes(self) -> int:
        """Rows changed so far (`Scratch.changes`)."""
        return self.workspace.changes(self.db)

    @property
    def reads(self) -> ReadSession:
        """The ledger's named read queries on this schedule's connection."""
        return ReadSession(self.db, self.sql)

    def fence_counter(self) -> int:
        """The last fence granted (or restored after a restart)."""
        if self.workspace.dialect == "postgresql":
            [row] = self.query("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fences")
        else:
            [row] = self.query("SELECT value FROM counters WHERE name = 'fence'")
        return int(row[0])

    def close(self) -> None:
        self.workspace.recycle(self.db)


def portable(dialect: Dialect, sql: str) -> str:
    """The explorer's own SQL, written with `?` placeholders, in `dialect`."""
    return queries.to_pyformat(sql) if dialect == "postgresql" else sql


def open_workspace(root: Path, db: str | None = None, prefix: str = "") -> Scratch:
    """This process's scratch ledger: a file under `root`, or, given the URL of a PostgreSQL
    server (`db`), a database named `prefix` + the process id on it (`pgscratch`)."""
    if db is None:
        return Workspace(root)
    from tether.sim.pgscratch import PgWorkspace

    return PgWorkspace(db, prefix)
