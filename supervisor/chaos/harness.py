"""The real ledger, run synchronously on a scratch SQLite file with a virtual clock.

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
from typing import Any

from supervisor.chaos.plants import Plant
from supervisor.ledger import reaper
from supervisor.ledger.batch import Rule, RuleOutcome, Transactions
from supervisor.ledger.schema import open_ledger_file
from supervisor.ledger.tx import LedgerConfig

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


class Workspace:
    """One process's scratch directory: the file schedules run on, migrated once, and an empty,
    migrated ledger in memory that resets it between schedules (SQLite's backup API: a fraction
    of a millisecond, where copying and reopening costs several)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / f"p{os.getpid()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = self.dir / "ledger.db"
        _remove(self.ledger)
        self._template = sqlite3.connect(":memory:")
        migrated = open_ledger_file(self.ledger, synchronous="OFF")
        migrated.backup(self._template)
        self._spare: sqlite3.Connection | None = migrated

    def fresh(self) -> sqlite3.Connection:
        """A connection to the schedule file, which now holds an empty, migrated ledger."""
        db, self._spare = self._spare, None
        if db is None:
            db = open_ledger_file(self.ledger, synchronous="OFF")
        self._template.backup(db)
        return db

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None
        self._template.close()

    def recycle(self, db: sqlite3.Connection) -> None:
        """Keep a schedule's last connection for the next schedule."""
        if db.in_transaction:
            db.close()
            return
        if self._spare is not None:
            self._spare.close()
        self._spare = db


class Harness:
    """The ledger file of one schedule, its virtual clock and its id counter.

    A planted bug's index (`Plant.drop_index`) is dropped from the fresh ledger; swapping its
    function is `plants.planted`'s part.
    """

    def __init__(
        self, workspace: Workspace, *, config: LedgerConfig, plant: Plant | None = None
    ) -> None:
        self.workspace = workspace
        self.path = workspace.ledger
        self.config = config
        self.now = START
        self._ids = 0
        self.db = workspace.fresh()
        if plant is not None and plant.drop_index is not None:
            self.db.execute(f"DROP INDEX IF EXISTS {plant.drop_index}")
        self.transactions = self._transactions()

    def _transactions(self) -> Transactions:
        return Transactions(
            db=self.db, config=self.config, clock=lambda: self.now, new_id=self.new_id
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

        Closing the connection rolls back an open transaction, as a power cut would; the file
        is reopened the way `SqliteLedger.open` does: integrity check, migrations, then
        `refresh_after_restart`.
        """
        self.db.close()
        return self._boot()

    def _boot(self) -> int:
        self.db = open_ledger_file(self.path, synchronous="OFF")
        self.transactions = self._transactions()
        [outcome] = self.run([reaper.refresh_after_restart])
        if outcome.error is not None:
            raise outcome.error
        refreshed: int = outcome.value
        return refreshed

    def states(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self.db.execute("SELECT id, state FROM tasks ORDER BY id")]

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return self.db.execute(sql, params).fetchall()

    def close(self) -> None:
        self.workspace.recycle(self.db)
