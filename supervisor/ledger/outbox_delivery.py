"""The dispatcher's side of the outbox (docs/design.md, Effects): taking effects to deliver,
recording each delivery attempt before it is sent and the receiver's answer after, giving up
at the deadline, and handing an effect back."""

from __future__ import annotations

import math
from typing import Any

from tether.supervisor.ledger import outbox_rows
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import EffectNotHeld, GateMismatch
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.lifecycle import advance, fail_step
from tether.supervisor.ledger.outbox import (
    Answer,
    Delivered,
    OutboxState,
    Outgoing,
    Undeliverable,
)
from tether.supervisor.ledger.records import DeliveryAnswer, DeliveryRow, EffectRow
from tether.supervisor.ledger.states import TERMINAL, TaskState
from tether.supervisor.ledger.steps import find_step
from tether.supervisor.ledger.tx import EFFECTS, Tx, TypedReads, dumps, loads


def _held(tx: Tx, effect_id: str, holder: str) -> EffectRow:
    """The row, if `holder` holds it; `EffectNotHeld` otherwise."""
    row = outbox_rows.effect_row(tx, effect_id)
    if row.state != OutboxState.SENDING or row.holder != holder:
        raise EffectNotHeld(
            f"effect {effect_id} is {row.state}, not held by this dispatcher"
        ).about(task_id=row.task_id, step_id=effect_id)
    return row


def _to_outgoing(row: EffectRow) -> Outgoing:
    return Outgoing(
        effect_id=row.step_id,
        task_id=row.task_id,
        tenant=row.tenant,
        kind=row.kind,
        effect_key=row.effect_key,
        keyed=bool(row.keyed),
        request=loads(row.request_json),
        digest=row.digest,
        deadline_at=math.inf if row.deadline_at is None else float(row.deadline_at),
    )


def take(tx: Tx, holder: str, limit: int) -> list[Outgoing]:
    """Hand up to `limit` effects to `holder`, for `effect_hold_s`.

    First the `sending` rows whose hold lapsed (their dispatcher vanished): a keyed one is
    taken again and will be sent again under the same key; an unkeyed one that may have been
    sent becomes `uncertain` (never re-sent by itself), one with no attempt begun goes back to
    `open`; a row of a task that ended meanwhile is settled (`outbox_rows.settle_ended`). Then
    `due` (keyed) and `open` (unkeyed) rows of live tasks, oldest first.
    """
    tx.request = "take"
    taken: list[EffectRow] = []
    hold = tx.now + tx.config.effect_hold_s
    for row in tx.all_as(
        EffectRow, "lapsed_effects", sending=OutboxState.SENDING.value, now=tx.now
    ):
        if outbox_rows.task_ended(row):
            outbox_rows.settle_ended(tx, row, "its dispatcher vanished")
        elif row.keyed:
            if len(taken) < limit:
                taken.append(row)
        elif outbox_rows.maybe_sent(outbox_rows.unsettled_attempts(tx, row, opening_only=True)):
            outbox_rows.make_uncertain(tx, row, "its dispatcher vanished after starting to send")
        else:
            outbox_rows.set_state(tx, row.step_id, OutboxState.OPEN)
    room = max(0, limit - len(taken))
    if room:
        taken += tx.all_as(
            EffectRow,
            "ready_effects",
            due=OutboxState.DUE.value,
            open=OutboxState.OPEN.value,
            now=tx.now,
            room=room,
            **{s.name.lower(): s.value for s in TERMINAL},
        )
    for row in taken:
        tx.run(
            "hold_effect",
            state=OutboxState.SENDING.value,
            holder=holder,
            held_until=hold,
            step_id=row.step_id,
        )
    return [_to_outgoing(row) for row in taken]


