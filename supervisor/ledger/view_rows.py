"""The rows of the views' queries (`queries`) as the records the views return: one constructor
per record, and the one place a view names a row's columns. Times become ISO 8601 (UTC) and
JSON columns their values here; what the values mean is the views' business (`views`)."""

from __future__ import annotations

from tether.clocks import iso
from tether.supervisor.ledger.records import (
    AttemptRow,
    CheckpointHeld,
    CheckRunRow,
    DeliveryRow,
    EffectDecisionRow,
    EventRow,
    OutboxColumns,
    RejectionRow,
    StepInView,
    StepOutputOnly,
    TaskCounted,
    TaskRow,
)
from tether.supervisor.ledger.tx import loads
from tether.wire.answers import ObservedCheck, WorkspaceRemoval
from tether.wire.records import (
    AttemptView,
    Budget,
    CheckpointView,
    CheckRunView,
    CheckSpec,
    DeliveryView,
    EffectView,
    Event,
    GateView,
    PlanStepView,
    PlanView,
    ProblemView,
    Rejection,
    ResolvedView,
    StepDetail,
    TaskDetail,
    TaskSummary,
    WaitingFor,
)


def base_sha(task: TaskRow) -> str | None:
    """The base a row of `tasks` binds: the approved one, else the one it was submitted with."""
    approved: str | None = task.approved_base_sha
    return approved or task.declared_base_sha


def task_summary(task: TaskCounted, waiting_for: WaitingFor | None) -> TaskSummary:
    """A row of a tenant's page of tasks (`tenant_tasks_page` and its kin)."""
    return TaskSummary(
        id=task.id,
        tenant=task.tenant,
        idempotency_key=task.idempotency_key,
        state=task.state,
        reason=task.reason,
        plan_hash=task.plan_hash,
        base_sha=base_sha(task),
        repository=task.repository,
        pool=task.pool,
        seq=task.last_seq,
        created_at=iso(task.created_at),
        steps_committed=task.steps_committed,
        steps_total=task.steps_total,
        waiting_for=waiting_for,
    )


def task_detail(
    task: TaskRow,
    *,
    plan: PlanView,
    waiting_for: WaitingFor | None,
    budget: Budget | None,
    steps: tuple[StepDetail, ...],
    findings: tuple[ProblemView, ...],
    checks_standing: str | None,
    rejections: tuple[Rejection, ...],
) -> TaskDetail:
    """A row of `tasks` with what the task view read beside it."""
    return TaskDetail(
        id=task.id,
        tenant=task.tenant,
        idempotency_key=task.idempotency_key,
        state=task.state,
        reason=task.reason,
        plan_hash=task.plan_hash,
        base_sha=base_sha(task),
        repository=task.repository,
        pool=task.pool,
        seq=task.last_seq,
        created_at=iso(task.created_at),
        plan=plan,
        waiting_for=waiting_for,
        budget=budget,
        steps=steps,
        findings=findings,
        verify_pool=task.verify_pool,
        checks_standing=checks_standing,
        rejections=rejections,
    )


def plan(task: TaskRow, steps: list[StepInView]) -> PlanView:
    """A row of `tasks` and its steps' rows (`steps_of_task_view`) as the plan submitted."""
    return PlanView(
        hash=task.plan_hash,
        steps=tuple(
            PlanStepView(
                name=step.name,
                kind=step.kind,
                payload_hash=step.payload_hash,
                payload=loads(step.payload_json),
            )
            for step in steps
        ),
        allowed_paths=tuple(loads(task.allowed_paths_json)),
        checks=tuple(
            CheckSpec(name=c["name"], command=c["command"]) for c in loads(task.checks_json)
        ),
    )


