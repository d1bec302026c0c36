"""What every rule about a step builds on: reading the step a request names, whose lease it
is, whether a fence is current or its lease lapsed, ending an attempt, and charging the tokens
an attempt spent to its tenant (docs/design.md, Fencing and leases, Budgets)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tether.supervisor.ledger.errors import NotFound, StaleFence
from tether.supervisor.ledger.records import HeldStep, StepColumns, StepOfTask, StepWithTask
from tether.supervisor.ledger.states import AttemptState, StepState
from tether.supervisor.ledger.tx import Tx, TypedReads, dumps, loads

# The names a planted bug of the schedule explorer may swap while a run lasts
# (`tether.sim.plants`): the rules here call each through this module's globals.
SEAMS: Final = frozenset({"lapsed"})

# A tenant's running total saturates here rather than overflow SQLite's 64-bit integer.
TOKENS_CEILING = 2**62


def find_step(s: TypedReads, step_id: str, pool: str | None) -> StepWithTask:
    """The step with its task's state, tenant and pool; `NotFound` outside the runner's pool."""
    step = s.one_as(StepWithTask, "step_with_task", step_id=step_id)
    if step is None or (pool is not None and step.pool != pool):
        raise NotFound(f"no step {step_id}")
    return step


def held_step(
    s: TypedReads, step_id: str, fence: int, token_id: str | None, pool: str | None = None
) -> HeldStep:
    """The step (as `find_step` reads it), if an attempt of it was granted under `fence` to
    the token `token_id` (None: a lease claimed without a token, in process); else
    `NotFound`, the answer an unknown step gets.

    A lease belongs to the token that claimed it: every rule about a lease (renew, release,
    result, checkpoint) and every read a report's evidence needs asks this first, so another
    runner token of the same pool, knowing or guessing the fence, learns nothing and changes
    nothing. Whether the fence is still current is `require_current`'s question, asked after.
    """
    step = s.one_as(HeldStep, "held_step_with_task", fence=fence, step_id=step_id)
    if (
        step is None
        or (pool is not None and step.pool != pool)
        or step.held_fence is None
        or step.held_token_id != token_id
    ):
        raise NotFound(f"no step {step_id}")
    return step


def require_current(tx: Tx, step: StepColumns, fence: int) -> None:
    """`StaleFence` unless `fence` is the current token of `step` (a row already read)."""
    if step.fence != fence:
        raise StaleFence(f"fence {fence} is not step {step.id}'s current token").about(
            task_id=step.task_id, step_id=step.id, fence=fence
        )
    if step.state == StepState.LEASED and lapsed(step, tx.now):
        raise StaleFence(f"the lease on step {step.id} under fence {fence} has lapsed").about(
            task_id=step.task_id, step_id=step.id, fence=fence
        )


def lapsed(step: StepColumns, now: float) -> bool:
    """Past its deadline, or never acknowledged within the acceptance window.

    A runner acknowledges a lease by its first renew (half a renew interval after the claim
    reply reached it) or by its result, whichever comes first; a lease never acknowledged
    within `accept_window_s` (its claim reply was lost on the wire) is reaped early instead of
    stranding its step for a whole TTL.
    """
    accept, deadline = step.accept_deadline, step.lease_deadline
    assert deadline is not None, "a leased step has a lease deadline"
    return bool(deadline <= now or (accept is not None and accept <= now))


def tokens_spent(usage: Mapping[str, int]) -> int:
    """The tokens a usage record counts: `total_tokens`, else prompt plus completion."""
    if "total_tokens" in usage:
        return max(0, int(usage["total_tokens"]))
    return max(0, int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)))


def charge(tx: Tx, step: HeldStep, fence: int, usage: Mapping[str, int]) -> int:
    """Charge the tenant for what the attempt under `fence` spent, as its running total
    `usage` tells, and return how many tokens were added: the increase over what was counted
    for that attempt before (0 for a repeat or a smaller total).

    Called before the fence is checked: should the rule be refused (a fenced-out result, a
    late release or checkpoint), the same count runs again after the rollback
    (`Tx.after_refusal`), so tokens an attempt spent are counted whether or not it commits
    (docs/design.md, Budgets). Checkpoints, results and releases all charge this way, so a
    checkpoint of 100 tokens and a result of 150 charge 150 in all.
    """
    tx.after_refusal.append(lambda later: _count(later, step, fence, usage))
    return _count(tx, step, fence, usage)


def _count(tx: Tx, step: HeldStep, fence: int, usage: Mapping[str, int]) -> int:
    """Raise the total counted for the attempt of `step` under `fence` to `usage`, and the
    tenant's spent total by the difference, when `usage` counts more than was counted.
    `step` is `held_step`'s row for `fence`: it holds what was counted when the rule began,
    which is what there is again after the rule is rolled back (`charge`)."""
    if not usage or step.held_fence != fence:
        return 0
    before = tokens_spent(loads(step.held_usage_json) or {})
    spent = tokens_spent(usage) - before
    if spent <= 0:
        return 0
    usage_json = dumps(dict(usage))
    if "count_usage" in tx.sql:  # the two writes in one statement (`queries.FOLDS`)
        tx.run(
            "count_usage",
            usage_json=usage_json,
            fence=fence,
            step_id=step.id,
            spent=spent,
            ceiling=TOKENS_CEILING,
            tenant=step.tenant,
        )
        return spent
    tx.run("set_attempt_usage", usage_json=usage_json, fence=fence, step_id=step.id)
    tx.run("charge_tenant_tokens", spent=spent, ceiling=TOKENS_CEILING, tenant=step.tenant)
    return spent


def about_step(tx: Tx, step: StepOfTask) -> dict[str, object]:
    """The fields of a decision's log line about `step` (a row of `find_step` or the reaper):
    its task, tenant and pool, and the attempt it was last leased under with its token (read
    with `find_step`'s row; looked up for the reaper's)."""
    if isinstance(step, StepWithTask):
        token_id = step.lease_token_id
    else:
        attempt = tx.one("attempt_token", fence=step.fence)
        token_id = None if attempt is None else attempt["token_id"]
    return {
        "task_id": step.task_id,
        "step_id": step.id,
        "attempt": step.attempt,
        "fence": step.fence,
        "runner_id": step.runner_id,
        "token_id": token_id,
        "tenant": step.tenant,
        "pool": step.pool,
    }


def end_attempt(tx: Tx, step_id: str, fence: int, state: AttemptState, reason: str) -> None:
    """Close a live attempt. An attempt that already ended keeps how it ended."""
    tx.run(
        "end_live_attempt",
        state=state.value,
        reason=reason,
        now=tx.now,
        step_id=step_id,
        fence=fence,
    )