def begin_attempt(tx: Tx, effect_id: str, holder: str, digest: str) -> int:
    """Record that attempt N is about to be sent (before anything leaves); return N.

    Refused, with nothing written, when `holder` does not hold the effect (`EffectNotHeld`;
    a held row whose task ended is settled at once, `outbox_rows.settle_ended`), when `digest`
    is not the rendered request's or, unkeyed, not the one its gate was opened for
    (`GateMismatch`), and when an unkeyed effect's gate opening was already used by an attempt
    that may have sent.
    """
    tx.request = "begin_attempt"
    row = _held(tx, effect_id, holder)
    if outbox_rows.task_ended(row):
        tx.after_refusal.append(
            lambda t: outbox_rows.settle_ended(t, outbox_rows.effect_row(t, effect_id), "cancelled")
        )
        raise EffectNotHeld(f"task {row.task_id} is {row.task_state}").about(
            task_id=row.task_id, step_id=effect_id
        )
    if digest != row.digest:
        raise GateMismatch(
            f"digest {digest} is not effect {effect_id}'s request digest {row.digest}"
        ).about(task_id=row.task_id, step_id=effect_id)
    opening = 0
    if not row.keyed:
        opening = row.openings
        if digest != row.gate_digest:
            raise GateMismatch(
                f"the gate of effect {effect_id} was opened for {row.gate_digest}"
            ).about(task_id=row.task_id, step_id=effect_id)
        if outbox_rows.maybe_sent(outbox_rows.unsettled_attempts(tx, row, opening_only=True)):
            raise EffectNotHeld(
                f"effect {effect_id} is unkeyed and its gate opening was used"
            ).about(task_id=row.task_id, step_id=effect_id)
    if row.deadline_at is not None and tx.now > row.deadline_at:
        raise EffectNotHeld(f"effect {effect_id}'s delivery deadline has passed").about(
            task_id=row.task_id, step_id=effect_id
        )
    last = tx.one("last_delivery_attempt", step_id=effect_id)
    attempt = int((last["n"] if last else None) or 0) + 1
    tx.run(
        "insert_delivery",
        step_id=effect_id,
        attempt=attempt,
        opening=opening,
        holder=holder,
        now=tx.now,
    )
    if row.kind == "git.push":
        # Before the push leaves: a head read that reports this candidate is the task's own
        # push (`operator.observe_head`), however soon the forge's webhook arrives.
        candidate = loads(row.request_json).get("candidate")
        tx.run("record_pushed_sha", pushed_sha=candidate, task_id=row.task_id)
    tx.run("extend_effect_hold", held_until=tx.now + tx.config.effect_hold_s, step_id=effect_id)
    return attempt


def record_attempt(tx: Tx, effect_id: str, attempt: int, holder: str, answer: Answer) -> None:
    """Record the receiver's answer to attempt `attempt`, then move the effect on: delivered
    (step committed, task advances; a task cancelled meanwhile stays CANCELLED with its
    effect delivered), refused (step and task fail with the answer's code), or unanswered
    (keyed, or unkeyed and certainly not sent: still held, to be retried; unkeyed and maybe
    sent: `uncertain`).

    An answer that arrives after the effect became `uncertain` (its hold lapsed, or its task
    ended, while this holder was still sending) is taken as if in time when the attempt is
    this holder's and still unanswered: delivered or refused settles the effect; unanswered
    leaves it uncertain for an operator."""
    tx.request = "record_attempt"
    late = outbox_rows.effect_row(tx, effect_id)
    row = late if _answers_uncertain(tx, late, attempt, holder) else _held(tx, effect_id, holder)
    delivery = tx.one_as(DeliveryRow, "delivery_attempt", step_id=effect_id, attempt=attempt)
    if delivery is None or delivery.answer is not None or delivery.holder != holder:
        raise EffectNotHeld(
            f"effect {effect_id} has no attempt {attempt} waiting for its answer"
        ).about(task_id=row.task_id, step_id=effect_id)
    kind, sent = _answer_columns(answer)
    tx.run(
        "answer_delivery",
        now=tx.now,
        answer=kind,
        sent=sent,
        status=answer.status,
        detail=answer.detail[:DETAIL_MAX],
        error=answer.code if isinstance(answer, Undeliverable) else None,
        step_id=effect_id,
        attempt=attempt,
    )
    if isinstance(answer, Delivered):
        observation = {
            "status": answer.status,
            "detail": answer.detail[:DETAIL_MAX],
            "replayed": answer.replayed,
            "attempt": attempt,
        }
        deliver(tx, row, observation)
    elif isinstance(answer, Undeliverable):
        outbox_rows.set_state(tx, effect_id, OutboxState.FAILED)
        fail_effect(tx, row, f"{answer.code}: {answer.detail[:DETAIL_MAX]}")
    elif row.state == OutboxState.UNCERTAIN:
        return  # still only an operator can say
    elif row.keyed or not answer.sent:
        tx.run("extend_effect_hold", held_until=tx.now + tx.config.effect_hold_s, step_id=effect_id)
    else:
        outbox_rows.make_uncertain(tx, row, "an unkeyed send went unanswered")


