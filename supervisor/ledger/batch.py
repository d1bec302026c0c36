"""The one way ledger rules run: group commit, many rules in one transaction and one fsync.

Each rule runs in its own savepoint: a rule that refuses is rolled back alone, its rejection
recorded in its place with the few writes it keeps even when refused (`Tx.after_refusal`), and
the others commit. Callers get their results only after `COMMIT`
returns, i.e. once the batch is durable, and only then are the batch's decisions logged
(`BatchResult.notes`, `decisions`).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.ledger.decisions import Decision, Note
from supervisor.ledger.errors import LedgerError, Refused, StorageError
from supervisor.ledger.journal import record_rejection
from supervisor.ledger.tx import LedgerConfig, Tx

Rule = Callable[[Tx], Any]


def random_id() -> str:
    return uuid.uuid4().hex


@dataclasses.dataclass
class RuleOutcome:
    """What one rule of a batch came to: its value, or the error it was refused or failed with."""

    value: Any = None
    error: BaseException | None = None


@dataclasses.dataclass
class BatchResult:
    outcomes: list[RuleOutcome]
    woken_pools: set[str]
    touched_tasks: set[str]
    notes: list[Note] = dataclasses.field(default_factory=list)  # empty unless committed


class RuleCrashed(LedgerError):
    """A ledger rule failed unexpectedly; its writes were rolled back."""


# SQLite's primary result codes that are about the storage, not about the statement: a full
# disk, an I/O error, a lock held too long, a read-only or damaged file.
_STORAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_PROTOCOL,
    }
)  # fmt: skip


def _failure_of(exc: Exception) -> LedgerError:
    """A rule's unexpected error: the storage failing under it (503 `unavailable`, for the
    operator), or a bug in the rule, an SQL mistake included (500 `internal`)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in _STORAGE_CODES:
        failed: LedgerError = StorageError(f"the ledger could not write: {exc}")
    else:
        failed = RuleCrashed(f"{type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed


def execute_batch(
    db: sqlite3.Connection,
    rules: Sequence[Rule],
    make_tx: Callable[[], Tx],
    *,
    commit: bool = True,
) -> BatchResult:
    """Run `rules` in one transaction and commit it. With `commit=False` the transaction is
    rolled back instead, leaving what a crash just before `COMMIT` leaves: nothing."""
    outcomes = [RuleOutcome() for _ in rules]
    woken: set[str] = set()
    touched: set[str] = set()
    notes: list[Note] = []
    savepoints = db.cursor()  # one cursor for the two statements every rule runs: cheaper
    try:
        db.execute("BEGIN IMMEDIATE")
        for rule, outcome in zip(rules, outcomes, strict=True):
            tx = make_tx()
            savepoints.execute("SAVEPOINT rule")
            try:
                outcome.value = rule(tx)
            except Refused as exc:
                db.execute("ROLLBACK TO rule")
                outcome.error = _after_refusal(db, tx) or exc
                if outcome.error is exc and exc.recorded:
                    task_id = record_rejection(
                        tx, code=exc.code.value, detail=exc.detail,
                        task_id=exc.task_id, step_id=exc.step_id, fence=exc.fence,
                    )  # fmt: skip
                    notes.append(_refusal_note(tx, exc, task_id))
            except Exception as exc:  # a bug in one rule fails that rule alone, not its batch
                db.execute("ROLLBACK TO rule")
                outcome.error = _failure_of(exc)
            else:
                woken |= tx.woken_pools
                touched |= tx.touched_tasks
                notes += tx.notes
            savepoints.execute("RELEASE rule")
        db.execute("COMMIT" if commit else "ROLLBACK")
    except BaseException as exc:
        if db.in_transaction:
            db.execute("ROLLBACK")
        failure = StorageError(f"the ledger could not commit: {exc}")
        failure.__cause__ = exc
        for outcome in outcomes:
            outcome.value, outcome.error = None, failure
        if not isinstance(exc, sqlite3.Error):
            raise
        return BatchResult(outcomes, set(), set())
    if not commit:
        return BatchResult(outcomes, set(), set())
    return BatchResult(outcomes, woken, touched, notes)


def _after_refusal(db: sqlite3.Connection, tx: Tx) -> LedgerError | None:
    """Run the writes a refused rule keeps (`Tx.after_refusal`) after its rollback. One that
    fails is a bug: everything the rule wrote is rolled back and its failure returned."""
    try:
        for write in tx.after_refusal:
            write(tx)
    except Exception as exc:
        db.execute("ROLLBACK TO rule")
        return _failure_of(exc)
    return None


def _refusal_note(tx: Tx, exc: Refused, task_id: str | None) -> Note:
    """The log line of a recorded refusal: the task's tenant and pool, and the attempt its
    fence names, if any."""
    fields: dict[str, Any] = {
        "request": tx.request, "code": exc.code.value, "detail": exc.detail,
        "task_id": task_id, "step_id": exc.step_id, "fence": exc.fence,
    }  # fmt: skip
    if task_id is not None:
        task = tx.one("SELECT tenant, pool FROM tasks WHERE id = ?", (task_id,))
        if task is not None:
            fields.update(tenant=task["tenant"], pool=task["pool"])
    if exc.fence is not None:
        row = tx.one(
            "SELECT attempt, runner_id, token_id FROM attempts WHERE fence = ?", (exc.fence,)
        )
        if row is not None:
            fields.update(
                attempt=row["attempt"], runner_id=row["runner_id"], token_id=row["token_id"]
            )
    return Decision.REFUSED, fields


@dataclasses.dataclass(kw_only=True)
class Transactions:
    """Runs ledger rules on one connection: each rule gets a `Tx` at the clock's current time,
    with the ledger's config and id source, and every batch goes through `execute_batch`. The
    store, the admin commands and the schedule explorer all run rules through it."""

    db: sqlite3.Connection
    config: LedgerConfig
    clock: Callable[[], float]
    new_id: Callable[[], str] = random_id

    def tx(self) -> Tx:
        return Tx(db=self.db, now=self.clock(), config=self.config, new_id=self.new_id)

    def run(self, rules: Sequence[Rule], *, commit: bool = True) -> BatchResult:
        """One batch; `commit=False` rolls it back instead (see `execute_batch`)."""
        return execute_batch(self.db, rules, self.tx, commit=commit)

    def one(self, rule: Rule) -> Any:
        """Run `rule` in a batch of its own and return its value, or raise its error."""
        [outcome] = self.run([rule]).outcomes
        if outcome.error is not None:
            raise outcome.error
        return outcome.value
