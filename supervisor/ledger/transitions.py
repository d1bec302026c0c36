"""The task state machine applied (docs/design.md, Task state machine): one function moves a
task inside the transaction that appends the event, as the table in `states` allows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tether.supervisor.ledger.errors import InvalidTransition, NotFound, TerminalState
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.states import TERMINAL, TaskState, is_allowed
from tether.supervisor.ledger.tx import Tx

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"require_allowed"})

# The query that moves a task into a state which stamps a column for the review record
# (approved_at, started_at, finished_at) at its parameter `now`.
_STAMPING: Mapping[TaskState, str] = {
    TaskState.APPROVED: "move_task_approving",
    TaskState.RUNNING: "move_task_starting",
    TaskState.SUCCEEDED: "move_task_finishing",
    TaskState.FAILED: "move_task_finishing",
    TaskState.CANCELLED: "move_task_finishing",
}


def task_state(tx: Tx, task_id: str) -> TaskState:
    row = tx.one("task_state", task_id=task_id)
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
) -> None:
    """Move a task to `target` and append its event. `current`: the state the rule read in
    this transaction and has not changed since, saving the read."""
    if current is None:
        current = task_state(tx, task_id)
    require_allowed(task_id, current, target)
    stamping = _STAMPING.get(target)
    if stamping is None:
        tx.run("move_task", state=target.value, reason=reason, task_id=task_id)
    else:
        tx.run(stamping, state=target.value, reason=reason, now=tx.now, task_id=task_id)
    payload = {"from": current.value, **(data or {})}
    if reason:
        payload["reason"] = reason
    append_event(tx, task_id, "state", target, payload)
