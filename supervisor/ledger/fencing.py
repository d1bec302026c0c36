"""The clock domain: fenced leases.

Every grant takes a new token from one strictly increasing counter that survives restarts;
any token but the step's current one is refused as `StaleFence` and recorded. Leases are
judged by the supervisor's clock alone: a runner is told durations (`ttl_s`,
`renew_every_s`), never a deadline.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tether.supervisor.ledger import repositories, runners
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import InvalidRequest, LeaseOver, StaleFence
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.lifecycle import fail_step, requeue
from tether.supervisor.ledger.records import (
    CheckpointRow,
    LeaseTask,
    QueuedStep,
    StartPoint,
    StepOutput,
)
from tether.supervisor.ledger.renewal_memory import WrittenRenewal
from tether.supervisor.ledger.states import AttemptState, StepState, TaskState
from tether.supervisor.ledger.steps import (
    about_step,
    charge,
    end_attempt,
    held_step,
    require_current,
)
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.tx import Tx, TypedReads, dumps, loads
from tether.wire import ReleaseReason
from tether.wire.payloads import VERIFY_KIND
from tether.wire.records import (
    MAX_CAPACITY,
    MAX_KINDS,
    CheckSpec,
    EarlierOutput,
    Lease,
    LeaseRepository,
    Renewal,
    ResumePoint,
)

# Releases that say nothing about the step itself: they never count toward max_attempts.
UNCOUNTED_RELEASES = frozenset(
    {ReleaseReason.OPERATOR, ReleaseReason.SHUTDOWN, ReleaseReason.PREEMPTED}
)


def next_fence(tx: Tx) -> int:
    row = tx.one("next_fence")
    assert row is not None
    return int(row["value"])


def _lease(tx: Tx, step_id: str, attempt: int, runner_id: str, token_id: str | None) -> int:
    """Take the next fence and lease `step_id` to the runner under it as `attempt`, recording
    the attempt; the fence. Where the dialect folds the three writes into one statement
    (`grant_lease`, PostgreSQL: `queries.FOLDS`), that one."""
    cfg = tx.config
    lease_deadline = tx.now + cfg.lease_ttl_s
    accept_deadline = tx.now + cfg.accept_window_s
    if "grant_lease" in tx.sql:
        row = tx.one(
            "grant_lease",
            attempt=attempt,
            runner_id=runner_id,
            lease_deadline=lease_deadline,
            accept_deadline=accept_deadline,
            step_id=step_id,
            token_id=token_id,
            now=tx.now,
        )
        assert row is not None
        return int(row["value"])
    fence = next_fence(tx)
    tx.run(
        "lease_step",
        state=StepState.LEASED.value,
        attempt=attempt,
        fence=fence,
        runner_id=runner_id,
        lease_deadline=lease_deadline,
        accept_deadline=accept_deadline,
        step_id=step_id,
    )
    tx.run(
        "insert_attempt",
        step_id=step_id,
        attempt=attempt,
        fence=fence,
        runner_id=runner_id,
        token_id=token_id,
        state=AttemptState.LEASED.value,
        now=tx.now,
    )
    return fence


def claim(
    tx: Tx,
    runner_id: str,
    pool: str,
    capacity: int,
    *,
    token_id: str | None = None,
    kinds: Collection[str] = ("chat",),
) -> list[Lease]:
    """Grant up to `capacity` leases on queued steps of the `kinds` the runner serves, oldest
    task first, one step per task; a step of another kind waits for a runner that serves it,
    never burning an attempt here. `token_id` is the runner token that claims, recorded on
    each attempt. The runner is recorded in `runners` (its pool, token, kinds, last seen)."""
    tx.request = "claim"
    if not runner_id or len(runner_id) > 200:
        raise InvalidRequest("runner_id must be 1..200 characters")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise InvalidRequest(f"capacity must be 1..{MAX_CAPACITY}")
    if not 1 <= len(kinds) <= MAX_KINDS or not all(0 < len(k) <= 200 for k in kinds):
        raise InvalidRequest(f"kinds must name 1..{MAX_KINDS} step kinds of 1..200 characters")
    runners.seen(tx, pool, runner_id, token_id, kinds)
    if token_id is None:
        # A verify step goes only to a token known to have made no part of its candidate.
        kinds = [k for k in kinds if k != VERIFY_KIND]
        if not kinds:
            return []
    rows = tx.all_as(
        QueuedStep,
        "claim_queued_steps",
        pool=pool,
        kinds=dumps(list(kinds)),
        token_id=token_id,
        capacity=capacity,
    )
    granted: set[str] = set()
    leases = []
    for row in rows:
        # Each row holds its task's columns as the claim read them; a task granted a step
        # already in this claim (a task has one queued step: never, but not assumed) is read
        # again, its state having moved.
        task = (
            row
            if row.task_id not in granted
            else tx.one_as(LeaseTask, "task_for_lease", task_id=row.task_id)
        )
        assert task is not None
        leases.append(_grant(tx, row, task, runner_id, token_id))
        granted.add(row.task_id)
    return leases


def claim_after_results(
    tx: Tx,
    reported: Sequence[tuple[str, int]],
    runner_id: str,
    pool: str,
    want: int,
    *,
    token_id: str | None = None,
    kinds: Collection[str] = ("chat",),
) -> list[Lease]:
    """Eager dispatch (docs/design.md, Runner API): the claim rule, run after the rules of the
    results `reported` (`(step_id, fence)` each) in their batch. A result counts as accepted
    when its step is committed under its fence in the runner's pool (`applied` or
    `replayed`); none accepted grants nothing, and each one not accepted takes one lease off
    `want`, since the runner counted its slot as freed. What is granted follows `claim`'s
    rules (kinds, pool, the tenant's budget, one step per task).

    The check reads the ledger rather than the results' answers, so it holds even if this
    rule ran in a later batch than the results: only a durable commit grants.
    """
    tx.request = "claim"
    if not 0 <= want <= MAX_CAPACITY:
        raise InvalidRequest(f"want must be 0..{MAX_CAPACITY}")
    accepted = sum(
        1
        for step_id, fence in reported
        if tx.one(
            "committed_attempt_in_pool",
            step_id=step_id,
            fence=fence,
            committed=AttemptState.COMMITTED.value,
            pool=pool,
        )
        is not None
    )
    grant = want - (len(reported) - accepted)
    if accepted == 0 or grant <= 0:
        return []
    return claim(tx, runner_id, pool, grant, token_id=token_id, kinds=kinds)


def _grant(
    tx: Tx, step: QueuedStep, task: QueuedStep | LeaseTask, runner_id: str, token_id: str | None
) -> Lease:
    """Lease `step` to the runner under a new fence. `task`: what a lease carries of the step's
    task (`task_for_lease`'s columns, which a claim's rows hold too)."""
    attempt = step.attempt + 1
    fence = _lease(tx, step.id, attempt, runner_id, token_id)
    cfg = tx.config
    task_id = step.task_id
    state = TaskState(task.task_state)
    if state is TaskState.QUEUED:
        transition(tx, task_id, TaskState.RUNNING, current=state)
        state = TaskState.RUNNING
    append_event(
        tx,
        task_id,
        "step_leased",
        state,
        {"step_id": step.id, "attempt": attempt, "fence": fence, "runner_id": runner_id},
    )
    tx.note(
        Decision.GRANTED,
        task_id=task_id,
        step_id=step.id,
        attempt=attempt,
        fence=fence,
        runner_id=runner_id,
        token_id=token_id,
        tenant=task.tenant,
        pool=task.pool,
    )
    # A task's first step has no earlier outputs, and a verifier is handed none: the read is
    # skipped.
    verifying = step.verifies is not None
    earlier = (
        tx.all_as(StepOutput, "earlier_outputs", task_id=task_id, position=step.position)
        if step.position and not verifying
        else []
    )
    return Lease(
        step_id=step.id,
        task_id=task_id,
        name=step.name,
        kind=step.kind,
        attempt=attempt,
        fence=fence,
        payload=loads(step.payload_json),
        payload_hash=step.payload_hash,
        ttl_s=cfg.lease_ttl_s,
        renew_every_s=cfg.renew_every_s,
        outputs=tuple(
            EarlierOutput(step_id=r.id, name=r.name, output=loads(r.output_json)) for r in earlier
        ),
        repository=None if task.repository is None else lease_repository(tx, task, step),
        # Only a replayed attempt can find a checkpoint: the first grant skips the lookup.
        resume=None if attempt == 1 else resume_point(tx, step.id),
    )


def lease_repository(tx: Tx, task: QueuedStep | LeaseTask, step: QueuedStep) -> LeaseRepository:
    """What the approval of `task` (repository-bound) binds, for a lease of `step`: the
    worktree starts at the candidate of the latest earlier step that reported one, whose
    bundle the runner fetches from the artifact store, else at the approved base; a verify
    step's, at the candidate it re-checks."""
    name, base = task.repository, task.approved_base_sha
    assert name is not None, "called for a repository-bound task"
    assert base is not None, "an approved repository-bound task has a base"
    held = repositories.find_repository(tx, task.tenant, name)
    if held is None:  # `repo remove` is refused while a task that has not ended names it
        raise RuntimeError(f"task {step.task_id}'s repository {name} is gone")
    start_sha, start_bundle = base, None
    if step.verifies is not None:  # a verify step starts at the candidate it re-checks
        start_sha, start_bundle = step.verifies, step.bundle
    else:
        start = tx.one_as(
            StartPoint, "lease_start_point", task_id=step.task_id, position=step.position
        )
        if start is not None:
            start_sha, start_bundle = start.candidate_sha, start.bundle
    return LeaseRepository(
        name=name,
        url=held.url,
        base_sha=base,
        start_sha=start_sha,
        start_bundle=start_bundle,
        allowed_paths=tuple(loads(task.allowed_paths_json)),
        checks=tuple(
            CheckSpec(name=c["name"], command=c["command"]) for c in loads(task.checks_json)
        ),
        setup=held.setup,
    )


def resume_point(tx: Tx, step_id: str) -> ResumePoint | None:
    """The step's last accepted checkpoint as a lease carries it, if it has one."""
    row = tx.one_as(CheckpointRow, "step_checkpoint", step_id=step_id)
    if row is None:
        return None
    return ResumePoint(
        turn=row.turn,
        fence=row.fence,
        transcript=row.transcript,
        bundle=row.bundle,
        sha=row.sha,
        usage=loads(row.step_usage_json),
    )


def binding_of_lease(
    s: TypedReads, step_id: str, fence: int, token_id: str | None, pool: str | None
) -> repositories.Binding | None:
    """The binding of the step's task, for a report under `fence` by `token_id` (`held_step`
    first): what the evidence of a report is gathered against, so no bundle but the lease
    holder's is ever imported under the attempt's ref."""
    held_step(s, step_id, fence, token_id, pool)
    return repositories.binding_of_step(s, step_id, pool)


def budget_exhausted(tx: Tx, tenant: str) -> bool:
    """The tenant has a budget and has spent it: the claim rule grants none of its steps."""
    row = tx.one("tenant_budget_spent", tenant=tenant)
    return row is not None


def renew(
    tx: Tx, step_id: str, fence: int, pool: str | None = None, *, token_id: str | None = None
) -> Renewal:
    """Extend a lease of `token_id`'s by one TTL from now; say whether the task was cancelled
    meanwhile, and whether its tenant's budget is spent (the runner then releases the step
    uncounted)."""
    return renew_lease(tx, step_id, fence, pool, token_id=token_id).renewal


def renew_lease(
    tx: Tx, step_id: str, fence: int, pool: str | None = None, *, token_id: str | None = None
) -> WrittenRenewal:
    """`renew`, saying what it wrote: the deadline, for the store's `RenewalMemory`."""
    tx.request = "renew"
    step = held_step(tx, step_id, fence, token_id, pool)
    require_current(tx, step, fence)
    cfg = tx.config
    if step.task_state == TaskState.CANCELLED:
        renewal = Renewal(ttl_s=0.0, renew_every_s=cfg.renew_every_s, cancelled=True)
        deadline = None
    elif step.state != StepState.LEASED:
        over = LeaseOver if step.state == StepState.COMMITTED else StaleFence
        raise over(f"step {step_id} is {step.state}; the lease is over").about(
            task_id=step.task_id, step_id=step_id, fence=fence
        )
    else:
        deadline = tx.now + cfg.lease_ttl_s
        tx.run("extend_lease", lease_deadline=deadline, step_id=step_id)
        renewal = Renewal(
            ttl_s=cfg.lease_ttl_s,
            renew_every_s=cfg.renew_every_s,
            cancelled=False,
            budget_exhausted=budget_exhausted(tx, step.tenant),
        )
    return WrittenRenewal(
        step_id=step_id,
        fence=fence,
        token_id=token_id,
        pool=pool,
        task_id=step.task_id,
        at=tx.now,
        deadline=deadline,
        renewal=renewal,
    )


def release(
    tx: Tx,
    step_id: str,
    fence: int,
    reason: ReleaseReason,
    retryable: bool,
    detail: str,
    pool: str | None = None,
    usage: Mapping[str, int] | None = None,
    *,
    token_id: str | None = None,
) -> None:
    """Hand a lease of `token_id`'s back. Non-retryable fails the task; operator-side,
    shutdown and preempted releases requeue without counting; the rest count toward
    `max_attempts`. A requeued step is leasable at once: no lease deadline or acceptance window
    is left to wait out. The tokens the attempt spent (`usage`) count toward its tenant's
    budget even if the release is refused as stale (never when it is not the caller's
    lease)."""
    tx.request = "release"
    step = held_step(tx, step_id, fence, token_id, pool)
    spent = charge(tx, step, fence, usage or {})
    require_current(tx, step, fence)
    if step.task_state == TaskState.CANCELLED:
        return
    if step.state != StepState.LEASED:
        raise StaleFence(f"step {step_id} is {step.state}; the lease is over").about(
            task_id=step.task_id, step_id=step_id, fence=fence
        )
    end_attempt(tx, step_id, fence, AttemptState.RELEASED, f"{reason}: {detail}"[:500])
    tx.note(
        Decision.RELEASED,
        **about_step(tx, step),
        reason=str(reason),
        retryable=retryable,
        tokens=spent,
    )
    if not retryable:
        fail_step(tx, step, f"step {step.name} failed ({reason}): {detail}"[:500])
        return
    counted = reason not in UNCOUNTED_RELEASES
    requeue(tx, step, counted=counted, why=f"released ({reason})")