def _answers_uncertain(s: TypedReads, row: EffectRow, attempt: int, holder: str) -> bool:
    """Whether `holder`'s answer to `attempt` may settle `row`, which became uncertain while
    that attempt was in flight: the attempt is the holder's and still unanswered."""
    if row.state != OutboxState.UNCERTAIN:
        return False
    delivery = s.one_as(
        DeliveryAnswer,
        "unsettled_delivery_attempt",
        step_id=row.step_id,
        attempt=attempt,
        settled_attempts=row.settled_attempts,
    )
    return delivery is not None and delivery.holder == holder and delivery.answer is None


DETAIL_MAX = 2048


def _answer_columns(answer: Answer) -> tuple[str, int]:
    if isinstance(answer, Delivered):
        return "delivered", 1
    if isinstance(answer, Undeliverable):
        return "refused", 1
    return "unanswered", int(answer.sent)


def deliver(tx: Tx, row: EffectRow, observation: dict[str, Any]) -> None:
    """The effect happened: its one effect row, the step committed with the observation as its
    output, and the task advanced (unless it has ended: the delivery is still recorded)."""
    effect_id = row.step_id
    outbox_rows.set_state(tx, effect_id, OutboxState.DELIVERED)
    step = find_step(tx, effect_id, None)
    tx.run(
        "insert_delivered_effect",
        effect_key=row.effect_key,
        step_id=effect_id,
        task_id=row.task_id,
        fence=EFFECT_FENCE,
        payload_hash=step.payload_hash,
        output_json=dumps(observation),
        usage_json=NO_USAGE,
        now=tx.now,
    )
    tx.run("commit_delivered_step", output_json=dumps(observation), now=tx.now, step_id=effect_id)
    append_event(
        tx,
        row.task_id,
        "step_committed",
        step.task_state,
        {
            "step_id": effect_id,
            "effect_key": row.effect_key,
            "delivered": True,
            "replayed": bool(observation.get("replayed")),
        },
    )
    tx.note(
        Decision.COMMITTED,
        task_id=row.task_id,
        step_id=effect_id,
        kind=row.kind,
        effect_key=row.effect_key,
        tenant=row.tenant,
        pool=step.pool,
        replayed=bool(observation.get("replayed")),
    )
    if TaskState(step.task_state) not in TERMINAL:
        advance(tx, step)


# An effect the supervisor delivered was committed under no lease: its effect row's fence;
# and it used no model: its usage.
EFFECT_FENCE = 0


NO_USAGE = dumps({})


def fail_effect(tx: Tx, row: EffectRow, reason: str) -> None:
    """Fail the effect step, and its task unless the task has ended already."""
    step = find_step(tx, row.step_id, None)
    if TaskState(step.task_state) in TERMINAL:
        tx.run("fail_effect_step", step_id=row.step_id)
        return
    fail_step(tx, step, reason)


def give_up(tx: Tx, effect_id: str, holder: str, reason: str) -> None:
    """The delivery deadline passed with only unanswered attempts. The effect becomes
    `uncertain` when one of them may have reached the receiver (keyed too: a receiver that
    timed out or answered 503 may still have applied it; an unkeyed one counts its current
    gate opening), for an operator to say whether it happened; it fails
    (`delivery_deadline`) only when none can have."""
    tx.request = "give_up"
    row = _held(tx, effect_id, holder)
    if outbox_rows.maybe_sent(outbox_rows.unsettled_attempts(tx, row, opening_only=not row.keyed)):
        outbox_rows.make_uncertain(tx, row, f"delivery deadline passed: {reason}")
        return
    outbox_rows.set_state(tx, effect_id, OutboxState.FAILED)
    fail_effect(tx, row, f"delivery_deadline: {reason}"[:DETAIL_MAX])


def release(tx: Tx, effect_id: str, holder: str) -> None:
    """The dispatcher stops without an answer (shutdown). A keyed effect goes back to `due`;
    an unkeyed one becomes `uncertain` if an attempt began and was never answered, else goes
    back to `open`. A row whose task ended is settled (`outbox_rows.settle_ended`)."""
    tx.request = "release_effect"
    row = _held(tx, effect_id, holder)
    tx.run("release_unanswered_deliveries", now=tx.now, step_id=effect_id)
    if outbox_rows.task_ended(row):
        outbox_rows.settle_ended(tx, row, "released")
    elif row.keyed:
        outbox_rows.set_state(tx, effect_id, OutboxState.DUE)
        tx.wake(EFFECTS)
    elif outbox_rows.maybe_sent(outbox_rows.unsettled_attempts(tx, row, opening_only=True)):
        outbox_rows.make_uncertain(tx, row, "released after starting to send")
    else:
        outbox_rows.set_state(tx, effect_id, OutboxState.OPEN)
        tx.wake(EFFECTS)
