"""The task state machine of docs/design.md, every one of the 8x8 (from, to) pairs, each applied by
`transitions.transition` inside a real ledger transaction (`execute_batch`)."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import Sim, make_spec, own_sql
from tether.sim.plants import planted
from tether.supervisor.ledger import (
    ALLOWED,
    TERMINAL,
    InvalidTransition,
    TaskState,
    TerminalState,
)
from tether.supervisor.ledger.identity import create_task
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.tx import Tx

pytestmark = pytest.mark.backends

S = TaskState
# The project's contract, transcribed literally: "Allowed: PLANNED→{APPROVED, CANCELLED};
# APPROVED→{QUEUED, CANCELLED}; QUEUED→{RUNNING, FAILED, CANCELLED};
# RUNNING→{VERIFYING, FAILED, CANCELLED}; VERIFYING→{SUCCEEDED, FAILED}.
# SUCCEEDED, FAILED, CANCELLED are terminal and never transition."
SPEC_ALLOWED: set[tuple[TaskState, TaskState]] = {
    (S.PLANNED, S.APPROVED),
    (S.PLANNED, S.CANCELLED),
    (S.APPROVED, S.QUEUED),
    (S.APPROVED, S.CANCELLED),
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.FAILED),
    (S.QUEUED, S.CANCELLED),
    (S.RUNNING, S.VERIFYING),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
    (S.VERIFYING, S.SUCCEEDED),
    (S.VERIFYING, S.FAILED),
}
SPEC_TERMINAL = {S.SUCCEEDED, S.FAILED, S.CANCELLED}
PAIRS = list(itertools.product(TaskState, TaskState))
ALLOWED_PAIRS = [p for p in PAIRS if p in SPEC_ALLOWED]
FORBIDDEN_PAIRS = [p for p in PAIRS if p not in SPEC_ALLOWED]


def test_the_table_is_the_spec_s() -> None:
    assert len(TaskState) == 8
    assert {(a, b) for a, targets in ALLOWED.items() for b in targets} == SPEC_ALLOWED
    assert set(ALLOWED) == set(TaskState)
    assert set(TERMINAL) == SPEC_TERMINAL
    assert all(not ALLOWED[t] for t in TERMINAL)
    assert len(ALLOWED_PAIRS) == 12
    assert len(FORBIDDEN_PAIRS) == 52


def task_in(sim: Sim, state: TaskState) -> str:
    """A task put into `state` by hand, so each pair is tested on its own."""
    task_id: str = sim.run(lambda tx: create_task(tx, make_spec())).task_id
    sim.execute("UPDATE tasks SET state = ? WHERE id = ?", (state.value, task_id))
    return task_id


def snapshot(sim: Sim, task_id: str) -> tuple[object, ...]:
    task = sim.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    events = sim.execute("SELECT * FROM events ORDER BY seq").fetchall()
    return tuple(task), tuple(tuple(e) for e in events)


@pytest.mark.parametrize(("current", "target"), ALLOWED_PAIRS, ids=str)
def test_allowed_transition_moves_and_appends_a_later_event(
    sim: Sim, current: TaskState, target: TaskState
) -> None:
    task_id = task_in(sim, current)
    before = sim.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    sim.run(lambda tx: transition(tx, task_id, target, reason="why"))
    seq = sim.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    assert seq > before
    row = sim.execute("SELECT state, last_seq FROM tasks WHERE id = ?", (task_id,)).fetchone()
    assert (row["state"], row["last_seq"]) == (target.value, seq)
    event = sim.execute("SELECT * FROM events WHERE seq = ?", (seq,)).fetchone()
    assert (event["task_id"], event["kind"], event["state"]) == (task_id, "state", target.value)
    assert f'"from":"{current.value}"' in event["data_json"]
    assert sim.execute("SELECT COUNT(*) FROM rejections").fetchone()[0] == 0


@pytest.mark.parametrize(("current", "target"), FORBIDDEN_PAIRS, ids=str)
def test_forbidden_transition_is_refused_recorded_and_changes_nothing(
    sim: Sim, current: TaskState, target: TaskState
) -> None:
    task_id = task_in(sim, current)
    before = snapshot(sim, task_id)
    [outcome] = sim.batch(lambda tx: transition(tx, task_id, target))
    expected = TerminalState if current in SPEC_TERMINAL else InvalidTransition
    assert type(outcome.error) is expected
    assert snapshot(sim, task_id) == before
    [rejection] = sim.execute("SELECT * FROM rejections").fetchall()
    assert rejection["task_id"] == task_id
    assert rejection["code"] == expected.code.value


def test_a_refused_transition_rolls_back_the_rule_s_earlier_writes(sim: Sim) -> None:
    """The rule's own writes before the refusal are undone with it, not just the transition."""
    task_id = task_in(sim, S.SUCCEEDED)

    def rule(tx: Tx) -> None:
        tx.db.execute(own_sql(tx, "UPDATE tasks SET owner = 'mallory' WHERE id = ?"), (task_id,))
        transition(tx, task_id, S.RUNNING)

    with pytest.raises(TerminalState):
        sim.run(rule)
    assert sim.execute("SELECT owner FROM tasks").fetchone()[0] is None


def test_the_terminal_overwrite_plant_really_switches_the_check_off(sim: Sim) -> None:
    """The explorer's `terminal-overwrite` plant must let the bug through, or it proves nothing."""
    task_id = task_in(sim, S.SUCCEEDED)
    with planted("terminal-overwrite"):
        sim.run(lambda tx: transition(tx, task_id, S.RUNNING))
    assert sim.execute("SELECT state FROM tasks").fetchone()[0] == "RUNNING"
