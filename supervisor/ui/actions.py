"""The status page's writes: sign in and out, and the operator's actions on a task (approve,
cancel, record a review decision, open an effect's gate, say whether an uncertain effect
happened) with the CLI's rules: each form is read into the API's own record and handed to the
same ledger method the API route calls. A refused action shows the task page again with the
refusal in one line; nothing changed."""

from __future__ import annotations

from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tether.supervisor.api.errors import ApiError
from tether.supervisor.ledger import LedgerError, Principal
from tether.supervisor.repos.evidence import RepositoryUnavailable, read_head
from tether.supervisor.ui import pages, render, session
from tether.supervisor.ui.guard import LOGIN, refusal, signed
from tether.wire import ERRORS, ErrorCode
from tether.wire.codec import BadMessage, decode, encode
from tether.wire.records import (
    MAX_TEXT,
    Approval,
    Cancel,
    EffectHappened,
    GateOpen,
    Record,
    ReviewDecision,
)

R = TypeVar("R", bound=Record)


def _record(fields: dict[str, Any], into: type[R]) -> R:
    """The form's fields read as the API reads a body, with its limits and its refusals."""
    try:
        return decode(encode(fields), into)
    except BadMessage as exc:
        raise ApiError(exc.code, exc.detail) from None


def _to_task(task_id: str) -> Response:
    return RedirectResponse(f"/ui/tasks/{task_id}", status_code=303)


async def _act(request: Request, who: Principal, act: Any) -> Response:
    """Run `act(fields)` on the checked form; then the task page, or the refusal on it."""
    task_id = request.path_params["task_id"]
    fields = await session.checked_form(request)
    try:
        await act(fields)
    except (ApiError, LedgerError, RepositoryUnavailable) as exc:
        code, detail = refusal(exc, request.url.path)
        notice = f"{code.value}: {detail}"
        return await pages.task_page(request, who, task_id, notice, ERRORS[code].status)
    return _to_task(task_id)


async def _approve(request: Request, who: Principal) -> Response:
    async def act(fields: dict[str, str]) -> None:
        ask = _record(
            {
                "plan_hash": fields.get("plan_hash", "").strip(),
                "base_sha": fields.get("base_sha", "").strip() or None,
            },
            Approval,
        )
        task_id = request.path_params["task_id"]
        ledger = pages.ledger_of(request)
        # As the API's approve route does: a repository task's base must be the head its
        # remote names now, read here (git is an adapter's I/O) and judged by the ledger.
        binding = await ledger.binding_of_task(who.scope, task_id)
        head = None if binding is None else await read_head(request.app.state.mirrors, binding)
        await ledger.approve(who.scope, task_id, ask.plan_hash, ask.base_sha, head)

    return await _act(request, who, act)


async def _cancel(request: Request, who: Principal) -> Response:
    async def act(fields: dict[str, str]) -> None:
        ask = _record({"reason": fields.get("reason", "").strip()}, Cancel)
        reason = ask.reason[:MAX_TEXT] or "cancelled"
        await pages.ledger_of(request).cancel(who.scope, request.path_params["task_id"], reason)

    return await _act(request, who, act)


async def _review(request: Request, who: Principal) -> Response:
    async def act(fields: dict[str, str]) -> None:
        ask = _record(
            {"decision": fields.get("decision", ""), "note": fields.get("note", "").strip()},
            ReviewDecision,
        )
        await pages.ledger_of(request).record_review(
            who.scope, request.path_params["task_id"], ask.decision, ask.note[:MAX_TEXT]
        )

    return await _act(request, who, act)


def _step_of(fields: dict[str, str]) -> str:
    """The effect step a gate form names (in the form, not the path: a step's name may hold
    any character, `/` included)."""
    step = fields.get("step", "")
    if not step:
        raise ApiError(ErrorCode.INVALID_FIELD, "'step': the form names no effect step")
    return step


async def _open_gate(request: Request, who: Principal) -> Response:
    """Open an effect's gate for the digest the page showed (a hidden field); the ledger
    refuses a digest that is no longer its request's (docs/design.md, Effects)."""

    async def act(fields: dict[str, str]) -> None:
        ask = _record({"digest": fields.get("digest", "").strip().lower()}, GateOpen)
        await pages.ledger_of(request).open_gate(
            who.scope, request.path_params["task_id"], _step_of(fields), ask.digest, who.token_id
        )

    return await _act(request, who, act)


_SAID: dict[str, bool] = {"yes": True, "no": False}


async def _happened(request: Request, who: Principal) -> Response:
    """An operator's word on an uncertain effect, `yes` or `no` as `task gate --happened`."""

    async def act(fields: dict[str, str]) -> None:
        said = fields.get("happened", "")
        if said not in _SAID:
            raise ApiError(ErrorCode.INVALID_FIELD, "'happened' must be yes or no")
        ask = _record({"happened": _SAID[said]}, EffectHappened)
        await pages.ledger_of(request).resolve_effect(
            who.scope,
            request.path_params["task_id"],
            _step_of(fields),
            ask.happened,
            who.token_id,
        )

    return await _act(request, who, act)


async def _logout(request: Request, _who: Principal) -> Response:
    await session.checked_form(request)
    await session.end(request)
    response = RedirectResponse(LOGIN, status_code=303)
    session.forget(response, request)
    return response


async def login_form(request: Request) -> Response:
    return render.page(request, "login.html", {"notice": None})


async def login(request: Request) -> Response:
    """Check the posted token with the API's own check; start a session for it, whose id
    (never the token) the cookie keeps."""

    def again(notice: str, status_code: int) -> Response:
        return render.page(request, "login.html", {"notice": notice}, status_code)

    try:
        if not session.same_origin(request):
            raise session.WriteRefused("the form was sent from another site")
        secret = (await session.form(request)).get("token", "").strip()
        operator = await session.operator_for(request, secret)
    except session.WriteRefused as exc:
        return again(exc.detail, 403)
    except ApiError as exc:
        return again(f"{exc.code.value}: {exc.detail}", ERRORS[exc.code].status)
    response = RedirectResponse("/ui", status_code=303)
    session.keep(response, request, await session.start(request, operator))
    return response


approve = signed(_approve)
cancel = signed(_cancel)
review = signed(_review)
open_gate = signed(_open_gate)
happened = signed(_happened)
logout = signed(_logout)
