"""Runner routes: who am I, claim, renew (one lease or many), release, result (with the next
leases, when asked), checkpoint, log lines. A runner token acts for its pool only; a step of
another pool is `not_found`.

A report of a repository-bound task's step reaches the ledger with the evidence the
supervisor gathered about it first (`tether.supervisor.repos.evidence`): the ledger judges, the
route only observes. A claim reads the head of each repository it granted a step of, so no
step runs on a base that moved since the last report (`on_current_heads`).
"""

from __future__ import annotations

import anyio
import anyio.abc
import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.git import redact
from tether.supervisor import tracing
from tether.supervisor.api.auth import require
from tether.supervisor.api.bindings import UnboundSteps
from tether.supervisor.api.errors import ApiError, ledger_error_code, record_response
from tether.supervisor.api.longpoll import LongPolls, unless_disconnected
from tether.supervisor.api.requests import read
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import Lease, Ledger, LedgerError, Report, Role
from tether.supervisor.ledger.repositories import Binding
from tether.supervisor.ledger.verification import Evidence
from tether.supervisor.repos import Mirrors
from tether.supervisor.repos.evidence import PoolArtifacts, RepositoryUnavailable, gather, read_head
from tether.wire import ERRORS, ErrorCode, Outcome
from tether.wire.records import (
    MAX_TEXT,
    Checkpoint,
    ClaimAnswer,
    ClaimRequest,
    ItemAnswer,
    LeaseRef,
    LogLines,
    Released,
    ReleaseRequest,
    RenewalItem,
    Renewals,
    RenewalsAnswer,
    RenewRequest,
    Result,
    ResultAnswer,
    Results,
    ResultsAnswer,
    RunnerIdentity,
    WantLeases,
)

# Reports of one batch whose evidence is gathered at the same time.
EVIDENCE_AT_ONCE = 4

log = structlog.get_logger("tether.api")


