"""A task's lifecycle, the layer between the step primitives (`steps`) and the rules a request
enters by: starting the next step when one commits (`advance`, `start`, `make_due`), ending
the task when its last step commits and its evidence verifies, and failing a step or a task,
which settles its effects in the outbox (`withdraw_effects`)."""

from __future__ import annotations

from typing import Final

from tether.supervisor.ledger import verifier
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.outbox import OutboxState
from tether.supervisor.ledger.outbox_render import render_code, render_request
from tether.supervisor.ledger.outbox_rows import end_with_task
from tether.supervisor.ledger.records import NextStep, StepOfTask, StepWithTask, TaskRow
from tether.supervisor.ledger.states import AttemptState, StepState, TaskState
from tether.supervisor.ledger.steps import about_step, find_step
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.tx import EFFECTS, Tx, dumps, loads
from tether.supervisor.ledger.verification import findings, verify
from tether.wire import content_hash, effect_key
from tether.wire.payloads import DEFAULT_DEADLINE_S
from tether.wire.templates import RenderError

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"make_due", "verify"})


def requeue(tx: Tx, step: StepOfTask, *, counted: bool, why: str) -> None:
    """Put a step back in the queue with the same step id, or fail its task when it has used up
    its attempts. The old fence stops being current here."""
    burned = step.burned + (1 if counted else 0)
    if burned >= tx.config.max_attempts:
        tx.run("set_step_burned", burned=burned, step_id=step.id)
        fail_step(tx, step, f"step {step.name} used {burned} of {tx.config.max_attempts} attempts")
        return
    tx.run("requeue_step", state=StepState.QUEUED.value, burned=burned, step_id=step.id)
    append_event(
        tx,
        step.task_id,
        "step_requeued",
        step.task_state,
        {"step_id": step.id, "attempt": step.attempt, "why": why, "counted": counted},
    )
    tx.note(Decision.REQUEUED, **about_step(tx, step), why=why, counted=counted, burned=burned)
    tx.wake(step.pool)


def fail_step(tx: Tx, step: StepOfTask, reason: str) -> None:
    """Fail the step and its task (`step` a row of `find_step` or the reaper)."""
    tx.run("fail_step", state=StepState.FAILED.value, step_id=step.id)
    transition(tx, step.task_id, TaskState.FAILED, reason=reason)
    tx.note(Decision.FAILED, **about_step(tx, step), reason=reason)


def fail_task(tx: Tx, task: TaskRow, reason: str) -> None:
    """Fail `task` (a row of `tasks`, not ended) with `reason`, ending its live attempts as
    cancel does: a runner holding one learns at its next renew or result that the step is no
    longer its own (`StaleFence`). Its unfinished steps are cancelled, a leased one failed."""
    task_id = task.id
    tx.run(
        "fail_live_attempts_of_task",
        failed=AttemptState.FAILED.value,
        reason=reason[:500],
        now=tx.now,
        leased=AttemptState.LEASED.value,
        task_id=task_id,
    )
    transition(tx, task_id, TaskState.FAILED, reason=reason)
    withdraw_effects(tx, task_id)
    # An effect step being sent or uncertain keeps its state: the dispatcher or an operator
    # records what happened.
    tx.run(
        "end_steps_of_failed_task",
        leased=StepState.LEASED.value,
        failed=StepState.FAILED.value,
        cancelled=StepState.CANCELLED.value,
        task_id=task_id,
        committed=StepState.COMMITTED.value,
        sending=OutboxState.SENDING.value,
        uncertain=OutboxState.UNCERTAIN.value,
    )
    tx.note(Decision.FAILED, task_id=task_id, tenant=task.tenant, pool=task.pool, reason=reason)


def withdraw_effects(tx: Tx, task_id: str) -> None:
    """Settle the effects of a task that has just ended (`outbox_rows.end_with_task`):
    withdrawn when nothing of them can have been sent, else `uncertain` for an operator. Call
    it after the task's state moved and before its other steps are cancelled (which keeps the
    step of an effect being sent or uncertain as it is)."""
    end_with_task(tx, task_id)


