"""Read models over the ledger: the task view with what the task waits for, listings, the
pools' queues and runners, the event journal and the review record. Pure reads; they run on a
read-only connection and never block writes. They report what the rules decide and decide
nothing themselves; `now` is the supervisor's clock, passed in by the store."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any, Final, TypeVar

from tether.clocks import iso
from tether.supervisor.ledger import operator, view_rows
from tether.supervisor.ledger.errors import InvalidRequest, NotFound
from tether.supervisor.ledger.outbox import OutboxState
from tether.supervisor.ledger.records import (
    AttemptRow,
    CheckpointHeld,
    CheckRunRow,
    DeliveryRow,
    EffectDecisionRow,
    EventRow,
    LastSeen,
    OperatorWord,
    OutboxColumns,
    PoolQueue,
    RejectionRow,
    RunnerLeases,
    RunnerSeenRow,
    Spending,
    StateCount,
    StepCount,
    StepInLine,
    StepInView,
    StepName,
    StepOutputOnly,
    TaskCounted,
    TaskRow,
    from_row,
)
from tether.supervisor.ledger.states import TERMINAL, AttemptState, StepState, TaskState
from tether.supervisor.ledger.tx import Statements, loads
from tether.supervisor.ledger.verification import (
    Problem,
    check_runs_at,
    checks_standing,
    findings,
    problems_of,
    review_verdict,
)
from tether.wire.answers import (
    CleanupProof,
    EffectReview,
    Expectation,
    Observation,
    ReviewerDecision,
    ReviewRecord,
    Verdict,
    WorkspaceRemoval,
)
from tether.wire.payloads import VERIFY_KIND
from tether.wire.records import (
    Budget,
    EffectView,
    Event,
    GateView,
    PoolStatus,
    ProblemView,
    ResolvedView,
    RunnerSeen,
    TaskDetail,
    TaskPage,
    WaitingFor,
)

PAGE_MAX = 200
T = TypeVar("T")

# A runner counts as seen recently (status, /metrics) if it claimed within this: an idle runner
# claims at least every `claim_wait_max_s` (30 s by default), so two minutes is four missed
# claims. A runner whose every slot runs a long step does not claim either, so it drops out of
# this count until a slot frees; `task show` still says when it was last seen.
RUNNER_RECENT_S: Final = 120.0
# A runner is online while it holds a lease (a busy runner renews instead of claiming, and a
# lease nobody renews is expired by the reaper) or claimed within this: an idle runner claims
# at least every `claim_wait_max_s` (30 s by default), so this is one claim missed, with slack.
RUNNER_ONLINE_S: Final = 45.0

SKIPPED: Final = "skipped"
_ENDED_UNDONE = frozenset({TaskState.FAILED, TaskState.CANCELLED})
_UNRUN = frozenset({StepState.WAITING, StepState.QUEUED, StepState.CANCELLED})


def shown_state(task_state: str, unrun: bool, state: str) -> str:
    """A step's state as views show it: the steps a failed or cancelled task never ran
    (`unrun`: no attempt) are `skipped`. The ledger leaves them `waiting` (failed) or marks
    them `cancelled` (cancelled); either way they wait for nothing and must not count as
    waiting or queued work."""
    if unrun and task_state in _ENDED_UNDONE and state in _UNRUN:
        return SKIPPED
    return state


def _task_row(s: Statements, tenant: str | None, task_id: str) -> TaskRow:
    if tenant is None:
        row = s.one("task_by_id", task_id=task_id)
    else:
        row = s.one("owned_task", task_id=task_id, tenant=tenant)
    if row is None:
        raise NotFound(f"no task {task_id}")
    return from_row(TaskRow, row)


def waiting_for(s: Statements, task: TaskRow, now: float) -> WaitingFor | None:
    """What keeps the task's next step from running, or None when a step runs, the task is
    verifying, or it has ended. `reason` is one of:

    - `approval`: the plan is not approved yet;
    - `budget`: the tenant has spent its token budget (`spent` >= `budget`), so the claim rule
      (`fencing.claim`) grants none of its steps;
    - `gate`: an unkeyed effect (`step`) waits for an operator to open its gate for the
      request's `digest`; `uncertain`: an effect may have reached its receiver (an unkeyed
      one whose send went unanswered, or a keyed one still unanswered at its deadline) and
      only an operator can say whether it happened (docs/design.md, Effects);
    - `runner`: a step is queued for a runner of `pool` serving `kind`. `last_seen_s` is how
      long ago such a runner last claimed (null: never); `pool_last_seen_s` the same for any
      runner of the pool, so a pool whose runners serve other kinds can be told from an empty
      one. A runner seen a moment ago means the pool is busy with earlier work.

    Checked in the order that releases a task: approval, then a gate or an uncertain effect,
    then the budget, then a runner.
    """
    state = TaskState(task.state)
    if state is TaskState.PLANNED:
        return WaitingFor(reason="approval")
    if state not in (TaskState.QUEUED, TaskState.RUNNING):
        return None
    word_row = s.one(
        "operator_word_awaited",
        task_id=task.id,
        gated=OutboxState.GATED.value,
        uncertain=OutboxState.UNCERTAIN.value,
    )
    if word_row is not None:
        word = from_row(OperatorWord, word_row)
        reason = "gate" if word.state == OutboxState.GATED else "uncertain"
        return WaitingFor(reason=reason, step=word.name, digest=word.digest)
    step_row = s.one(
        "next_step_in_line",
        task_id=task.id,
        queued=StepState.QUEUED.value,
        leased=StepState.LEASED.value,
    )
    if step_row is None:
        return None
    step = from_row(StepInLine, step_row)
    if step.state == StepState.LEASED:
        return None
    spending_row = s.one("tenant_spending", tenant=task.tenant)
    spending = None if spending_row is None else from_row(Spending, spending_row)
    if (
        spending is not None
        and spending.token_budget is not None
        and spending.tokens_used >= spending.token_budget
    ):
        return WaitingFor(
            reason="budget",
            tenant=task.tenant,
            spent=spending.tokens_used,
            budget=spending.token_budget,
        )
    # A verify step waits for a runner of the task's verifier pool.
    pool = task.verify_pool if step.kind == VERIFY_KIND else task.pool
    assert pool is not None, "a verify step is added only for a task with a verifier pool"
    seen_row = s.one("runners_last_seen", kind=step.kind, pool=pool)
    assert seen_row is not None  # an aggregate without GROUP BY: always one row
    seen = from_row(LastSeen, seen_row)
    return WaitingFor(
        reason="runner",
        pool=pool,
        kind=step.kind,
        last_seen_s=_ago(now, seen.this_kind),
        pool_last_seen_s=_ago(now, seen.any_kind),
    )


def tenant_budget(s: Statements, tenant: str) -> Budget | None:
    """The tenant's `Budget` (`operator.budget_of`) as a task view shows it; None for a
    tenant the ledger holds no row for."""
    try:
        return operator.budget_of(s, tenant)
    except NotFound:
        return None


def _ago(now: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, now - at), 1)


def _by_step(pairs: Iterable[tuple[str, T]]) -> dict[str, tuple[T, ...]]:
    """Values grouped by the step id beside each, in order."""
    grouped: dict[str, list[T]] = {}
    for step_id, value in pairs:
        grouped.setdefault(step_id, []).append(value)
    return {step_id: tuple(values) for step_id, values in grouped.items()}


def _problems(found: Iterable[Problem]) -> tuple[ProblemView, ...]:
    return tuple(ProblemView(code=p.code.value, detail=p.detail) for p in found)


def task_view(s: Statements, task_id: str, tenant: str | None = None, *, now: float) -> TaskDetail:
    """The task with its steps, attempts, fences, last sequence number and what it waits for.
    Attempts' times are ISO 8601 (UTC); a failed or cancelled task's unrun steps are
    `skipped`. Each step shows its candidate, bundle, check runs, the problems the
    supervisor's evidence found against its result and its last checkpoint (turn, fence);
    `findings` are what verification holds against the task (`verification.findings`)."""
    row = _task_row(s, tenant, task_id)
    steps = [from_row(StepInView, r) for r in s.all("steps_of_task_view", task_id=task_id)]
    attempts = _by_step(
        (a.step_id, view_rows.attempt(a))
        for a in (from_row(AttemptRow, r) for r in s.all("attempts_of_task", task_id=task_id))
    )
    checks = _by_step(
        (c.step_id, view_rows.check_run(c))
        for c in (from_row(CheckRunRow, r) for r in s.all("check_runs_of_task", task_id=task_id))
    )
    held = {
        k.step_id: view_rows.checkpoint(k)
        for k in (
            from_row(CheckpointHeld, r) for r in s.all("checkpoints_of_task", task_id=task_id)
        )
    }
    effects = effect_views(s, task_id)
    return view_rows.task_detail(
        row,
        plan=view_rows.plan(row, steps),
        waiting_for=waiting_for(s, row, now),
        budget=tenant_budget(s, row.tenant),
        steps=tuple(
            view_rows.step_detail(
                step,
                state=shown_state(step.task_state, step.attempt == 0, step.state),
                checks=checks.get(step.id, ()),
                problems=_problems(problems_of(step.evidence_json)),
                checkpoint=held.get(step.id),
                attempts=attempts.get(step.id, ()),
                effect=effects.get(step.id),
            )
            for step in steps
        ),
        findings=_problems(findings(s, row)),
        checks_standing=checks_standing(s, row),
        rejections=tuple(
            view_rows.rejection(from_row(RejectionRow, r))
            for r in s.all("rejections_of_task", task_id=task_id)
        ),
    )


def effect_views(s: Statements, task_id: str) -> dict[str, EffectView]:
    """The task's effects by step id: the request as rendered (credentials appear only as
    their `{{ credential.<name> }}` placeholders, never their values), its digest and key,
    every delivery attempt, the last gate opening and the operator's word on an uncertain
    effect."""
    deliveries = _by_step(
        (d.step_id, view_rows.delivery(d))
        for d in (from_row(DeliveryRow, r) for r in s.all("deliveries_of_task", task_id=task_id))
    )
    gates: dict[str, GateView] = {}
    resolved: dict[str, ResolvedView] = {}
    for r in s.all("effect_decisions_of_task", task_id=task_id):
        a = from_row(EffectDecisionRow, r)
        if a.action == "open":
            gates[a.step_id] = view_rows.gate_opening(a)
        else:
            resolved[a.step_id] = view_rows.resolution(a)
    return {
        o.step_id: view_rows.effect(
            o, deliveries.get(o.step_id, ()), gates.get(o.step_id), resolved.get(o.step_id)
        )
        for o in (from_row(OutboxColumns, r) for r in s.all("outbox_of_task", task_id=task_id))
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSearch:
    """What a listing is narrowed to besides its state: `text` is a task id's prefix (any
    case) or a whole idempotency key; `repository` and `pool` are whole names."""

    text: str | None = None
    repository: str | None = None
    pool: str | None = None

    def __bool__(self) -> bool:
        return any((self.text, self.repository, self.pool))


def list_tasks(
    s: Statements,
    tenant: str,
    state: str | None,
    cursor: int | None,
    limit: int,
    *,
    now: float,
    search: TaskSearch | None = None,
) -> TaskPage:
    """The tenant's tasks, newest first, each with its steps committed and in all and what it
    waits for; `next` is the cursor for the following page."""
    if state is not None and state not in TaskState.__members__:
        raise InvalidRequest(f"state must be one of {', '.join(TaskState.__members__)}")
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidRequest(f"limit must be 1..{PAGE_MAX}")
    committed = StepState.COMMITTED.value
    if search:
        text, id_prefix = search.text, None if search.text is None else search.text.lower()
        rows = s.all(
            "tenant_tasks_search_page",
            committed=committed,
            tenant=tenant,
            cursor=cursor,
            state=state,
            id_prefix=id_prefix,
            text=text,
            repository=search.repository,
            pool=search.pool,
            limit=limit + 1,
        )
    elif state is None:
        rows = s.all(
            "tenant_tasks_page", committed=committed, tenant=tenant, cursor=cursor, limit=limit + 1
        )
    else:
        rows = s.all(
            "tenant_tasks_in_state_page",
            committed=committed,
            tenant=tenant,
            state=state,
            cursor=cursor,
            limit=limit + 1,
        )
    more = len(rows) > limit
    tasks = [from_row(TaskCounted, r) for r in rows[:limit]]
    return TaskPage(
        tasks=tuple(view_rows.task_summary(t, waiting_for(s, t, now)) for t in tasks),
        next=str(tasks[-1].created_order) if more else None,
    )


def events_after(s: Statements, task_id: str, after: int, limit: int = 500) -> list[Event]:
    return [
        view_rows.event(from_row(EventRow, r))
        for r in s.all("events_after", task_id=task_id, after=after, limit=limit)
    ]


def review(s: Statements, task_id: str, tenant: str | None = None) -> ReviewRecord:
    """The review record (docs/design.md, Review record). `expectation`: declared before the
    run; `observation`: recorded by the ledger or observed by the supervisor and its runners.
    `verdict` is `verification.review_verdict`."""
    task = _task_row(s, tenant, task_id)
    state = TaskState(task.state)
    verdict = review_verdict(s, task)
    runs = check_runs_at(s, task_id, verdict.candidate_sha)
    expected: tuple[str, ...] = tuple(loads(task.expected_checks_json))
    observed_checks = {
        name: view_rows.observed_check(runs[name]) if name in runs else None for name in expected
    }
    attempts = [
        from_row(StateCount, r) for r in s.all("attempts_by_state_of_task", task_id=task_id)
    ]
    counted = s.one("rejection_count_of_task", task_id=task_id)
    rejected = 0 if counted is None else counted["n"]

    effects = effect_views(s, task_id)
    names = {
        n.id: n.name
        for n in (from_row(StepName, r) for r in s.all("step_names_of_task", task_id=task_id))
    }
    questions: list[str] = [p.reason for p in findings(s, task)]
    questions += [
        f"effect {names[step_id]!r} is uncertain: an operator must say whether it happened"
        for step_id, effect in effects.items()
        if effect.state == OutboxState.UNCERTAIN
    ]
    if rejected:
        questions.append(f"{rejected} rejected attempt(s) recorded; see the task's rejections")
    if state not in TERMINAL:
        questions.append(f"task is still {state}")

    return ReviewRecord(
        task_id=task_id,
        owner=Expectation(value=task.owner),
        repository=Expectation(value=task.repository),
        base_commit=Expectation(value=view_rows.base_sha(task)),
        repository_head=Observation(value=verdict.head_sha),
        candidate_sha=Observation(value=verdict.candidate_sha),
        requirement_revision=Expectation(value=task.requirement_revision),
        allowed_paths=Expectation(value=tuple(loads(task.allowed_paths_json))),
        start_time=Observation(value=iso(task.started_at)),
        stop_time=Observation(value=iso(task.finished_at)),
        expected_checks=Expectation(value=expected),
        observed_checks=Observation(value=observed_checks),
        # Who vouches for them: `attested by runner <token>` unless a verifier re-ran them.
        checks=Observation(value=checks_standing(s, task)),
        verify_pool=Expectation(value=task.verify_pool),
        observed_terminal_state=Observation(value=state.value if state in TERMINAL else None),
        reviewer_decision=Observation(value=_decision(loads(task.reviewer_decision))),
        cleanup_proof=Observation(
            value=CleanupProof(
                live_leases=verdict.live_leases,
                attempts_by_state={a.state: a.n for a in attempts},
                removed=removal_records(s, task_id),
            )
        ),
        effects=Observation(
            value=tuple(
                EffectReview(
                    step=names[step_id],
                    kind=e.kind,
                    keyed=e.keyed,
                    state=e.state,
                    digest=e.digest,
                    key=e.key,
                    deliveries=e.deliveries,
                    gate=e.gate,
                    resolved=e.resolved,
                )
                for step_id, e in sorted(effects.items(), key=lambda item: _position(item[0]))
            )
        ),
        unresolved_questions=Observation(value=tuple(questions)),
        verdict=Verdict(acceptable=verdict.acceptable, reasons=verdict.reasons),
    )


def _decision(recorded: Any) -> ReviewerDecision | None:
    """The reviewer's decision as `operator.record_review` stored it, its time as ISO 8601."""
    if recorded is None:
        return None
    return ReviewerDecision(
        decision=recorded["decision"], note=recorded["note"], at=iso(recorded["at"])
    )


