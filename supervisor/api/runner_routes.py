"""Runner routes: claim, renew, release, result. A runner token acts for its pool only; a step
of another pool is `not_found`."""

from __future__ import annotations

from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisor.api import requests as rq
from supervisor.api.auth import require
from supervisor.api.errors import ApiError
from supervisor.api.longpoll import LongPolls
from supervisor.ledger import Lease, Ledger, Report, Role
from supervisor.ledger.fencing import MAX_CAPACITY
from tether.wire import ErrorCode, ReleaseReason

MAX_FENCE = 2**62


def _ledger(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.ledger
    return ledger


async def _body(request: Request) -> dict[str, Any]:
    return await rq.json_body(request, request.app.state.settings.max_body_bytes)


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """A runner that hung up (shut down, crashed) must not be granted leases it will never
    see: they would sit out the acceptance window. The body is already read, so the next ASGI
    message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


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
        with polls.until_drained() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_disconnect, request, scope)
                leases = await _ledger(request).claim(runner_id, who.scope, capacity, wait_s)
                tg.cancel_scope.cancel()
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


async def result(request: Request) -> Response:
    who = await require(request, Role.RUNNER)
    body = await _body(request)
    if "output" not in body:
        raise ApiError(ErrorCode.INVALID_FIELD, "'output' is required")
    report = Report(
        step_id=request.path_params["step_id"],
        fence=rq.integer(body, "fence", low=0, high=MAX_FENCE),
        payload_hash=rq.text(body, "payload_hash", limit=64),
        output=body["output"],
        usage=rq.usage_map(body, "usage"),
        candidate_sha=rq.optional_text(body, "candidate_sha", limit=128),
        artifacts=rq.string_map(body, "artifacts"),
    )
    outcome = await _ledger(request).report(report, who.scope)
    return JSONResponse({"outcome": outcome.value})


ROUTES = [
    Route("/v1/leases/claim", claim, methods=["POST"]),
    Route("/v1/leases/{step_id}/renew", renew, methods=["POST"]),
    Route("/v1/leases/{step_id}/release", release, methods=["POST"]),
    Route("/v1/steps/{step_id}/result", result, methods=["POST"]),
]
