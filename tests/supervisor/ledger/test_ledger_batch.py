"""Group commit (`execute_batch`, `SqliteLedger.write`): many rules share one transaction, and
a rule that is refused, or that crashes, is rolled back alone while its neighbours commit."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from functools import partial

import anyio
import pytest

from tests.conftest import Sim, count, make_spec, own_sql
from tether.supervisor.ledger import (
    Created,
    LedgerError,
    NotFound,
    PlanMismatch,
    SqliteLedger,
    StorageError,
    TaskState,
    TerminalState,
    Tx,
)
from tether.supervisor.ledger.batch import RuleCrashed
from tether.supervisor.ledger.identity import create_task
from tether.supervisor.ledger.transitions import task_state, transition

pytestmark = pytest.mark.backends


async def test_concurrent_writes_share_batches(ledger: SqliteLedger) -> None:
    batches, rules = ledger.counters.batches, ledger.counters.batched_rules
    created: list[Created] = []

    async def create(i: int) -> None:
        created.append(await ledger.create_task(make_spec(f"k{i}")))

    async with anyio.create_task_group() as tg:
        for i in range(100):
            tg.start_soon(create, i)
    assert len({c.task_id for c in created}) == 100
    assert count(ledger, "tasks") == 100
    assert ledger.counters.batched_rules - rules == 100
    assert ledger.counters.batches - batches < 100
    assert ledger.counters.batches < ledger.counters.batched_rules


def test_a_refused_rule_does_not_roll_back_its_neighbours(sim: Sim) -> None:
    def cancel_a_missing_task(tx: Tx) -> None:
        transition(tx, "no-such-task", TaskState.CANCELLED)

    done = sim.run(lambda tx: create_task(tx, make_spec("done"))).task_id
    sim.execute("UPDATE tasks SET state = 'SUCCEEDED' WHERE id = ?", (done,))
    first, refused, missing, crashed, last = sim.batch(
        lambda tx: create_task(tx, make_spec("a")),
        lambda tx: transition(tx, done, TaskState.RUNNING),
        cancel_a_missing_task,
        crash_after_writing,
        lambda tx: create_task(tx, make_spec("b")),
    )
    assert first.error is None
    assert last.error is None
    assert isinstance(refused.error, TerminalState)
    assert isinstance(missing.error, NotFound)
    assert isinstance(crashed.error, RuleCrashed)
    keys = [r[0] for r in sim.execute("SELECT idempotency_key FROM tasks ORDER BY created_order")]
    assert keys == ["done", "a", "b"]
    assert sim.execute("SELECT state FROM tasks WHERE id = ?", (done,)).fetchone()[0] == (
        "SUCCEEDED"
    )
    assert [r[0] for r in sim.execute("SELECT code FROM rejections")] == ["terminal"]
    assert sim.execute("SELECT owner FROM tasks WHERE owner = 'crashed'").fetchone() is None


def full_disk(sim: Sim) -> Exception:
    """The error a full disk raises on the statement that meets it, as each driver reports it."""
    if sim.on_postgresql:
        import psycopg

        return psycopg.errors.DiskFull("database or disk is full")  # SQLSTATE 53100
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # as SQLite itself reports it
    return full


def test_a_storage_failure_inside_a_rule_is_a_storage_error_not_a_bug(sim: Sim) -> None:
    """The storage reports a full disk or an I/O error on the statement that meets it; that
    rule is answered 503 `unavailable` (a condition for the operator), not 500 `internal` (a
    bug)."""

    def meet_a_full_disk(tx: Tx) -> None:
        tx.db.execute("UPDATE tasks SET owner = 'half-written'")
        raise full_disk(sim)

    def name_a_missing_column(tx: Tx) -> None:
        tx.db.execute("UPDATE tasks SET no_such_column = 1")

    sim.run(lambda tx: create_task(tx, make_spec("a")))
    full, mistake, after = sim.batch(
        meet_a_full_disk, name_a_missing_column, lambda tx: create_task(tx, make_spec("b"))
    )
    assert isinstance(full.error, StorageError)
    assert not isinstance(full.error, RuleCrashed)
    assert "database or disk is full" in full.error.detail
    assert isinstance(mistake.error, RuleCrashed)  # an SQL mistake is a bug, not the storage
    assert after.error is None
    assert sim.execute("SELECT owner FROM tasks WHERE owner = 'half-written'").fetchone() is None


def test_a_write_whose_error_comes_back_in_a_later_rule_fails_its_own_rule_alone(
    sim: Sim,
) -> None:
    """On PostgreSQL a write that asks nothing back goes to the server with the next statement
    that does, here the next rule's read, and its error comes back with that read's answer:
    the batch runs again with each statement sent alone, and only the rule that wrote fails.
    On SQLite the write fails where it is made."""
    task_id = sim.run(lambda tx: create_task(tx, make_spec("a"))).task_id
    calls: list[str] = []

    def write_then_break_a_constraint(tx: Tx) -> None:
        calls.append("writer")
        tx.db.execute(
            own_sql(tx, "UPDATE tasks SET owner = 'half-written' WHERE id = ?"), (task_id,)
        )
        tx.db.execute(own_sql(tx, "UPDATE tasks SET state = NULL WHERE id = ?"), (task_id,))

    def read_the_task(tx: Tx) -> str:
        calls.append("reader")
        return str(task_state(tx, task_id))

    broken, read, created = sim.batch(
        write_then_break_a_constraint, read_the_task, lambda tx: create_task(tx, make_spec("b"))
    )
    assert isinstance(broken.error, RuleCrashed)
    assert read.error is None
    assert read.value == "PLANNED"
    assert created.error is None
    keys = [r[0] for r in sim.execute("SELECT idempotency_key FROM tasks ORDER BY created_order")]
    assert keys == ["a", "b"]
    assert sim.execute("SELECT owner FROM tasks WHERE owner = 'half-written'").fetchone() is None
    # Pipelined, the error comes back with the reader's read or, when the server's answer is
    # there first, as the writer's rule ends: either way the first run was rolled back whole
    # and the batch ran again, each statement alone.
    if sim.on_postgresql:
        assert calls in (["writer", "reader", "writer", "reader"], ["writer", "writer", "reader"])
    else:
        assert calls == ["writer", "reader"]


def crash_after_writing(tx: Tx) -> None:
    tx.db.execute("UPDATE tasks SET owner = 'crashed'")
    raise RuntimeError("a bug in a rule")


async def test_a_refused_write_through_the_store_leaves_concurrent_ones_intact(
    ledger: SqliteLedger,
) -> None:
    spec = make_spec("target")
    target = (await ledger.create_task(spec)).task_id
    outcomes: dict[str, object] = {}

    async def attempt(name: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            outcomes[name] = await call()
        except LedgerError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(attempt, f"create{i}", partial(ledger.create_task, make_spec(f"n{i}")))
        tg.start_soon(attempt, "mismatch", partial(ledger.approve, "acme", target, "0" * 64, None))
        tg.start_soon(attempt, "crash", partial(ledger.write, crash_after_writing))
    assert isinstance(outcomes.pop("mismatch"), PlanMismatch)
    assert isinstance(outcomes.pop("crash"), RuleCrashed)
    assert all(isinstance(v, Created) for v in outcomes.values())
    assert count(ledger, "tasks") == 11
    assert count(ledger, "tasks", "owner = 'crashed'") == 0
    # The writer survived the crash: the ledger still answers.
    assert (await ledger.create_task(make_spec("after"))).created is True
    with pytest.raises(PlanMismatch):
        await ledger.approve("acme", target, "1" * 64, None)
