"""Group commit: many rules, one transaction, one fsync.

`execute_batch` runs a list of rules in one `BEGIN IMMEDIATE` transaction, each inside its own
savepoint. A rule that refuses is rolled back alone, its rejection recorded in its place, and
the others commit. Callers are answered only after `COMMIT` returns, i.e. once the batch is
durable. The store runs this on its writer thread; the schedule explorer calls it directly.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.ledger.errors import LedgerError, Refused, StorageError
from supervisor.ledger.journal import record_rejection
from supervisor.ledger.tx import Tx

Rule = Callable[[Tx], Any]


@dataclasses.dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None


@dataclasses.dataclass
class BatchResult:
    outcomes: list[Outcome]
    woken_pools: set[str]
    touched_tasks: set[str]


class RuleCrashed(LedgerError):
    """A ledger rule failed unexpectedly; its writes were rolled back."""


def execute_batch(
    db: sqlite3.Connection, rules: Sequence[Rule], make_tx: Callable[[], Tx]
) -> BatchResult:
    outcomes = [Outcome() for _ in rules]
    woken: set[str] = set()
    touched: set[str] = set()
    try:
        db.execute("BEGIN IMMEDIATE")
        for rule, outcome in zip(rules, outcomes, strict=True):
            tx = make_tx()
            db.execute("SAVEPOINT rule")
            try:
                outcome.value = rule(tx)
            except Refused as exc:
                db.execute("ROLLBACK TO rule")
                if exc.recorded:
                    record_rejection(
                        tx, code=exc.code.value, detail=exc.detail,
                        task_id=exc.task_id, step_id=exc.step_id, fence=exc.fence,
                    )  # fmt: skip
                outcome.error = exc
            except sqlite3.OperationalError as exc:  # the storage (full, I/O error, locked)
                db.execute("ROLLBACK TO rule")
                failed = StorageError(f"the ledger could not write: {exc}")
                failed.__cause__ = exc
                outcome.error = failed
            except Exception as exc:  # a bug in one rule fails that rule alone, not its batch
                db.execute("ROLLBACK TO rule")
                crashed = RuleCrashed(f"{type(exc).__name__}: {exc}")
                crashed.__cause__ = exc
                outcome.error = crashed
            else:
                woken |= tx.woken_pools
                touched |= tx.touched_tasks
            db.execute("RELEASE rule")
        db.execute("COMMIT")
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
    return BatchResult(outcomes, woken, touched)
