"""Runner routes: claim, renew, release, result. A runner token acts for its pool only; a step
of another pool is `not_found`.

`POST /v1/steps/results` is `result` for many steps at once (an addition to SPEC §5): the
runner sends every result that is ready at the same moment in one request, as the ledger
commits every rule that is ready in one transaction. Each result is the same ledger rule as on
the single route and gets its own answer, in order: `{"step_id", "outcome"}`, or
`{"step_id", "status", "error", "detail"}` with the status and code the single route would
have answered. A malformed item refuses the whole request before anything is applied.
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisor.api import requests as rq
from supervisor.api.auth import require
from supervisor.api.errors import STATUS, ApiError, ledger_error_code
from supervisor.api.longpoll import LongPolls, unless_disconnected
from supervisor.ledger import Lease, Ledger, LedgerError, Report, Role
from supervisor.ledger.fencing import MAX_CAPACITY
from tether.wire import RESULTS_PER_REQUEST_MAX, ErrorCode, ReleaseReason

MAX_FENCE = 2**62


def _ledger(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.ledger
    return ledger


async def _body(request: Request) -> dict[str, Any]:
    return await rq.json_body(request, request.app.state.settings.max_body_bytes)


async def claim(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    body = await _body(request)
    settings = request.app.state.settings
    runner_id = rq.text(body, "runner_id")
    capacity = rq.integer(body, "capacity", low=1, high=MAX_CAPACITY)
    wait_s = rq.number(body, "wait_s", default=0.0, low=0.0, high=settings.claim_wait_max_s)
    polls: LongPolls = request.app.state.long_polls
    leases: list[Lease] = []
    if not polls.draining:  # a supervisor on its way down grants nothing more
        ledger = _ledger(request)
        with polls.until_drained() as scope:
            leases = await unless_disconnected(
                request, scope, lambda: ledger.claim(runner_id, who.scope, capacity, wait_s)
            )
    if not leases:
        return Response(status_code=204)
    return JSONResponse({"leases": [lease.to_wire() for lease in leases]})


async def renew(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    body = await _body(request)
    renewal = await _ledger(request).renew(
        request.path_params["step_id"], rq.integer(body, "fence", low=0, high=MAX_FENCE), who.scope
    )
    return JSONResponse(renewal.to_wire())


async def release(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    body = await _body(request)
    try:
        reason = ReleaseReason(rq.text(body, "reason"))
    except ValueError:
        known = ", ".join(r.value for r in ReleaseReason)
        raise ApiError(ErrorCode.INVALID_FIELD, f"'reason' must be one of {known}") from None
    await _ledger(request).release(
        request.path_params["step_id"],
        rq.integer(body, "fence", low=0, high=MAX_FENCE),
        reason,
        rq.boolean(body, "retryable"),
        rq.free_text(body, "detail"),
        who.scope,
    )
    return JSONResponse({"released": True})


def _report_of(body: dict[str, Any], step_id: str) -> Report:
    if "output" not in body:
        raise ApiError(ErrorCode.INVALID_FIELD, "'output' is required")
    return Report(
        step_id=step_id,
        fence=rq.integer(body, "fence", low=0, high=MAX_FENCE),
        payload_hash=rq.text(body, "payload_hash", limit=64),
        output=body["output"],
        usage=rq.usage_map(body, "usage"),
        candidate_sha=rq.optional_text(body, "candidate_sha", limit=128),
        artifacts=rq.string_map(body, "artifacts"),
    )


async def result(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    report = _report_of(await _body(request), request.path_params["step_id"])
    outcome = await _ledger(request).report(report, who.scope)
    return JSONResponse({"outcome": outcome.value})


def _reports_of(body: dict[str, Any]) -> list[Report]:
    items = body.get("results")
    if not isinstance(items, list) or not 1 <= len(items) <= RESULTS_PER_REQUEST_MAX:
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            f"'results' must be a list of 1..{RESULTS_PER_REQUEST_MAX} results",
        )
    reports: list[Report] = []
    for n, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ApiError(ErrorCode.INVALID_FIELD, "a result must be an object")
            reports.append(_report_of(item, rq.text(item, "step_id")))
        except ApiError as exc:
            raise ApiError(exc.code, f"results[{n}]: {exc.detail}") from None
    if len({r.step_id for r in reports}) != len(reports):
        raise ApiError(ErrorCode.INVALID_FIELD, "'results' names a step more than once")
    return reports


async def results(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    reports = _reports_of(await _body(request))
    ledger = _ledger(request)
    answers: list[dict[str, Any]] = [{} for _ in reports]

    async def one(n: int, report: Report) -> None:
        try:
            outcome = await ledger.report(report, who.scope)
        except LedgerError as exc:
            code = ledger_error_code(exc, request.url.path)
            answers[n] = {
                "step_id": report.step_id, "status": STATUS[code], "error": code.value,
                "detail": exc.detail,
            }  # fmt: skip
        else:
            answers[n] = {"step_id": report.step_id, "outcome": outcome.value}

    # Started together, the reports reach the ledger's writer together: one transaction.
    async with anyio.create_task_group() as tg:
        for n, report in enumerate(reports):
            tg.start_soon(one, n, report)
    return JSONResponse({"results": answers})


ROUTES = [
    Route("/v1/leases/claim", claim, methods=["POST"]),
    Route("/v1/leases/{step_id}/renew", renew, methods=["POST"]),
    Route("/v1/leases/{step_id}/release", release, methods=["POST"]),
    Route("/v1/steps/results", results, methods=["POST"]),
    Route("/v1/steps/{step_id}/result", result, methods=["POST"]),
]