def _ledger(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.ledger
    return ledger


async def whoami(request: Request) -> Response:
    """The pool and token id behind the caller's runner token: a runner asks at start, to know
    that it talks to a supervisor and to name its pool in its first line."""
    who = await require(request, Role.RUNNER)
    return record_response(RunnerIdentity(pool=who.scope, token_id=who.token_id))


async def claim(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    ask = await read(request, ClaimRequest)
    wait_max = request.app.state.settings.claim_wait_max_s
    if ask.wait_s > wait_max:
        raise ApiError(ErrorCode.INVALID_FIELD, f"'wait_s' must be in 0.0..{wait_max}")
    polls: LongPolls = request.app.state.long_polls
    leases: list[Lease] = []
    if not polls.draining:  # a supervisor on its way down grants nothing more
        ledger = _ledger(request)
        with polls.until_drained() as scope:
            leases = await unless_disconnected(
                request,
                scope,
                lambda: ledger.claim(
                    ask.runner_id,
                    who.scope,
                    ask.capacity,
                    ask.wait_s,
                    token_id=who.token_id,
                    kinds=ask.kinds,
                ),
            )
    leases = await hand_out(request, leases, ask.runner_id, who.scope)
    if not leases:
        return Response(status_code=204)
    return record_response(ClaimAnswer(leases=tuple(leases)))


async def hand_out(request: Request, leases: list[Lease], runner_id: str, pool: str) -> list[Lease]:
    """What every grant goes through before its answer, a claim's or an eager one's: the
    unbound steps noted, the grant spans, and the leases whose base moved left out."""
    if not leases:
        return leases
    unbound: UnboundSteps = request.app.state.unbound_steps
    unbound.granted(leases)
    with tracing.Grants(leases, runner_id=runner_id, pool=pool) as grants:
        return grants.sent(await on_current_heads(request, leases, pool))


class EagerGrant:
    """The leases a result request's `want` asks for (eager dispatch, docs/design.md, Runner
    API): `start` queues the claim rule right after the request's reports, so it runs in their
    group-commit batch; `leases` are then what the runner gets. A supervisor draining for
    shutdown grants none, as its claims do."""

    def __init__(self, request: Request, want: WantLeases | None, pool: str, token_id: str):
        polls: LongPolls = request.app.state.long_polls
        self._request = request
        self._want = None if want is None or want.leases < 1 or polls.draining else want
        self._pool = pool
        self._token_id = token_id
        self.leases: list[Lease] = []

    def start(self, tg: anyio.abc.TaskGroup, reported: list[tuple[str, int]]) -> None:
        if self._want is not None and reported:
            tg.start_soon(self._grant, self._want, reported)

    async def _grant(self, want: WantLeases, reported: list[tuple[str, int]]) -> None:
        try:
            self.leases = await _ledger(self._request).claim_after(
                reported, want.runner_id, self._pool, want.leases,
                token_id=self._token_id, kinds=want.kinds,
            )  # fmt: skip
        except LedgerError as exc:  # the results stand; the runner's claim finds the work
            log.warning("eager grant failed", code=exc.code.value, detail=exc.detail)

    async def sent(self) -> tuple[Lease, ...]:
        """The granted leases as the answer carries them (`hand_out`)."""
        if self._want is None:
            return ()
        leases = await hand_out(self._request, self.leases, self._want.runner_id, self._pool)
        return tuple(leases)


async def on_current_heads(request: Request, leases: list[Lease], pool: str) -> list[Lease]:
    """`leases` without those whose repository's head is no longer their approved base
    (docs/design.md, Verification): each repository a lease names is read once (`git
    ls-remote`, all at once) and its head recorded, which fails every approved task on
    another base `stale_base` at once; a left-out lease's step is no longer the runner's,
    and the lease lapses unused. Leases without a repository cost nothing here.

    A remote that cannot be read now does not hold the step back: its leases are handed out
    and one warning is logged; the step's result reads the head again before the ledger
    judges it, so a moved base is still caught, one step later.
    """
    bound = [lease for lease in leases if lease.repository is not None]
    if not bound:
        return leases
    ledger = _ledger(request)
    mirrors: Mirrors = request.app.state.mirrors
    named: dict[tuple[str, str], Binding] = {}  # by tenant and repository name
    heads: dict[str, str] = {}  # by URL, for the remotes that answered

    async def bind(lease: Lease) -> None:
        binding = await ledger.binding_of_step(lease.step_id, pool)
        if binding is not None:
            named.setdefault((binding.tenant, binding.repository), binding)

    async def read(url: str, binding: Binding) -> None:
        try:
            heads[url] = await read_head(mirrors, binding)
        except RepositoryUnavailable as exc:
            log.warning(
                "head not read at grant", repository=binding.repository, url=redact(url),
                detail=exc.detail,
            )  # fmt: skip

    async with anyio.create_task_group() as tg:
        for lease in bound:
            tg.start_soon(bind, lease)
    async with anyio.create_task_group() as tg:
        for url, binding in {b.url: b for b in named.values()}.items():
            tg.start_soon(read, url, binding)
    async with anyio.create_task_group() as tg:
        for (tenant, repository), binding in named.items():
            if binding.url in heads:
                tg.start_soon(ledger.set_repository_head, tenant, repository, heads[binding.url])
    return [
        lease
        for lease in leases
        if lease.repository is None
        or lease.repository.url not in heads
        or heads[lease.repository.url] == lease.repository.base_sha
    ]


async def renew(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    ask = await read(request, RenewRequest)
    renewal = await _ledger(request).renew(
        request.path_params["step_id"], ask.fence, who.scope, token_id=who.token_id
    )
    return record_response(renewal)


async def renewals(request: Request) -> Response:
    """`renew` for many leases of one runner at once: each is the same ledger rule, started
    together so that they reach the writer together (one transaction), and each gets its own
    answer, in order: the renewal, or the status, code and detail the single route would have
    sent. A malformed request refuses them all before anything is renewed."""
    who = await require(request, Role.RUNNER)
    held = (await read(request, Renewals)).leases
    if len({lease.step_id for lease in held}) != len(held):
        raise ApiError(ErrorCode.INVALID_FIELD, "'leases' names a step more than once")
    ledger = _ledger(request)
    answers: list[RenewalItem | None] = [None] * len(held)

    async def one(n: int, lease: LeaseRef) -> None:
        try:
            r = await ledger.renew(lease.step_id, lease.fence, who.scope, token_id=who.token_id)
        except LedgerError as exc:
            code = ledger_error_code(exc, request.url.path)
            answers[n] = RenewalItem(
                step_id=lease.step_id, status=ERRORS[code].status, error=code.value,
                detail=exc.detail,
            )  # fmt: skip
        else:
            answers[n] = RenewalItem(
                step_id=lease.step_id, ttl_s=r.ttl_s, renew_every_s=r.renew_every_s,
                cancelled=r.cancelled, budget_exhausted=r.budget_exhausted,
            )  # fmt: skip

    async with anyio.create_task_group() as tg:
        for n, lease in enumerate(held):
            tg.start_soon(one, n, lease)
    done = tuple(a for a in answers if a is not None)
    assert len(done) == len(held)
    return record_response(RenewalsAnswer(leases=done))


async def release(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    ask = await read(request, ReleaseRequest)
    await _ledger(request).release(
        request.path_params["step_id"],
        ask.fence,
        ask.reason,
        ask.retryable,
        ask.detail[:MAX_TEXT],
        who.scope,
        ask.usage,
        token_id=who.token_id,
    )
    return record_response(Released())


async def evidence_for(
    request: Request, report: Report, pool: str, token_id: str
) -> Evidence | None:
    """What the supervisor observes about `report` by the runner token `token_id` when its
    step's task names a repository (None when it names none): git and the artifact store,
    before the ledger's rule. A report on a lease the token does not hold is `not_found` here,
    before any bundle is imported (`fencing.binding_of_lease`).

    Whether the report names a candidate cannot decide it: a repository-bound step's report
    needs evidence even without one (its head is read). So the step's binding is read, except
    for a step this process granted unbound (`UnboundSteps`): a chat step's result pays no
    read it did not pay before.
    """
    unbound: UnboundSteps = request.app.state.unbound_steps
    if unbound.take(report.step_id):
        return None
    ledger = _ledger(request)
    binding = await ledger.binding_of_lease(report.step_id, report.fence, token_id, pool)
    if binding is None:
        return None
    mirrors: Mirrors = request.app.state.mirrors
    store: Artifacts = request.app.state.artifacts
    return await gather(
        mirrors, store, ledger, binding, report,
        step_id=report.step_id, fence=report.fence, pool=binding.pool,
    )  # fmt: skip


async def result(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    ask = await read(request, Result)
    report = ask.for_step(request.path_params["step_id"])
    evidence = await evidence_for(request, report, who.scope, who.token_id)
    header = request.headers.get("traceparent")
    eager = EagerGrant(request, ask.want, who.scope, who.token_id)
    outcomes: list[Outcome] = []
    refused: list[LedgerError] = []

    async def one() -> None:
        try:
            with tracing.commit(report.step_id, report.fence, header=header) as span:
                outcome = await _ledger(request).report(
                    report, who.scope, evidence, token_id=who.token_id
                )
                outcomes.append(outcome)
                span.set(outcome=str(outcomes[0]))
        except LedgerError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        eager.start(tg, [(report.step_id, report.fence)])
    if refused:
        raise refused[0]
    return record_response(ResultAnswer(outcome=outcomes[0], leases=await eager.sent()))


def _item_error(request: Request, step_id: str, exc: Exception) -> ItemAnswer:
    """The item a batch answers for a report the single route would have refused."""
    if isinstance(exc, RepositoryUnavailable):
        code, detail = ErrorCode.UNAVAILABLE, exc.detail
    else:
        assert isinstance(exc, LedgerError)
        code, detail = ledger_error_code(exc, request.url.path), exc.detail
    return ItemAnswer(step_id=step_id, status=ERRORS[code].status, error=code.value, detail=detail)


async def results(request: Request) -> Response:
    """`result` for many steps at once: each is the same ledger rule as on the single route
    and gets its own reply, in order: an outcome, or the status, code and detail the single
    route would have sent. A malformed item refuses the whole request before anything is
    applied."""
    who = await require(request, Role.RUNNER)
    ask = await read(request, Results)
    reports = ask.results
    if len({r.step_id for r in reports}) != len(reports):
        raise ApiError(ErrorCode.INVALID_FIELD, "'results' names a step more than once")
    ledger = _ledger(request)
    answers: list[ItemAnswer | None] = [None] * len(reports)
    evidence: list[Evidence | None] = [None] * len(reports)

    # Each bound report runs a few git processes; a full batch must not start them all at once.
    gatherers = anyio.CapacityLimiter(EVIDENCE_AT_ONCE)

    async def observe(n: int, report: Report) -> None:
        try:
            async with gatherers:
                evidence[n] = await evidence_for(request, report, who.scope, who.token_id)
        except (LedgerError, RepositoryUnavailable) as exc:
            answers[n] = _item_error(request, report.step_id, exc)

    header, sole = request.headers.get("traceparent"), len(reports) == 1

    async def one(n: int, report: Report) -> None:
        try:
            with tracing.commit(report.step_id, report.fence, header=header, sole=sole) as span:
                outcome = await ledger.report(report, who.scope, evidence[n], token_id=who.token_id)
                span.set(outcome=str(outcome))
        except LedgerError as exc:
            answers[n] = _item_error(request, report.step_id, exc)
        else:
            answers[n] = ItemAnswer(step_id=report.step_id, outcome=outcome)

    # Evidence first, every report's at once; then the reports that got theirs, started
    # together so that they reach the ledger's writer together: one transaction.
    async with anyio.create_task_group() as tg:
        for n, report in enumerate(reports):
            tg.start_soon(observe, n, report)
    # The eager grant is queued after them, into the same batch; a report refused before the
    # ledger (its evidence) still counts as not accepted.
    eager = EagerGrant(request, ask.want, who.scope, who.token_id)
    async with anyio.create_task_group() as tg:
        for n, report in enumerate(reports):
            if answers[n] is None:
                tg.start_soon(one, n, report)
        eager.start(tg, [(r.step_id, r.fence) for r in reports])
    done = tuple(a for a in answers if a is not None)
    assert len(done) == len(reports)
    return record_response(ResultsAnswer(results=done, leases=await eager.sent()))


async def checkpoint(request: Request) -> Response:
    """An `agent` step's state after a completed turn, under the attempt's fence. Its
    transcript and bundle must be bytes a runner of the caller's pool uploaded (else
    `invalid_field` naming which); the ledger decides whether the fence may write it."""
    who = await require(request, Role.RUNNER)
    ask = await read(request, Checkpoint)
    store: Artifacts = request.app.state.artifacts
    artifacts = PoolArtifacts(store, _ledger(request), who.scope)
    for field, digest in (("transcript", ask.transcript), ("bundle", ask.bundle)):
        if digest is None:
            continue
        problem = await artifacts.problem(digest, f"the checkpoint's {field}")
        if problem is not None:
            raise ApiError(ErrorCode.INVALID_FIELD, f"{field!r}: {problem.detail}")
    done = await _ledger(request).checkpoint(
        request.path_params["step_id"], ask, who.scope, token_id=who.token_id
    )
    return record_response(done)


async def log_lines(request: Request) -> Response:
    """Lines a runner wrote about its attempts, kept on the owned box (`ledger.logs`): only
    under fences granted to the caller's token. A line refused for another token's fence is
    counted in the answer and in one warning, never kept."""
    who = await require(request, Role.RUNNER)
    ask = await read(request, LogLines)
    kept = await _ledger(request).keep_log_lines(ask.lines, who.scope, who.token_id)
    if kept.refused:
        log.warning(
            "log lines refused: their fence was not granted to this token",
            refused=kept.refused, token_id=who.token_id, pool=who.scope,
        )  # fmt: skip
    return record_response(kept)


ROUTES = [
    Route("/v1/runner", whoami, methods=["GET"]),
    Route("/v1/leases/claim", claim, methods=["POST"]),
    Route("/v1/leases/renewals", renewals, methods=["POST"]),
    Route("/v1/leases/{step_id}/renew", renew, methods=["POST"]),
    Route("/v1/leases/{step_id}/release", release, methods=["POST"]),
    Route("/v1/steps/results", results, methods=["POST"]),
    Route("/v1/steps/{step_id}/result", result, methods=["POST"]),
    Route("/v1/steps/{step_id}/checkpoint", checkpoint, methods=["PUT"]),
    Route("/v1/logs", log_lines, methods=["POST"]),
]
