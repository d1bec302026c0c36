"""What operators do to a task after creating it: approve, cancel, report a repository's head,
set and read a tenant's token budget. Every rule here checks ownership: another tenant's task is
`NotFound`, never a hint that it exists."""

from __future__ import annotations

from tether.supervisor.ledger import identity, names
from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.errors import (
    InvalidRequest,
    InvalidTransition,
    NotFound,
    StaleBase,
)
from tether.supervisor.ledger.journal import append_event
from tether.supervisor.ledger.lifecycle import fail_task, start, withdraw_effects
from tether.supervisor.ledger.outbox import OutboxState
from tether.supervisor.ledger.prefixes import resolve_plan_hash
from tether.supervisor.ledger.records import Spending, TaskRow, TenantSpending, from_row
from tether.supervisor.ledger.states import TERMINAL, AttemptState, StepState, TaskState
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.tx import ALL_POOLS, Statements, Tx, dumps, loads
from tether.supervisor.ledger.verification import review_verdict, stale_base
from tether.wire.records import Budget


def owned_task(tx: Tx, tenant: str, task_id: str) -> TaskRow:
    row = tx.one_as(TaskRow, "owned_task", task_id=task_id, tenant=tenant)
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row


def approve(
    tx: Tx,
    tenant: str,
    task_id: str,
    plan_hash: str,
    base_sha: str | None,
    observed_head: str | None = None,
) -> None:
    """Bind the plan hash and base SHA, then queue the task's first step.

    A repository-bound task needs `observed_head`, the repository's head as the adapter just
    read it: a base that is not the head is refused (`StaleBase`) and the task is unchanged.
    The head observed is recorded as the repository's, failing any other approved task bound
    to another base (`observe_head`). A repeated approval with the same binding succeeds
    again, changing nothing, so a client may retry one whose reply it lost.
    """
    tx.request = "approve"
    task = owned_task(tx, tenant, task_id)
    plan_hash = resolve_plan_hash(task_id, task.plan_hash, plan_hash)
    repository = task.repository
    if repository and not base_sha:
        raise InvalidRequest(f"task {task_id} names repository {repository}: give base_sha")
    if base_sha and not repository:
        raise InvalidRequest(f"task {task_id} names no repository: a base_sha binds nothing")
    if task.approved_at is not None and task.approved_base_sha == base_sha:
        return
    if repository:
        if not observed_head:
            raise InvalidRequest(
                f"task {task_id} names repository {repository}: its approval needs the head"
                " the supervisor read from it"
            )
        if base_sha != observed_head:
            raise StaleBase(
                f"base {base_sha} is not the head of repository {repository}, which is at"
                f" {observed_head}: approve that head, or plan against it"
            )
    transition(tx, task_id, TaskState.APPROVED, data={"plan_hash": plan_hash, "base_sha": base_sha})
    tx.run("set_approved_base", approved_base_sha=base_sha, task_id=task_id)
    if repository and observed_head:
        observe_head(tx, tenant, repository, observed_head, approving=task_id)
    transition(tx, task_id, TaskState.QUEUED)
    tx.note(
        Decision.APPROVED,
        task_id=task_id,
        tenant=tenant,
        pool=task.pool,
        plan_hash=plan_hash,
        base_sha=base_sha,
    )
    start(tx, identity.step_id_for(task_id, 0))


def cancel(tx: Tx, tenant: str, task_id: str, reason: str) -> None:
    """Cancel a task that has not ended. A step in flight learns of it at its next renew. Its
    effects nothing was sent for are withdrawn at once, and one whose attempt may have reached
    its receiver becomes uncertain (an operator says whether it happened); one being delivered
    is left to its dispatcher, which records what it learns (the task stays CANCELLED;
    docs/design.md, Effects)."""
    tx.request = "cancel"
    task = owned_task(tx, tenant, task_id)
    transition(tx, task_id, TaskState.CANCELLED, reason=reason or "cancelled")
    tx.run(
        "cancel_live_attempts_of_task",
        cancelled=AttemptState.CANCELLED.value,
        now=tx.now,
        leased=AttemptState.LEASED.value,
        task_id=task_id,
    )
    withdraw_effects(tx, task_id)
    tx.run(
        "cancel_steps_of_task",
        cancelled=StepState.CANCELLED.value,
        task_id=task_id,
        committed=StepState.COMMITTED.value,
        failed=StepState.FAILED.value,
        sending=OutboxState.SENDING.value,
        uncertain=OutboxState.UNCERTAIN.value,
    )
    tx.note(
        Decision.CANCELLED,
        task_id=task_id,
        tenant=tenant,
        pool=task.pool,
        from_state=task.state,
    )


def set_repository_head(tx: Tx, tenant: str, repository: str, sha: str) -> None:
    """A forge's push webhook: the repository's head is now `sha` (`observe_head`)."""
    tx.request = "head"
    if not repository.strip() or not sha.strip():
        raise InvalidRequest("repository and sha must be non-empty")
    observe_head(tx, tenant, repository, sha)