def advance(tx: Tx, step: StepWithTask, task_state: TaskState | None = None) -> None:
    """Start the step after `step` (just committed; a row of `find_step`): queue it, or make
    an effect step due (`start`); when every step is committed, verify and end the
    task. Before an effect falls due and before the task ends, a task that names a verifier
    waits for one to re-run its checks at the candidate (`verifier.ask_verifier`).
    `task_state`: the task's state if the rule knows it is still the one it read."""
    task_id, pool = step.task_id, step.pool
    about = {"task_id": task_id, "tenant": step.tenant, "pool": pool}
    pending = tx.one_as(
        NextStep, "first_uncommitted_step", task_id=task_id, committed=StepState.COMMITTED.value
    )
    if pending is not None:
        if pending.state == StepState.WAITING:
            # An effect falls due only once a verifier, if the task names one, agreed.
            effect = pending.kind in tx.config.effect_kinds
            if not (effect and verifier.ask_verifier(tx, step)):
                start(tx, pending.id)
        return
    if verifier.ask_verifier(tx, step):
        return
    transition(tx, task_id, TaskState.VERIFYING, current=task_state)
    failure = verify(tx, task_id)  # reads only
    verifying = TaskState.VERIFYING
    if failure is None:
        transition(tx, task_id, TaskState.SUCCEEDED, current=verifying)
        tx.note(Decision.VERIFIED, **about, state=TaskState.SUCCEEDED.value)
    else:
        transition(tx, task_id, TaskState.FAILED, reason=failure, current=verifying)
        tx.note(Decision.FAILED, **about, reason=failure)


def start(tx: Tx, step_id: str) -> None:
    """Make a waiting step ready: an effect step becomes due (`make_due`); any other is queued
    for the runners of its task's pool."""
    step = find_step(tx, step_id, None)
    if step.kind in tx.config.effect_kinds:
        make_due(tx, step)
        return
    tx.run("queue_ready_step", step_id=step_id)
    tx.wake(step.pool)


def make_due(tx: Tx, step: StepWithTask) -> None:
    """Write the effect step's outbox row with its rendered request, in the transaction that
    makes it due (`step`: a row of `find_step`).

    A repository-bound task's evidence must verify so far (`verification.findings` over the
    steps committed before it): otherwise the task fails with the first finding and the
    effect is never due. A request that cannot be rendered (a path missing from an earlier
    step's output, no candidate for a push) fails the step and the task; nothing is written.
    """
    task = tx.one_as(TaskRow, "task_by_id", task_id=step.task_id)
    assert task is not None
    if TaskState(task.state) is TaskState.QUEUED:
        transition(tx, task.id, TaskState.RUNNING)
        step = find_step(tx, step.id, None)
    if task.repository:
        found = findings(tx, task)
        if found:
            fail_task(tx, task, found[0].reason)
            return
    payload = loads(step.payload_json)
    payload = payload if isinstance(payload, dict) else {}
    try:
        request = render_request(tx, step, task, payload)
    except (RenderError, ValueError) as exc:
        fail_step(tx, step, f"{render_code(exc)}: {exc}")
        return
    keyed = payload.get("keyed", True) is not False
    deadline_s = float(payload.get("deadline_s") or DEFAULT_DEADLINE_S)
    state = OutboxState.DUE if keyed else OutboxState.GATED
    digest = content_hash(request)
    tx.run(
        "insert_due_effect",
        step_id=step.id,
        task_id=step.task_id,
        kind=step.kind,
        effect_key=effect_key(step.id, step.payload_hash),
        keyed=int(keyed),
        request_json=dumps(request),
        digest=digest,
        state=state.value,
        deadline_s=deadline_s,
        deadline_at=tx.now + deadline_s if keyed else None,
        now=tx.now,
    )
    tx.run("mark_effect_step_due", step_id=step.id)
    append_event(
        tx,
        step.task_id,
        "effect_due",
        TaskState.RUNNING,
        {
            "step_id": step.id,
            "kind": step.kind,
            "keyed": keyed,
            "digest": digest,
            "state": state.value,
        },
    )
    tx.note(
        Decision.EFFECT_DUE,
        task_id=step.task_id,
        step_id=step.id,
        kind=step.kind,
        keyed=keyed,
        state=state.value,
        tenant=step.tenant,
        pool=step.pool,
    )
    if keyed:
        tx.wake(EFFECTS)