def step_detail(
    step: StepInView,
    *,
    state: str,
    checks: tuple[CheckRunView, ...],
    problems: tuple[ProblemView, ...],
    checkpoint: CheckpointView | None,
    attempts: tuple[AttemptView, ...],
    effect: EffectView | None,
) -> StepDetail:
    """A row of `steps_of_task_view`, in the `state` views show, with what was read beside it."""
    return StepDetail(
        id=step.id,
        name=step.name,
        kind=step.kind,
        state=state,
        payload_hash=step.payload_hash,
        effect_key=step.effect_key,
        fence=step.fence,
        output=loads(step.output_json),
        candidate_sha=step.candidate_sha,
        bundle=step.bundle,
        checks=checks,
        problems=problems,
        checkpoint=checkpoint,
        attempts=attempts,
        effect=effect,
    )


def attempt(row: AttemptRow) -> AttemptView:
    """A row of `attempts_of_task`."""
    return AttemptView(
        attempt=row.attempt,
        fence=row.fence,
        runner_id=row.runner_id,
        token_id=row.token_id,
        state=row.state,
        reason=row.reason,
        granted_at=iso(row.granted_at),
        ended_at=iso(row.ended_at),
        usage=loads(row.usage_json),
    )


def check_run(row: CheckRunRow) -> CheckRunView:
    """A row of `check_runs_of_task`."""
    return CheckRunView(
        name=row.name, log=row.log_digest, exit_code=row.exit_code, duration_s=row.duration_s
    )


def observed_check(row: CheckRunRow) -> ObservedCheck:
    """A row of `check_runs_at_candidate`, as the review record shows it."""
    return ObservedCheck(log=row.log_digest, exit_code=row.exit_code)


def checkpoint(row: CheckpointHeld) -> CheckpointView:
    """A row of `checkpoints_of_task`."""
    return CheckpointView(turn=row.turn, fence=row.fence)


def rejection(row: RejectionRow) -> Rejection:
    """A row of `rejections_of_task`."""
    return Rejection(step_id=row.step_id, fence=row.fence, code=row.code, detail=row.detail)


def delivery(row: DeliveryRow) -> DeliveryView:
    """A row of `deliveries_of_task`."""
    return DeliveryView(
        attempt=row.attempt,
        started_at=iso(row.started_at),
        ended_at=iso(row.ended_at),
        answer=row.answer,
        sent=None if row.sent is None else bool(row.sent),
        status=row.status,
        detail=row.detail,
        error=row.error,
        opening=row.opening,
    )


def gate_opening(row: EffectDecisionRow) -> GateView:
    """A row of `effect_decisions_of_task` whose action is `open`."""
    return GateView(opened_by=row.by, opened_at=iso(row.at), digest=row.digest)


def resolution(row: EffectDecisionRow) -> ResolvedView:
    """A row of `effect_decisions_of_task` whose action is `happened` or `not_happened`."""
    return ResolvedView(by=row.by, at=iso(row.at), happened=row.action == "happened")


def effect(
    row: OutboxColumns,
    deliveries: tuple[DeliveryView, ...],
    gate: GateView | None,
    resolved: ResolvedView | None,
) -> EffectView:
    """A row of `outbox_of_task` with its deliveries and the operators' decisions on it."""
    return EffectView(
        kind=row.kind,
        keyed=bool(row.keyed),
        state=row.state,
        request=loads(row.request_json),
        digest=row.digest,
        key=row.effect_key,
        deadline_at=iso(row.deadline_at),
        openings=row.openings,
        deliveries=deliveries,
        gate=gate,
        resolved=resolved,
    )


def workspace_removal(row: StepOutputOnly) -> WorkspaceRemoval | None:
    """A row of `step_outputs_in_state` whose output holds a `cleanup` (an `agent` step's
    record of removing its workspace); None for any other output."""
    output = loads(row.output_json)
    cleanup = output.get("cleanup") if isinstance(output, dict) else None
    if not isinstance(cleanup, dict):
        return None
    return WorkspaceRemoval(
        step_id=row.id,
        path=cleanup.get("path"),
        bytes_removed=cleanup.get("bytes_removed"),
        files_removed=cleanup.get("files_removed"),
        gone=cleanup.get("gone"),
    )


def event(row: EventRow) -> Event:
    """A row of `events_after`."""
    return Event(
        seq=row.seq,
        task_id=row.task_id,
        kind=row.kind,
        state=row.state,
        data=loads(row.data_json),
        at=iso(row.at),
    )
