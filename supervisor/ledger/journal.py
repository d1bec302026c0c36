"""The event journal: append-only, one strictly increasing sequence number for the whole ledger.

Consumers apply events in sequence order and ignore any sequence number at or below the last
one they applied, so a redelivered or replayed event can never move their view backwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.supervisor.ledger.tx import Tx, dumps


def append_event(tx: Tx, task_id: str, kind: str, state: str, data: Mapping[str, Any]) -> int:
    row = tx.one("append_event", (task_id, kind, str(state), dumps(dict(data)), tx.now))
    assert row is not None
    seq = int(row["seq"])
    tx.last_seqs[task_id] = seq
    return seq


def settle(tx: Tx) -> None:
    """Record on each task the sequence number of the latest event the rule gave it: one
    write per task and rule (a grant appends two events, a last result three). The batch calls
    it as the rule ends, inside the rule's savepoint; nothing reads `last_seq` in a rule."""
    for task_id, seq in tx.last_seqs.items():
        tx.run("set_task_last_seq", (seq, task_id))


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
        row = tx.one("task_of_step", (step_id,))
        task_id = row["task_id"] if row else None
    tx.run("record_rejection", (task_id, step_id, fence, code, detail, tx.now))
    return task_id
