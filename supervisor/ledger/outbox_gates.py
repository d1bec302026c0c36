"""The operator's side of the outbox (docs/design.md, Effects): opening the gate of an unkeyed
effect for one digest, and saying whether an uncertain effect happened."""

from __future__ import annotations

from tether.supervisor.ledger import outbox_rows
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import (
    EffectNotGated,
    GateMismatch,
    InvalidRequest,
    NotFound,
    TerminalState,
)
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.outbox import OutboxState
from tether.supervisor.ledger.outbox_delivery import deliver, fail_effect
from tether.supervisor.ledger.records import EffectRow, NamedStep
from tether.supervisor.ledger.tx import EFFECTS, Tx


def _effect_of(tx: Tx, tenant: str, task_id: str, step_name: str) -> EffectRow:
    """The outbox row of `tenant`'s task's step named `step_name`; `NotFound` for another
    tenant's task, an unknown step, and a step that is not (yet) an effect with a row."""
    task = tx.one("tenant_task_id", task_id=task_id, tenant=tenant)
    if task is None:
        raise NotFound(f"no task {task_id}")
    step = tx.one_as(NamedStep, "first_step_named", task_id=task_id, step_name=step_name)
    if step is None:
        raise NotFound(f"task {task_id} has no step {step_name!r}")
    if step.kind not in tx.config.effect_kinds:
        raise InvalidRequest(f"step {step_name!r} is a {step.kind} step, not an effect")
    row = tx.one_as(EffectRow, "effect_row", step_id=step.id)
    if row is None:
        raise EffectNotGated(f"step {step_name!r} of task {task_id} is not due yet").about(
            task_id=task_id, step_id=step.id
        )
    return row


def open_gate(tx: Tx, tenant: str, task_id: str, step_name: str, digest: str, by: str) -> None:
    """Open the gate of an unkeyed effect for exactly `digest`, the digest of its rendered
    request as shown to the operator; one opening allows one send. Refused (nothing changes)
    when the effect is not `gated` (`EffectNotGated`) or `digest` is not its request's
    (`GateMismatch`). The delivery deadline starts at the opening."""
    tx.request = "gate"
    row = _effect_of(tx, tenant, task_id, step_name)
    if outbox_rows.task_ended(row):
        raise TerminalState(f"task {task_id} is {row.task_state}").about(task_id=task_id)
    if row.state != OutboxState.GATED:
        raise EffectNotGated(
            f"step {step_name!r} is {row.state}: only a gated effect's gate can be opened"
        ).about(task_id=task_id, step_id=row.step_id)
    if digest != row.digest:
        raise GateMismatch(
            f"digest {digest} is not the digest of step {step_name!r}'s request"
            f" ({row.digest}); look at the request again"
        ).about(task_id=task_id, step_id=row.step_id)
    tx.run(
        "open_effect_gate",
        state=OutboxState.OPEN.value,
        openings=row.openings + 1,
        gate_digest=digest,
        deadline_at=tx.now + row.deadline_s,
        now=tx.now,
        step_id=row.step_id,
    )
    _decided(tx, row, "open", by, digest)
    append_event(
        tx,
        task_id,
        "gate_opened",
        row.task_state,
        {"step_id": row.step_id, "digest": digest, "by": by},
    )
    tx.note(
        Decision.GATE_OPENED,
        task_id=task_id,
        step_id=row.step_id,
        by=by,
        digest=digest,
        tenant=tenant,
    )
    tx.wake(EFFECTS)


def resolve(tx: Tx, tenant: str, task_id: str, step_name: str, happened: bool, by: str) -> None:
    """An operator's word on an `uncertain` effect; it settles every attempt made so far.
    `happened`: it is recorded as delivered (step committed, the task advances unless it
    ended). Not: for a task that ended, the effect is withdrawn; a keyed effect (uncertain
    only once its deadline passed) fails `delivery_deadline`; an unkeyed one goes back behind
    its gate, once; a second `no` for the same effect is refused (say yes, or cancel the
    task)."""
    tx.request = "happened"
    row = _effect_of(tx, tenant, task_id, step_name)
    if row.state != OutboxState.UNCERTAIN:
        raise EffectNotGated(
            f"step {step_name!r} is {row.state}: only an uncertain effect is resolved"
        ).about(task_id=task_id, step_id=row.step_id)
    tx.run("settle_effect_attempts", step_id=row.step_id)
    if happened:
        _decided(tx, row, "happened", by, row.digest)
        deliver(
            tx,
            row,
            {
                "status": None,
                "detail": f"an operator ({by}) said it happened",
                "replayed": False,
                "by": by,
            },
        )
        return
    if row.said_no:
        raise EffectNotGated(
            f"step {step_name!r} was already re-opened once after a `no`: say whether it"
            " happened, or cancel the task"
        ).about(task_id=task_id, step_id=row.step_id)
    _decided(tx, row, "not_happened", by, row.digest)
    said = f"an operator ({by}) said it did not happen"
    if outbox_rows.task_ended(row):
        tx.run("mark_effect_said_no", step_id=row.step_id)
        outbox_rows.withdraw(tx, row, said, by=by)
        return
    if row.keyed:
        tx.run("mark_effect_said_no", step_id=row.step_id)
        outbox_rows.set_state(tx, row.step_id, OutboxState.FAILED)
        fail_effect(tx, row, f"delivery_deadline: {said}")
        return
    tx.run("regate_effect", state=OutboxState.GATED.value, step_id=row.step_id)
    append_event(tx, task_id, "effect_regated", row.task_state, {"step_id": row.step_id, "by": by})


def _decided(tx: Tx, row: EffectRow, action: str, by: str, digest: str | None) -> None:
    tx.run(
        "insert_effect_decision",
        step_id=row.step_id,
        action=action,
        digest=digest,
        by=by,
        now=tx.now,
    )
