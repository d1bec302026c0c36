"""The review record's stamps: `transitions.transition` sets approved_at, started_at and finished_at
when a task first enters the state that stamps each, and a later move never overwrites one."""

from __future__ import annotations

import pytest

from tests.conftest import FakeClock, Sim, make_spec
from tether.supervisor.ledger import TaskState
from tether.supervisor.ledger.identity import create_task
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.tx import Tx

pytestmark = pytest.mark.backends

S = TaskState


def stamps(sim: Sim, task_id: str) -> tuple[object, ...]:
    row = sim.execute(
        "SELECT state, reason, approved_at, started_at, finished_at FROM tasks WHERE id = ?",
        (task_id,),
    ).fetchone()
    return tuple(row)


def test_each_stamp_is_set_once_when_its_state_is_entered(sim: Sim, clock: FakeClock) -> None:
    task_id: str = sim.run(lambda tx: create_task(tx, make_spec())).task_id
    assert stamps(sim, task_id)[2:] == (None, None, None)
    at: dict[TaskState, float] = {}
    for target in (S.APPROVED, S.QUEUED, S.RUNNING, S.VERIFYING, S.FAILED):
        clock.advance(7.0)
        at[target] = clock.now
        reason = "checks failed" if target is S.FAILED else None

        def move(tx: Tx, target: TaskState = target, reason: str | None = reason) -> None:
            transition(tx, task_id, target, reason=reason)

        sim.run(move)
    assert stamps(sim, task_id) == (
        "FAILED",
        "checks failed",
        at[S.APPROVED],
        at[S.RUNNING],
        at[S.FAILED],
    )


def test_a_stamp_already_held_is_kept(sim: Sim, clock: FakeClock) -> None:
    """A task put back into a stamping state by hand keeps the first moment it got there."""
    task_id: str = sim.run(lambda tx: create_task(tx, make_spec())).task_id
    sim.run(lambda tx: transition(tx, task_id, S.APPROVED))
    first = clock.now
    sim.execute("UPDATE tasks SET state = 'PLANNED' WHERE id = ?", (task_id,))
    clock.advance(60.0)
    sim.run(lambda tx: transition(tx, task_id, S.APPROVED, reason="again"))
    assert stamps(sim, task_id) == ("APPROVED", "again", first, None, None)


def test_a_move_without_a_reason_keeps_the_one_held(sim: Sim) -> None:
    task_id: str = sim.run(lambda tx: create_task(tx, make_spec())).task_id
    sim.run(lambda tx: transition(tx, task_id, S.CANCELLED, reason="operator said so"))
    sim.execute("UPDATE tasks SET state = 'QUEUED' WHERE id = ?", (task_id,))
    sim.run(lambda tx: transition(tx, task_id, S.RUNNING))
    assert stamps(sim, task_id)[:2] == ("RUNNING", "operator said so")
