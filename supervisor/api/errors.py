"""Every error on the wire is `{"error": CODE, "detail": TEXT}` with a stable code, including
unknown routes, wrong methods and failures nobody foresaw (`internal`, logged here)."""

from __future__ import annotations

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tether.supervisor.ledger import LedgerError, StorageError
from tether.supervisor.repos.evidence import RepositoryUnavailable
from tether.wire import ERRORS, ErrorCode
from tether.wire.codec import encode
from tether.wire.records import ErrorBody, Record

log = structlog.get_logger("tether.api")


class ApiError(Exception):
    """A request the HTTP layer refuses before it reaches the ledger."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def record_response(record: Record, status: int = 200) -> Response:
    """A record as a JSON response, written by the one codec."""
    return Response(encode(record), status_code=status, media_type="application/json")


def error_response(code: ErrorCode, detail: str) -> Response:
    response = record_response(ErrorBody(error=code.value, detail=detail), ERRORS[code].status)
    if code is ErrorCode.UNAUTHORIZED:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


async def on_api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.code, exc.detail)


def ledger_error_code(exc: LedgerError, path: str) -> ErrorCode:
    """The wire code for a ledger error; a failure of storage or of a rule is logged here."""
    if isinstance(exc, StorageError):
        log.error("ledger storage failed", path=path, detail=exc.detail)
        return ErrorCode.UNAVAILABLE
    if exc.code is ErrorCode.INTERNAL:
        log.error("ledger rule failed", path=path, detail=exc.detail)
    return exc.code


async def on_ledger_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LedgerError)
    return error_response(ledger_error_code(exc, request.url.path), exc.detail)


async def on_repository_unavailable(request: Request, exc: Exception) -> Response:
    """A repository's remote could not be read (approval, a report's evidence): nothing was
    recorded; the caller tries again later. Logged: the operator may have to fix the remote."""
    assert isinstance(exc, RepositoryUnavailable)
    log.warning(
        "repository unavailable",
        path=request.url.path,
        repository=exc.repository,
        detail=exc.detail,
    )
    return error_response(ErrorCode.UNAVAILABLE, exc.detail)


async def on_http_exception(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {
        404: ErrorCode.NOT_FOUND,
        405: ErrorCode.METHOD_NOT_ALLOWED,
        413: ErrorCode.BODY_TOO_LARGE,
    }.get(exc.status_code, ErrorCode.BAD_REQUEST)
    return error_response(code, str(exc.detail))


async def on_client_gone(_request: Request, exc: Exception) -> Response:
    """The client closed its connection before its request was read whole: nobody is there to
    answer, and nothing is logged (a client needs no token to do this, so a line each would let
    anyone fill the disk)."""
    assert isinstance(exc, ClientDisconnect)
    return error_response(ErrorCode.BAD_REQUEST, "the client closed the connection")


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """A bug, not a refusal: log it with its traceback and reply in the wire's error shape.

    Starlette still re-raises it afterwards, so the server's own error log sees it too.
    """
    log.error("request failed", path=request.url.path, error=type(exc).__name__, exc_info=exc)
    return error_response(ErrorCode.INTERNAL, "the supervisor failed to handle this request")
