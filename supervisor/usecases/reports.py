"""A runner's reports of its steps, one (`report_one`) or a batch (`report_many`), each with
the leases its `want` asks for granted in the same group-commit batch (`grants.EagerGrant`).

A report of a repository-bound task's step reaches the ledger with the evidence the
supervisor gathered about it first (`evidence_for`, `tether.supervisor.repos.evidence`): the
ledger judges, this layer only observes.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from tether.supervisor import tracing
from tether.supervisor.ledger import LedgerError, Principal, Report
from tether.supervisor.ledger.verification import Evidence
from tether.supervisor.repos.evidence import RepositoryUnavailable, gather
from tether.supervisor.usecases.grants import EagerGrant
from tether.supervisor.usecases.parts import Parts
from tether.wire.records import ItemAnswer, ResultAnswer, ResultsAnswer, WantLeases

# Reports of one batch whose evidence is gathered at the same time.
EVIDENCE_AT_ONCE = 4

# The item a batch answers for a report the single route would have refused, by step id.
Refusal = Callable[[str, LedgerError | RepositoryUnavailable], ItemAnswer]


async def evidence_for(parts: Parts, report: Report, pool: str, token_id: str) -> Evidence | None:
    """What the supervisor observes about `report` by the runner token `token_id` when its
    step's task names a repository (None when it names none): git and the artifact store,
    before the ledger's rule. A report on a lease the token does not hold is `not_found` here,
    before any bundle is imported (`fencing.binding_of_lease`).

    Whether the report names a candidate cannot decide it: a repository-bound step's report
    needs evidence even without one (its head is read). So the step's binding is read, except
    for a step this process granted unbound (`UnboundSteps`): a chat step's result pays no
    read it did not pay before.
    """
    if parts.unbound.take(report.step_id):
        return None
    return await _read_evidence(parts, report, pool, token_id)


async def _read_evidence(parts: Parts, report: Report, pool: str, token_id: str) -> Evidence | None:
    """`evidence_for` a step not known to be unbound: its binding read, and the evidence
    gathered if it has one."""
    ledger = parts.ledger
    binding = await ledger.binding_of_lease(report.step_id, report.fence, token_id, pool)
    if binding is None:
        return None
    return await gather(
        parts.mirrors,
        parts.artifacts,
        ledger,
        binding,
        report,
        step_id=report.step_id,
        fence=report.fence,
        pool=binding.pool,
    )


async def report_one(
    parts: Parts,
    who: Principal,
    report: Report,
    want: WantLeases | None,
    *,
    draining: Callable[[], bool],
    traceparent: str | None,
) -> ResultAnswer:
    """The outcome of `report` by the runner `who`, and the leases `want` asks for. A refusal
    (of the evidence or of the ledger) is raised and grants nothing; `draining` says whether
    the supervisor is on its way down (then nothing more is granted)."""
    evidence = await evidence_for(parts, report, who.scope, who.token_id)
    eager = EagerGrant(parts, want, who.scope, who.token_id, draining=draining())
    with tracing.commit(report.step_id, report.fence, header=traceparent) as span:
        queued = parts.ledger.queue_reports([(report, evidence)], who.scope, token_id=who.token_id)
        eager.queue([(report.step_id, report.fence)])  # after it, in its batch
        (outcome,) = await queued
        if isinstance(outcome, LedgerError):
            raise outcome
        span.set(outcome=str(outcome))
    return ResultAnswer(outcome=outcome, leases=await eager.sent())


async def report_many(
    parts: Parts,
    who: Principal,
    reports: tuple[Report, ...],
    want: WantLeases | None,
    *,
    draining: Callable[[], bool],
    traceparent: str | None,
    refusal: Refusal,
) -> ResultsAnswer:
    """`report_one` for many steps at once: each is the same ledger rule and gets its own
    reply, in order: an outcome, or the item `refusal` makes of what refused it."""
    ledger = parts.ledger
    answers: list[ItemAnswer | None] = [None] * len(reports)
    evidence: list[Evidence | None] = [None] * len(reports)

    # Each bound report runs a few git processes; a full batch must not start them all at once.
    gatherers = anyio.CapacityLimiter(EVIDENCE_AT_ONCE)

    async def observe(n: int, report: Report) -> None:
        try:
            async with gatherers:
                evidence[n] = await _read_evidence(parts, report, who.scope, who.token_id)
        except (LedgerError, RepositoryUnavailable) as exc:
            answers[n] = refusal(report.step_id, exc)

    # Evidence first, every report's at once, but for the steps this process granted unbound
    # (`evidence_for`), which need none and get no task.
    unknown = [(n, r) for n, r in enumerate(reports) if not parts.unbound.take(r.step_id)]
    if unknown:
        async with anyio.create_task_group() as tg:
            for n, report in unknown:
                tg.start_soon(observe, n, report)
    # Then the reports that got theirs, queued together so that they reach the ledger's
    # writer together: one transaction. The eager grant's claim is queued right after them,
    # into the same batch; a report refused before the ledger (its evidence) still counts as
    # not accepted.
    sole = len(reports) == 1
    going = [n for n in range(len(reports)) if answers[n] is None]
    eager = EagerGrant(parts, want, who.scope, who.token_id, draining=draining())
    spans = [
        tracing.commit(reports[n].step_id, reports[n].fence, header=traceparent, sole=sole)
        for n in going
    ]
    opened = [manager.__enter__() for manager in spans]
    try:
        queued = ledger.queue_reports(
            [(reports[n], evidence[n]) for n in going], who.scope, token_id=who.token_id
        )
        eager.queue([(r.step_id, r.fence) for r in reports])  # after them, in their batch
        outcomes = await queued
    except BaseException as exc:
        for manager in reversed(spans):
            manager.__exit__(type(exc), exc, exc.__traceback__)
        raise
    # Each span ends as its `with` block would have (innermost first), a refused report's
    # with its error.
    for n, manager, span, outcome in reversed(
        list(zip(going, spans, opened, outcomes, strict=True))
    ):
        step_id = reports[n].step_id
        if isinstance(outcome, LedgerError):
            manager.__exit__(type(outcome), outcome, outcome.__traceback__)
            answers[n] = refusal(step_id, outcome)
        else:
            span.set(outcome=str(outcome))
            manager.__exit__(None, None, None)
            answers[n] = ItemAnswer(step_id=step_id, outcome=outcome)
    done = tuple(a for a in answers if a is not None)
    assert len(done) == len(reports)
    return ResultsAnswer(results=done, leases=await eager.sent())
