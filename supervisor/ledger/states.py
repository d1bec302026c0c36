"""The task state machine's states and its table of allowed transitions, as data
(docs/design.md, Task state machine); `transitions` applies the table in a transaction."""

from __future__ import annotations

import enum
from collections.abc import Mapping


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


def is_allowed(current: TaskState, target: TaskState) -> bool:
    return target in ALLOWED[current]
