"""An outbox row's reads and moves that the lifecycle, the dispatcher's rules and the gates
share: whether an attempt may have been sent, making a row uncertain or withdrawn, and
settling the rows of a task that ended (docs/design.md, Effects)."""

from __future__ import annotations

from typing import Any, Final

from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import NotFound
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.outbox import ENDS, UNHELD, OutboxState
from tether.supervisor.ledger.records import DeliveryRow, EffectRow
from tether.supervisor.ledger.states import TERMINAL, TaskState
from tether.supervisor.ledger.tx import Tx, TypedReads

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"maybe_sent"})


def effect_row(s: TypedReads, effect_id: str) -> EffectRow:
    row = s.one_as(EffectRow, "effect_row", step_id=effect_id)
    if row is None:
        raise NotFound(f"no effect {effect_id}")
    return row


def task_ended(row: EffectRow) -> bool:
    return TaskState(row.task_state) in TERMINAL


def set_state(tx: Tx, effect_id: str, state: OutboxState) -> None:
    """Move the row to `state`, dropping its holder; an end state records when it ended.
    (`outbox_delivery.take` hands rows to a dispatcher; `outbox_gates.open_gate` and
    `resolve` move them with the columns their gate changes.)"""
    if state is OutboxState.SENDING:
        raise ValueError("a row becomes `sending` only when a dispatcher takes it")
    if state in ENDS:
        tx.run("end_effect", state=state.value, now=tx.now, step_id=effect_id)
    else:
        tx.run("move_effect", state=state.value, step_id=effect_id)


def unsettled_attempts(s: TypedReads, row: EffectRow, opening_only: bool) -> list[DeliveryRow]:
    """The effect's attempts an operator's word has not settled (`settled_attempts`); with
    `opening_only`, those of its current gate opening."""
    if opening_only:
        return s.all_as(
            DeliveryRow,
            "unsettled_deliveries_of_opening",
            step_id=row.step_id,
            settled_attempts=row.settled_attempts,
            opening=row.openings,
        )
    return s.all_as(
        DeliveryRow,
        "unsettled_deliveries",
        step_id=row.step_id,
        settled_attempts=row.settled_attempts,
    )


def maybe_sent(attempts: list[DeliveryRow]) -> bool:
    """Whether any of these attempts may have reached the receiver: one answered `sent`, or
    one begun and never answered."""
    return any(a.sent is None or a.sent for a in attempts)


def make_uncertain(tx: Tx, row: EffectRow, why: str) -> None:
    set_state(tx, row.step_id, OutboxState.UNCERTAIN)
    append_event(
        tx,
        row.task_id,
        "effect_uncertain",
        row.task_state,
        {"step_id": row.step_id, "why": why},
    )
    tx.note(
        Decision.EFFECT_UNCERTAIN,
        task_id=row.task_id,
        step_id=row.step_id,
        kind=row.kind,
        why=why,
        tenant=row.tenant,
    )


def settle_ended(tx: Tx, row: EffectRow, why: str) -> None:
    """A row whose task ended: withdrawn if nothing of it can have been sent, else
    `uncertain` for an operator, keyed or not: after the task ended nothing sends it again,
    so only an operator can say whether the receiver applied it (the task stays ended either
    way). An unkeyed effect counts the attempts of its current gate opening."""
    if maybe_sent(unsettled_attempts(tx, row, opening_only=not row.keyed)):
        make_uncertain(tx, row, f"{why}; its task ended")
    else:
        withdraw(tx, row, "nothing of it was sent before its task ended")


def withdraw(tx: Tx, row: EffectRow, why: str, **data: Any) -> None:
    """The effect will never be sent: its row `withdrawn`, its step cancelled."""
    set_state(tx, row.step_id, OutboxState.WITHDRAWN)
    tx.run("cancel_effect_step", step_id=row.step_id)
    append_event(
        tx,
        row.task_id,
        "effect_withdrawn",
        row.task_state,
        {"step_id": row.step_id, "why": why, **data},
    )


def end_with_task(tx: Tx, task_id: str) -> None:
    """The task has just ended (cancelled, or failed): settle its effects that no dispatcher
    is delivering (`settle_ended`): `due`, `gated` and `open` rows, and `sending` rows with
    no attempt begun. A `sending` row with an attempt begun is left to its dispatcher, whose
    answer is recorded and whose next attempt is refused (docs/design.md, Effects). Called by
    `lifecycle.withdraw_effects` after the task's state moved."""
    unheld = {s.name.lower(): s.value for s in UNHELD}
    for row in tx.all_as(
        EffectRow,
        "unheld_effects_of_task",
        task_id=task_id,
        sending=OutboxState.SENDING.value,
        **unheld,
    ):
        settle_ended(tx, row, "an attempt of it may have been sent")
