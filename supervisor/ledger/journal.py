"""The event journal: append-only, one strictly increasing sequence number for the whole ledger.

Consumers apply events in sequence order and ignore any sequence number at or below the last
one they applied, so a redelivered or replayed event can never move their view backwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.supervisor.ledger.tx import Tx, dumps


def append_event(tx: Tx, task_id: str, kind: str, state: str, data: Mapping[str, Any]) -> None:
    """Append one event of `task_id`'s. Its sequence number is not read back: the write asks
    nothing of the server, so on PostgreSQL it rides the rule's next round trip (docs/design.md,
    The ledger on disk)."""
    tx.run(
        "append_event",
        task_id=task_id,
        kind=kind,
        state=str(state),
        data_json=dumps(dict(data)),
        now=tx.now,
    )
    tx.evented.add(task_id)


def settle(tx: Tx) -> None:
    """Record on each task the sequence number of the latest event the rule gave it, read from
    the journal by the write itself: one write per task and rule (a grant appends two events,
    a last result three). The batch calls it as the rule ends, inside the rule's savepoint;
    nothing reads `last_seq` in a rule."""
    for task_id in tx.evented:
        tx.run("set_task_last_seq", task_id=task_id)


def record_rejection(
    tx: Tx,
    *,
    code: str,
    detail: str,
    task_id: str | None,
    step_id: str | None,
    fence: int | None,
) -> str | None:
    """A refused write, kept for operators and the review record; it never changes a state.
    Returns the task it concerns, if known."""
    if task_id is None and step_id is not None:
        row = tx.one("task_of_step", step_id=step_id)
        task_id = row["task_id"] if row else None
    tx.run(
        "record_rejection",
        task_id=task_id,
        step_id=step_id,
        fence=fence,
        code=code,
        detail=detail,
        now=tx.now,
    )
    return task_id
