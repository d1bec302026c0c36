"""Every status-page endpoint runs behind `signed`: the signed-in operator or the login page,
and each refusal shown as a page of one line instead of the API's JSON."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import structlog
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tether.supervisor.api.errors import ApiError, ledger_error_code
from tether.supervisor.ledger import LedgerError, Principal
from tether.supervisor.repos.evidence import RepositoryUnavailable
from tether.supervisor.ui import render, session
from tether.wire import ERRORS, ErrorCode

log = structlog.get_logger("tether.ui")

Handler = Callable[[Request, Principal], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]

LOGIN = "/ui/login"


def refusal(error: Exception, path: str) -> tuple[ErrorCode, str]:
    """The wire code and detail of an error a page shows instead of its content."""
    if isinstance(error, LedgerError):
        return ledger_error_code(error, path), error.detail
    if isinstance(error, ApiError):
        return error.code, error.detail
    if isinstance(error, RepositoryUnavailable):
        log.warning("repository unavailable", path=path, repository=error.repository)
        return ErrorCode.UNAVAILABLE, error.detail
    raise error


def signed(handler: Handler, *, redirect: bool = True) -> Endpoint:
    """`handler` for the signed-in operator. Without a valid session a page redirects to the
    login form (`redirect`), a fragment or a stream answers 401. A ledger or API refusal
    becomes a one-line page with its status; a write refused by `session.checked_form`, 403."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        try:
            who = await session.signed_in(request)
        except session.SignedOut:
            response: Response = (
                RedirectResponse(LOGIN, status_code=303)
                if redirect
                else render.message(request, "Signed out", "sign in again", 401)
            )
            if request.cookies.get(session.COOKIE):
                session.forget(response, request)
            return response
        try:
            return await handler(request, who)
        except session.WriteRefused as exc:
            client = request.client.host if request.client else None
            log.warning(
                "write refused",
                path=request.url.path,
                client=client,
                detail=exc.detail,
                token_id=who.token_id,
            )
            return render.message(request, "Refused", exc.detail, 403)
        except (ApiError, LedgerError) as exc:
            code, detail = refusal(exc, request.url.path)
            return render.message(request, code.value, detail, ERRORS[code].status)

    return endpoint
