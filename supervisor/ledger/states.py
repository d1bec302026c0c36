"""The task state machine (docs/design.md, Task state machine): the table of allowed
transitions is data, and one function applies it inside the transaction that appends the event."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from tether.supervisor.ledger.errors import InvalidTransition, NotFound, TerminalState
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.tx import Tx


class TaskState(enum.StrEnum):
    PLANNED = "PLANNED"
    APPROVED = "APPROVED"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    VERIFYING = "VERIFYING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class StepState(enum.StrEnum):
    WAITING = "waiting"  # an earlier step is not committed yet
    QUEUED = "queued"  # may be leased
    LEASED = "leased"
    DUE = "due"  # an effect step the supervisor delivers: its outbox row says how far it got
    COMMITTED = "committed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptState(enum.StrEnum):
    LEASED = "leased"
    COMMITTED = "committed"
    EXPIRED = "expired"
    RELEASED = "released"
    CANCELLED = "cancelled"
    FAILED = "failed"


TERMINAL: frozenset[TaskState] = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}
)

ALLOWED: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.PLANNED: frozenset({TaskState.APPROVED, TaskState.CANCELLED}),
    TaskState.APPROVED: frozenset({TaskState.QUEUED, TaskState.CANCELLED}),
    TaskState.QUEUED: frozenset({TaskState.RUNNING, TaskState.FAILED, TaskState.CANCELLED}),
    TaskState.RUNNING: frozenset({TaskState.VERIFYING, TaskState.FAILED, TaskState.CANCELLED}),
    TaskState.VERIFYING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}

# The query that moves a task into a state which stamps a column for the review record
# (approved_at, started_at, finished_at); the time is its third parameter.
_STAMPING: Mapping[TaskState, str] = {
    TaskState.APPROVED: "move_task_approving",
    TaskState.RUNNING: "move_task_starting",
    TaskState.SUCCEEDED: "move_task_finishing",
    TaskState.FAILED: "move_task_finishing",
    TaskState.CANCELLED: "move_task_finishing",
}


def is_allowed(current: TaskState, target: TaskState) -> bool:
    return target in ALLOWED[current]


def task_state(tx: Tx, task_id: str) -> TaskState:
    row = tx.one("task_state", (task_id,))
    if row is None:
        raise NotFound(f"no task {task_id}")
    return TaskState(row["state"])


def require_allowed(task_id: str, current: TaskState, target: TaskState) -> None:
    """`TerminalState` if the task has ended, `InvalidTransition` for any other move the table
    forbids; the store records either as a rejected attempt."""
    if current in TERMINAL:
        raise TerminalState(
            f"task {task_id} is already {current}; it cannot become {target}"
        ).about(task_id=task_id)
    if not is_allowed(current, target):
        raise InvalidTransition(f"task {task_id}: {current} -> {target} is not allowed").about(
            task_id=task_id
        )


def transition(
    tx: Tx,
    task_id: str,
    target: TaskState,
    *,
    reason: str | None = None,
    data: Mapping[str, Any] | None = None,
    current: TaskState | None = None,
) -> int:
    """Move a task to `target` and append its event; return the event's sequence number.
    `current`: the state the rule read in this transaction and has not changed since, saving
    the read."""
    if current is None:
        current = task_state(tx, task_id)
    require_allowed(task_id, current, target)
    stamping = _STAMPING.get(target)
    if stamping is None:
        tx.run("move_task", (target.value, reason, task_id))
    else:
        tx.run(stamping, (target.value, reason, tx.now, task_id))
    payload = {"from": current.value, **(data or {})}
    if reason:
        payload["reason"] = reason
    return append_event(tx, task_id, "state", target, payload)