def observe_head(
    tx: Tx, tenant: str, repository: str, sha: str, *, approving: str | None = None
) -> None:
    """Record `sha` as the head of `tenant`'s `repository`. Every task of it that has not
    ended (but the one `approving`, whose base it is) gets a `base_changed` event when the
    head changes; every approved one whose base is not `sha` fails at once with `stale_base`
    (docs/design.md, Verification), so no later step is granted on a moved base -- except the
    task whose own `git.push` put `sha` there (`pushed_sha`): only effects follow a push."""
    held = tx.one("repository_head_sha", tenant=tenant, repository=repository)
    tx.run("set_repository_head", tenant=tenant, repository=repository, head_sha=sha, now=tx.now)
    for row in tx.all_as(TaskRow, "live_tasks_of_repository", tenant=tenant, repository=repository):
        if row.id != approving and (held is None or held["head_sha"] != sha):
            append_event(tx, row.id, "base_changed", row.state, {"head_sha": sha})
        if row.approved_at is not None and sha not in (
            row.approved_base_sha,
            row.pushed_sha,
        ):
            fail_task(tx, row, stale_base(row.approved_base_sha, sha, repository).reason)


def set_budget(tx: Tx, tenant: str, tokens: int | None) -> None:
    """A tenant that has spent its budget gets no lease; its tasks wait, they do not fail."""
    names.check_tenant_name(tenant, tx)
    if tokens is not None and tokens < 0:
        raise InvalidRequest("a token budget cannot be negative")
    tx.run("set_tenant_budget", tenant=tenant, tokens=tokens)
    if tokens is None or tokens > 0:
        tx.wake(ALL_POOLS)


def set_verify_pool(tx: Tx, tenant: str, pool: str | None) -> None:
    """A tenant's default verifier pool (None: none): each later task of it that has checks
    and names no `verify` of its own has them re-run by a runner of `pool`."""
    names.check_tenant_name(tenant, tx)
    if pool is not None:
        names.check_pool_name(pool, tx)
    tx.run("set_tenant_verify_pool", tenant=tenant, pool=pool)


def budget_record(tenant: str, spent: int, budget: int | None) -> Budget:
    """`left` is never below 0: a step in flight may finish past the budget."""
    left = None if budget is None else max(0, budget - spent)
    return Budget(tenant=tenant, spent=spent, budget=budget, left=left)


def budget_of(s: Statements, tenant: str) -> Budget:
    """The tenant's tokens spent (by every attempt, committed or not), budget and what is left.
    `NotFound` for a tenant the ledger has never heard of (no task, budget or operator
    token), so a mistyped name is not shown as a tenant with nothing spent."""
    found = s.one("tenant_spending", tenant=tenant)
    if found is not None:
        row = from_row(Spending, found)
        return budget_record(tenant, row.tokens_used, row.token_budget)
    if s.one("tenant_has_operator_token", tenant=tenant):
        return budget_record(tenant, 0, None)
    raise NotFound(f"no tenant {tenant!r} in this ledger (no task, budget or operator token)")


def all_budgets(s: Statements) -> list[Budget]:
    """Every tenant the ledger holds a row for, by name (the `tether_budget_tokens` gauge)."""
    return [
        budget_record(r.name, r.tokens_used, r.token_budget)
        for r in (from_row(TenantSpending, row) for row in s.all("all_tenant_spending"))
    ]


REVIEW_DECISIONS = frozenset({"accept", "reject"})


def record_review(tx: Tx, tenant: str, task_id: str, decision: str, note: str) -> None:
    """Record the reviewer's decision on an ended task, once (docs/design.md, Review record).

    Acceptance is refused unless `review_verdict` finds the result acceptable; rejection
    always stands. The same decision again is taken as done; another one is refused.
    """
    tx.request = "review"
    if decision not in REVIEW_DECISIONS:
        raise InvalidRequest("decision must be 'accept' or 'reject'")
    task = owned_task(tx, tenant, task_id)
    if TaskState(task.state) not in TERMINAL:
        raise InvalidRequest(f"task {task_id} is {task.state}: review it once it has ended")
    if task.reviewer_decision is not None:
        previous = loads(task.reviewer_decision)["decision"]
        if previous == decision:
            return
        raise InvalidTransition(f"task {task_id} was already reviewed: {previous}").about(
            task_id=task_id
        )
    if decision == "accept":
        verdict = review_verdict(tx, task)
        if not verdict.acceptable:
            raise InvalidRequest("cannot accept: " + "; ".join(verdict.reasons))
    record = {"decision": decision, "note": note[:2000], "at": tx.now}
    tx.run("set_reviewer_decision", reviewer_decision=dumps(record), task_id=task_id)
    append_event(tx, task_id, "reviewed", task.state, {"decision": decision})
