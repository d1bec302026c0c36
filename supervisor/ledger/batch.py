"""The one way ledger rules run: group commit, many rules in one transaction and one fsync.

Each rule runs in its own savepoint: a rule that refuses is rolled back alone, its rejection
recorded in its place with the few writes it keeps even when refused (`Tx.after_refusal`), and
the others commit. Callers get their results only after `COMMIT`
returns, i.e. once the batch is durable, and only then are the batch's decisions logged
(`BatchResult.notes`, `decisions`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from tether.supervisor.ledger import queries
from tether.supervisor.ledger.backend_protocol import (
    Backend,
    Cursor,
    Pipeline,
    Wakeup,
    WriteConnection,
)
from tether.supervisor.ledger.backends import SQLITE
from tether.supervisor.ledger.decisions import Decision, Note
from tether.supervisor.ledger.errors import LedgerError, Refused, StorageError
from tether.supervisor.ledger.journal import record_rejection, settle
from tether.supervisor.ledger.records import RefusalAttempt, RefusalTask
from tether.supervisor.ledger.tx import LedgerConfig, Tx

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
    begun: bool = True  # False: the batch failed at BEGIN, before any of its rules ran


class RuleCrashed(LedgerError):
    """A ledger rule failed unexpectedly; its writes were rolled back."""


def _failure_of(exc: Exception, backend: Backend) -> LedgerError:
    """A rule's unexpected error: the storage failing under it (503 `unavailable`, for the
    operator), or a bug in the rule, an SQL mistake included (500 `internal`)."""
    if backend.is_storage_failure(exc):
        failed: LedgerError = StorageError(f"the ledger could not write: {exc}")
    else:
        failed = RuleCrashed(f"{type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed


def execute_batch(
    db: WriteConnection,
    rules: Sequence[Rule],
    make_tx: Callable[[], Tx],
    *,
    commit: bool = True,
    backend: Backend = SQLITE,
) -> BatchResult:
    """Run `rules` in one transaction and commit it. With `commit=False` the transaction is
    rolled back instead, leaving what a crash just before `COMMIT` leaves: nothing. A batch
    that woke anything tells other processes inside its transaction (`Backend.announce`), so
    that they hear of it only if it commits.

    Where the backend pipelines (`Backend.pipeline`: PostgreSQL), the rules' writes are sent
    with their next read, and a statement's error comes back with the answers of the reads
    after it, perhaps in a later rule's: which rule it belongs to cannot be told, so the
    batch is rolled back and run again with each statement sent alone, where a failing rule
    is rolled back alone as always. Nothing of the first run was committed or answered."""
    result = _run(db, rules, make_tx, commit=commit, backend=backend, pipelined=True)
    if result is None:
        result = _run(db, rules, make_tx, commit=commit, backend=backend, pipelined=False)
        assert result is not None
    return result


def _run(
    db: WriteConnection,
    rules: Sequence[Rule],
    make_tx: Callable[[], Tx],
    *,
    commit: bool,
    backend: Backend,
    pipelined: bool,
) -> BatchResult | None:
    """`execute_batch` once; None when a pipelined run met an error before `COMMIT` on a
    connection still there (it is rolled back then): run it again unpipelined."""
    outcomes = [RuleOutcome() for _ in rules]
    notes: list[Note] = []
    pipe: Pipeline | None = None
    begun = committing = False
    try:
        backend.begin(db)
        begun = True
        with backend.pipeline(db) if pipelined else contextlib.nullcontext() as pipe:
            queued = pipe is not None
            woken, touched = _run_rules(db, rules, make_tx, outcomes, notes, backend, queued)
            wakeup = Wakeup(frozenset(woken), bool(touched))
            if commit and wakeup:
                backend.announce(db, wakeup)
        committing = True
        db.execute("COMMIT" if commit else "ROLLBACK")
    except BaseException as exc:
        _roll_back(db, backend)
        if pipe is not None and not committing and backend.is_driver_error(exc) and not pipe.lost:
            return None
        failure = StorageError(f"the ledger could not commit: {exc}")
        failure.__cause__ = exc
        for outcome in outcomes:
            outcome.value, outcome.error = None, failure
        if not backend.is_driver_error(exc):
            raise
        return BatchResult(outcomes, set(), set(), begun=begun)
    if not commit:
        return BatchResult(outcomes, set(), set())
    return BatchResult(outcomes, woken, touched, notes)


def _run_rules(
    db: WriteConnection,
    rules: Sequence[Rule],
    make_tx: Callable[[], Tx],
    outcomes: list[RuleOutcome],
    notes: list[Note],
    backend: Backend,
    queued: bool,
) -> tuple[set[str], set[str]]:
    """Each rule in its savepoint, its outcome set in `outcomes` and its decisions added to
    `notes`; the pools the committed ones woke and the tasks they gave events. `queued`:
    statements are pipelined, so a driver error is raised for `execute_batch` to run the
    batch again (see there)."""
    woken: set[str] = set()
    touched: set[str] = set()
    # Where one execute may carry several statements, one rule's savepoint is released and
    # the next one's taken in one round trip; COMMIT releases the last one. Queued, each
    # statement goes alone, the round trip shared anyway.
    joined = backend.joins_statements and not queued
    savepoints: Cursor = db if queued else db.cursor()  # one cursor for every rule: cheaper
    if rules:
        savepoints.execute("SAVEPOINT rule")
    for index, (rule, outcome) in enumerate(zip(rules, outcomes, strict=True)):
        tx = make_tx()
        if index and not joined:
            savepoints.execute("SAVEPOINT rule")
        try:
            outcome.value = rule(tx)
            settle(tx)
        except Refused as exc:
            db.execute("ROLLBACK TO rule")
            tx.events.clear()  # the rule's events, not yet written, go with it
            tx.evented.clear()
            outcome.error = _after_refusal(db, tx, backend, queued) or exc
            if outcome.error is exc and exc.recorded:
                task_id = record_rejection(
                    tx,
                    code=exc.code.value,
                    detail=exc.detail,
                    task_id=exc.task_id,
                    step_id=exc.step_id,
                    fence=exc.fence,
                )
                notes.append(_refusal_note(tx, exc, task_id))
        except Exception as exc:  # a bug in one rule fails that rule alone, not its batch
            if queued and backend.is_driver_error(exc):
                raise  # perhaps another rule's statement: the batch runs again unpipelined
            db.execute("ROLLBACK TO rule")
            outcome.error = _failure_of(exc, backend)
        else:
            woken |= tx.woken_pools
            touched |= tx.evented
            notes += tx.notes
        if index + 1 < len(rules):
            savepoints.execute("RELEASE rule; SAVEPOINT rule" if joined else "RELEASE rule")
    return woken, touched


def _roll_back(db: WriteConnection, backend: Backend) -> None:
    """Roll back a failed batch, if its connection still can: a lost one has nothing open."""
    try:
        if backend.in_transaction(db):
            db.execute("ROLLBACK")
    except Exception as exc:
        if not backend.is_driver_error(exc):
            raise


def _after_refusal(
    db: WriteConnection, tx: Tx, backend: Backend, queued: bool
) -> LedgerError | None:
    """Run the writes a refused rule keeps (`Tx.after_refusal`) after its rollback. One that
    fails is a bug: everything the rule wrote is rolled back and its failure returned
    (`queued`: a driver error is raised, as `_run_rules` does)."""
    try:
        for write in tx.after_refusal:
            write(tx)
        settle(tx)
    except Exception as exc:
        if queued and backend.is_driver_error(exc):
            raise
        db.execute("ROLLBACK TO rule")
        return _failure_of(exc, backend)
    return None


def _refusal_note(tx: Tx, exc: Refused, task_id: str | None) -> Note:
    """The log line of a recorded refusal: the task's tenant and pool, and the attempt its
    fence names, if any."""
    fields: dict[str, Any] = {
        "request": tx.request,
        "code": exc.code.value,
        "detail": exc.detail,
        "task_id": task_id,
        "step_id": exc.step_id,
        "fence": exc.fence,
    }
    if task_id is not None:
        task = tx.one_as(RefusalTask, "refusal_task", task_id=task_id)
        if task is not None:
            fields.update(tenant=task.tenant, pool=task.pool)
    if exc.fence is not None:
        row = tx.one_as(RefusalAttempt, "refusal_attempt", fence=exc.fence)
        if row is not None:
            fields.update(attempt=row.attempt, runner_id=row.runner_id, token_id=row.token_id)
    return Decision.REFUSED, fields


@dataclasses.dataclass(kw_only=True)
class Transactions:
    """Runs ledger rules on one connection: each rule gets a `Tx` at the clock's current time,
    with the ledger's config and id source, and every batch goes through `execute_batch`. The
    store, the admin commands and the schedule explorer all run rules through it, on SQLite
    unless given another `backend`."""

    db: WriteConnection
    config: LedgerConfig
    clock: Callable[[], float]
    new_id: Callable[[], str] = random_id
    backend: Backend = SQLITE

    def tx(self) -> Tx:
        return Tx(
            db=self.db,
            now=self.clock(),
            config=self.config,
            new_id=self.new_id,
            sql=queries.load(self.backend.dialect),
        )

    def run(self, rules: Sequence[Rule], *, commit: bool = True) -> BatchResult:
        """One batch; `commit=False` rolls it back instead (see `execute_batch`). A connection
        lost since the last batch is opened anew first (`Backend.live`); if that fails, every
        rule gets a `StorageError` and the next batch tries again. A connection found lost by
        the batch's BEGIN (the server restarted while it sat idle) is opened anew and the
        batch run once more: none of it ran."""
        failed = self._reconnected(rules)
        if failed is not None:
            return failed
        result = execute_batch(self.db, rules, self.tx, commit=commit, backend=self.backend)
        if result.begun:
            return result
        lost = self.db
        failed = self._reconnected(rules)
        if failed is not None:
            return failed
        if self.db is lost:  # the connection is fine: a lock wait timed out, say
            return result
        return execute_batch(self.db, rules, self.tx, commit=commit, backend=self.backend)

    def _reconnected(self, rules: Sequence[Rule]) -> BatchResult | None:
        """Replace a lost connection (`Backend.live`); if that fails, the batch's result: a
        `StorageError` for every rule."""
        try:
            self.db = self.backend.live(self.db)
        except Exception as exc:
            if not (isinstance(exc, StorageError) or self.backend.is_driver_error(exc)):
                raise
            # A StorageError already says which database, without its password (PostgreSQL's
            # `live`); SQLite's driver errors name a file at most.
            why = exc.detail if isinstance(exc, StorageError) else " ".join(str(exc).split())
            failure = StorageError(f"the ledger cannot reconnect: {why}")
            failure.__cause__ = exc
            return BatchResult([RuleOutcome(error=failure) for _ in rules], set(), set())
        return None

    def one(self, rule: Rule) -> Any:
        """Run `rule` in a batch of its own and return its value, or raise its error."""
        [outcome] = self.run([rule]).outcomes
        if outcome.error is not None:
            raise outcome.error
        return outcome.value