def _position(step_id: str) -> int:
    return int(step_id.rsplit(".", 1)[1])


def removal_records(s: Statements, task_id: str) -> tuple[WorkspaceRemoval, ...]:
    """The runners' records of removing their workspaces, from the committed outputs that hold
    one (an `agent` step's `cleanup`: path, bytes and files removed, gone), by step."""
    rows = s.all("step_outputs_in_state", task_id=task_id, state=StepState.COMMITTED.value)
    outputs = (from_row(StepOutputOnly, r) for r in rows)
    return tuple(r for r in map(view_rows.workspace_removal, outputs) if r is not None)


def queue_depth(s: Statements) -> dict[str, int]:
    """Steps by the state views show (`shown_state`), by state."""
    depth: Counter[str] = Counter()
    for c in (from_row(StepCount, r) for r in s.all("step_counts_by_state")):
        depth[shown_state(c.task_state, bool(c.unrun), c.state)] += c.n
    return dict(sorted(depth.items()))


def pool_status(s: Statements, now: float, also: Iterable[str] = ()) -> list[PoolStatus]:
    """Per pool, by name: steps queued and in flight in live tasks, how long the oldest queued
    step has waited, and the runners that claimed there within `RUNNER_RECENT_S`, most recent
    first. Every pool with work or a recent runner is listed, and each of `also`."""
    rows = s.all(
        "pool_queues",
        queued=StepState.QUEUED.value,
        leased=StepState.LEASED.value,
        task_queued=TaskState.QUEUED.value,
        task_running=TaskState.RUNNING.value,
    )
    queues = {q.pool: q for q in (from_row(PoolQueue, r) for r in rows)}
    online = {(r.pool, r.runner_id) for r in runners(s, now) if r.online}
    seen: dict[str, list[RunnerSeen]] = {}
    for row in s.all("runners_seen_since", since=now - RUNNER_RECENT_S):
        r = from_row(RunnerSeenRow, row)
        seen.setdefault(r.pool, []).append(
            RunnerSeen(
                runner_id=r.runner_id,
                kinds=tuple(loads(r.kinds_json)),
                last_seen_s=_ago(now, r.last_seen) or 0.0,
                online=(r.pool, r.runner_id) in online,
            )
        )
    pools = sorted(set(queues) | set(seen) | set(also))
    return [
        PoolStatus(
            pool=pool,
            queued=int(queues[pool].queued) if pool in queues else 0,
            in_flight=int(queues[pool].in_flight) if pool in queues else 0,
            oldest_queued_s=_ago(now, queues[pool].oldest) if pool in queues else None,
            runners=tuple(seen.get(pool, ())),
        )
        for pool in pools
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerRow:
    """A runner as the runners page shows it: where it claims, what it serves, the leases it
    holds now, when it last claimed and under which token; `online` as `runner_online`
    says."""

    pool: str
    runner_id: str
    kinds: tuple[str, ...]
    in_flight: int
    first_seen: float
    last_seen: float
    last_seen_s: float
    token_name: str | None
    online: bool


def runner_online(now: float, last_seen: float, in_flight: int) -> bool:
    """Whether a runner is online: it holds a lease, or claimed within `RUNNER_ONLINE_S`."""
    return in_flight > 0 or now - last_seen <= RUNNER_ONLINE_S


def runners(s: Statements, now: float) -> list[RunnerRow]:
    """Every runner that ever claimed, by pool, the most recently seen first."""
    rows = s.all("runners_with_leases", leased=AttemptState.LEASED.value)
    return [
        RunnerRow(
            pool=r.pool,
            runner_id=r.runner_id,
            kinds=tuple(loads(r.kinds_json)),
            in_flight=int(r.in_flight),
            first_seen=r.first_seen,
            last_seen=r.last_seen,
            last_seen_s=_ago(now, r.last_seen) or 0.0,
            token_name=r.token_name,
            online=runner_online(now, r.last_seen, int(r.in_flight)),
        )
        for r in (from_row(RunnerLeases, row) for row in rows)
    ]
