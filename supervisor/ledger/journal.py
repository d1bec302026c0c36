"""The event journal: append-only, one strictly increasing sequence number for the whole ledger.

Consumers apply events in sequence order and ignore any sequence number at or below the last
one they applied, so a redelivered or replayed event can never move their view backwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.supervisor.ledger.tx import Tx, dumps


def append_event(tx: Tx, task_id: str, kind: str, state: str, data: Mapping[str, Any]) -> None:
    """Append one event of `task_id`'s. It is kept in the `Tx` and written, after the rule's
    earlier events, when the rule ends (`settle`); nothing reads the journal inside a rule."""
    tx.events.append((task_id, kind, str(state), dumps(dict(data))))
    tx.evented.add(task_id)


def settle(tx: Tx) -> None:
    """Write the rule's events in the order it appended them, and record on each task the
    sequence number of its latest: on PostgreSQL one statement (`append_events`, its insert in
    a data-modifying CTE), on SQLite, whose `WITH` cannot hold an insert, that insert and one
    `set_task_last_seq` per task. The write asks nothing back, so on PostgreSQL it rides the
    next round trip (docs/design.md, The ledger on disk). The batch calls it as the rule ends,
    inside the rule's savepoint, and after a refused rule's kept writes; nothing reads
    `last_seq` in a rule."""
    if not tx.events:
        return
    tx.run("append_events", events=dumps(tx.events), now=tx.now)
    tx.events.clear()
    if tx.sql["append_events"].dialect == "sqlite":
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
