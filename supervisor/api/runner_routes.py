"""Runner routes: who am I, claim, renew (one lease or many), release, result (with the next
leases, when asked), checkpoint, log lines. A runner token acts for its pool only; a step of
another pool is `not_found`.

Each route is handed its caller and decoded body (`operation.Call`), calls the ledger or one
use case (`tether.supervisor.usecases`: what a grant goes through, what is observed about a
report before the ledger judges it) and returns the answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import structlog
from starlette.requests import Request

from tether.supervisor.api.errors import ApiError, ledger_error_code
from tether.supervisor.api.longpoll import LongPolls, unless_disconnected
from tether.supervisor.api.operation import Call
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import Lease, LedgerError, LedgerStore
from tether.supervisor.repos.evidence import PoolArtifacts, RepositoryUnavailable
from tether.supervisor.usecases import grants, reports
from tether.supervisor.usecases.parts import Parts
from tether.supervisor.usecases.renewals import renew_many
from tether.wire import ERRORS, ErrorCode
from tether.wire.records import (
    MAX_TEXT,
    Checkpoint,
    Checkpointed,
    ClaimAnswer,
    ClaimRequest,
    ItemAnswer,
    LogLines,
    LogLinesKept,
    Released,
    ReleaseRequest,
    Renewal,
    RenewalItem,
    Renewals,
    RenewalsAnswer,
    RenewRequest,
    Result,
    ResultAnswer,
    Results,
    ResultsAnswer,
    RunnerIdentity,
)

log = structlog.get_logger("tether.api")


def _ledger(request: Request) -> LedgerStore:
    ledger: LedgerStore = request.app.state.ledger
    return ledger


def _parts(request: Request) -> Parts:
    state = request.app.state
    return Parts(
        ledger=state.ledger,
        mirrors=state.mirrors,
        artifacts=state.artifacts,
        unbound=state.unbound_steps,
    )


def _draining(request: Request) -> Callable[[], bool]:
    """Whether the supervisor is on its way down, asked when a use case is about to grant."""
    polls: LongPolls = request.app.state.long_polls
    return lambda: polls.draining


async def whoami(call: Call[None]) -> RunnerIdentity:
    """The pool and token id behind the caller's runner token: a runner asks at start, to know
    that it talks to a supervisor and to name its pool in its first line."""
    who = call.who
    return RunnerIdentity(pool=who.scope, token_id=who.token_id)


async def claim(call: Call[ClaimRequest]) -> ClaimAnswer | None:
    """The leases the ledger grants the caller's runner, waited for up to `wait_s` (a long
    poll that ends on drain or hang-up), as `grants.hand_out` lets them go."""
    request, who, ask = call.request, call.who, call.body
    wait_max = request.app.state.settings.claim_wait_max_s
    if ask.wait_s > wait_max:
        raise ApiError(ErrorCode.INVALID_FIELD, f"'wait_s' must be in 0.0..{wait_max}")
    polls: LongPolls = request.app.state.long_polls
    parts = _parts(request)
    leases: list[Lease] = []
    if not polls.draining:  # a supervisor on its way down grants nothing more
        with polls.until_drained() as scope:
            leases = await unless_disconnected(
                request,
                scope,
                lambda: parts.ledger.claim(
                    ask.runner_id,
                    who.scope,
                    ask.capacity,
                    ask.wait_s,
                    token_id=who.token_id,
                    kinds=ask.kinds,
                ),
            )
    leases = await grants.hand_out(parts, leases, ask.runner_id, who.scope)
    if not leases:
        return None  # 204, no body
    return ClaimAnswer(leases=tuple(leases))


async def renew(call: Call[RenewRequest]) -> Renewal:
    request, who, ask = call.request, call.who, call.body
    renewal = await _ledger(request).renew(
        request.path_params["step_id"], ask.fence, who.scope, token_id=who.token_id
    )
    return renewal


async def renewals(call: Call[Renewals]) -> RenewalsAnswer:
    """`renew` for many leases of one runner at once (`renewals.renew_many`): each gets its
    own answer, in order, a refused one the status, code and detail the single route would
    have sent. A malformed request refuses them all before anything is renewed."""
    request, who = call.request, call.who
    held = call.body.leases
    if len({lease.step_id for lease in held}) != len(held):
        raise ApiError(ErrorCode.INVALID_FIELD, "'leases' names a step more than once")

    def refusal(step_id: str, exc: LedgerError) -> RenewalItem:
        code = ledger_error_code(exc, request.url.path)
        return RenewalItem(
            step_id=step_id, status=ERRORS[code].status, error=code.value, detail=exc.detail
        )

    answer = await renew_many(_ledger(request), who, held, refusal=refusal)
    return answer


async def release(call: Call[ReleaseRequest]) -> Released:
    request, who, ask = call.request, call.who, call.body
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
    return Released()


async def result(call: Call[Result]) -> ResultAnswer:
    request, who, ask = call.request, call.who, call.body
    answer = await reports.report_one(
        _parts(request),
        who,
        ask.for_step(request.path_params["step_id"]),
        ask.want,
        draining=_draining(request),
        traceparent=request.headers.get("traceparent"),
    )
    return answer


def _item_error(
    request: Request, step_id: str, exc: LedgerError | RepositoryUnavailable
) -> ItemAnswer:
    """The item a batch answers for a report the single route would have refused."""
    if isinstance(exc, RepositoryUnavailable):
        code, detail = ErrorCode.UNAVAILABLE, exc.detail
    else:
        code, detail = ledger_error_code(exc, request.url.path), exc.detail
    return ItemAnswer(step_id=step_id, status=ERRORS[code].status, error=code.value, detail=detail)


async def results(call: Call[Results]) -> ResultsAnswer:
    """`result` for many steps at once (`reports.report_many`): each gets its own reply, in
    order: an outcome, or the status, code and detail the single route would have sent. A
    malformed item refuses the whole request before anything is applied."""
    request, who, ask = call.request, call.who, call.body
    if len({r.step_id for r in ask.results}) != len(ask.results):
        raise ApiError(ErrorCode.INVALID_FIELD, "'results' names a step more than once")
    answer = await reports.report_many(
        _parts(request),
        who,
        ask.results,
        ask.want,
        draining=_draining(request),
        traceparent=request.headers.get("traceparent"),
        refusal=functools.partial(_item_error, request),
    )
    return answer


async def checkpoint(call: Call[Checkpoint]) -> Checkpointed:
    """An `agent` step's state after a completed turn, under the attempt's fence. Its
    transcript and bundle must be bytes a runner of the caller's pool uploaded (else
    `invalid_field` naming which); the ledger decides whether the fence may write it."""
    request, who, ask = call.request, call.who, call.body
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
    return done


async def log_lines(call: Call[LogLines]) -> LogLinesKept:
    """Lines a runner wrote about its attempts, kept on the owned box (`ledger.logs`): only
    under fences granted to the caller's token. A line refused for another token's fence is
    counted in the answer and in one warning, never kept."""
    request, who, ask = call.request, call.who, call.body
    kept = await _ledger(request).keep_log_lines(ask.lines, who.scope, who.token_id)
    if kept.refused:
        log.warning(
            "log lines refused: their fence was not granted to this token",
            refused=kept.refused,
            token_id=who.token_id,
            pool=who.scope,
        )
    return kept
