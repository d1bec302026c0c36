"""Runner routes: who am I, claim, renew, release, result. A runner token acts for its pool
only; a step of another pool is `not_found`.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from supervisor.api.auth import require
from supervisor.api.errors import ApiError, ledger_error_code, record_response
from supervisor.api.longpoll import LongPolls, unless_disconnected
from supervisor.api.requests import read
from supervisor.ledger import Lease, Ledger, LedgerError, Report, Role
from tether.messages import (
    MAX_TEXT,
    ClaimAnswer,
    ClaimRequest,
    ItemAnswer,
    Released,
    ReleaseRequest,
    RenewRequest,
    Result,
    ResultAnswer,
    Results,
    ResultsAnswer,
    RunnerIdentity,
)
from tether.wire import ERRORS, ErrorCode


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
    if not leases:
        return Response(status_code=204)
    return record_response(ClaimAnswer(leases=tuple(leases)))


async def renew(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    ask = await read(request, RenewRequest)
    renewal = await _ledger(request).renew(request.path_params["step_id"], ask.fence, who.scope)
    return record_response(renewal)


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
    )
    return record_response(Released())


async def result(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    report = (await read(request, Result)).for_step(request.path_params["step_id"])
    outcome = await _ledger(request).report(report, who.scope)
    return record_response(ResultAnswer(outcome=outcome))


async def results(request: Request) -> Response:
    """`result` for many steps at once: each is the same ledger rule as on the single route
    and gets its own reply, in order: an outcome, or the status, code and detail the single
    route would have sent. A malformed item refuses the whole request before anything is
    applied."""
    who = await require(request, Role.RUNNER)
    reports = (await read(request, Results)).results
    if len({r.step_id for r in reports}) != len(reports):
        raise ApiError(ErrorCode.INVALID_FIELD, "'results' names a step more than once")
    ledger = _ledger(request)
    answers: list[ItemAnswer] = [ItemAnswer(step_id=r.step_id) for r in reports]

    async def one(n: int, report: Report) -> None:
        try:
            outcome = await ledger.report(report, who.scope)
        except LedgerError as exc:
            code = ledger_error_code(exc, request.url.path)
            answers[n] = ItemAnswer(
                step_id=report.step_id, status=ERRORS[code].status, error=code.value,
                detail=exc.detail,
            )  # fmt: skip
        else:
            answers[n] = ItemAnswer(step_id=report.step_id, outcome=outcome)

    # Started together, the reports reach the ledger's writer together: one transaction.
    async with anyio.create_task_group() as tg:
        for n, report in enumerate(reports):
            tg.start_soon(one, n, report)
    return record_response(ResultsAnswer(results=tuple(answers)))


ROUTES = [
    Route("/v1/runner", whoami, methods=["GET"]),
    Route("/v1/leases/claim", claim, methods=["POST"]),
    Route("/v1/leases/{step_id}/renew", renew, methods=["POST"]),
    Route("/v1/leases/{step_id}/release", release, methods=["POST"]),
    Route("/v1/steps/results", results, methods=["POST"]),
    Route("/v1/steps/{step_id}/result", result, methods=["POST"]),
]
