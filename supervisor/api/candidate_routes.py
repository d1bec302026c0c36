"""Operator routes for a task's candidate: its diff against the approved base, and a bundle
whose one head is `tether/<task_id>` (`tether-supervisor task candidate`). Both read the
supervisor's mirror (`tether.supervisor.repos.diffs`), never the remote."""

from __future__ import annotations

from starlette.responses import Response

from tether.supervisor.api.errors import ApiError
from tether.supervisor.api.operation import Call
from tether.supervisor.ledger import LedgerStore
from tether.supervisor.repos import Mirrors, diffs
from tether.wire import ErrorCode
from tether.wire.records import CandidateDiffView


async def chosen(call: Call[None]) -> tuple[Mirrors, str, diffs.Candidate]:
    """The caller's task the path names (by id or unique prefix), its candidate the `step`
    query names (default: the last step with one) and the mirror of its repository."""
    request, who = call.request, call.who
    ledger: LedgerStore = request.app.state.ledger
    task_id = await ledger.resolve_task_id(who.scope, request.path_params["task_id"])
    binding = await ledger.binding_of_task(who.scope, task_id)
    if binding is None:
        raise ApiError(ErrorCode.NOT_FOUND, f"task {task_id} names no repository: no candidate")
    task = await ledger.task(task_id, who.scope)
    try:
        candidate = diffs.pick(task, request.query_params.get("step"))
    except diffs.CandidateError as exc:
        raise ApiError(ErrorCode.NOT_FOUND, str(exc)) from None
    return request.app.state.mirrors, binding.url, candidate


async def candidate_diff(call: Call[None]) -> CandidateDiffView:
    mirrors, url, candidate = await chosen(call)
    try:
        found = await diffs.diff(mirrors.path(url), candidate)
    except diffs.CandidateError as exc:
        raise ApiError(ErrorCode.NOT_FOUND, str(exc)) from None
    return found.view()


async def candidate_bundle(call: Call[None]) -> Response:
    mirrors, url, candidate = await chosen(call)
    try:
        data = await diffs.bundle(mirrors.path(url), candidate)
    except diffs.CandidateError as exc:
        raise ApiError(ErrorCode.NOT_FOUND, str(exc)) from None
    return Response(data, media_type="application/octet-stream")
