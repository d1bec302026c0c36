"""Reading requests: a size-limited body decoded into its record, and typed query parameters.

The records and their limits are the contract's (`tether.wire.records`); what the values mean (a
plan, a fence) is the ledger's business.
"""

from __future__ import annotations

import re
from typing import TypeVar

import anyio
from starlette.requests import Request

from tether.supervisor.api.errors import ApiError
from tether.wire import ErrorCode
from tether.wire.codec import BadMessage, decode
from tether.wire.records import Record

R = TypeVar("R", bound=Record)

_INTEGER = re.compile(r"-?[0-9]{1,19}")
_DECIMAL = re.compile(r"-?([0-9]{1,19}(\.[0-9]{0,9})?|\.[0-9]{1,9})")


def _invalid(detail: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_FIELD, detail)


async def body_bytes(request: Request, limit: int) -> bytes:
    """The request's body, refusing one over `limit` bytes before reading it all, or one that
    has not arrived whole within `body_read_timeout_s`: the login form is read before any
    token is checked, so a client that sends a head and then trickles (or withholds) its body
    must not hold a connection for as long as it likes."""
    deadline: float = request.app.state.settings.body_read_timeout_s
    try:
        with anyio.fail_after(deadline):
            return await _read_body(request, limit)
    except TimeoutError:
        raise ApiError(
            ErrorCode.BAD_REQUEST, f"the body did not arrive within {deadline:g} s"
        ) from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(ErrorCode.BAD_REQUEST, "Content-Length is not a number")
        if int(declared) > limit:
            raise ApiError(ErrorCode.BODY_TOO_LARGE, f"the body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(ErrorCode.BODY_TOO_LARGE, f"the body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read(request: Request, into: type[R]) -> R:
    """The request's body as the record `into`, within the supervisor's `max_body_bytes`."""
    raw = await body_bytes(request, request.app.state.settings.max_body_bytes)
    try:
        return decode(raw, into)
    except BadMessage as exc:
        raise ApiError(exc.code, exc.detail) from None


def query_int(request: Request, name: str, *, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):  # int() would also take " 7", "7_0" and non-ASCII digits
        raise _invalid(f"query parameter {name!r} must be an integer")
    value = int(raw)
    if not low <= value <= high:
        raise _invalid(f"query parameter {name!r} must be in {low}..{high}")
    return value


def query_float(request: Request, name: str, *, default: float, low: float, high: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _DECIMAL.fullmatch(raw):  # float() would also take "nan", "1e9", " 7"
        raise _invalid(f"query parameter {name!r} must be a number")
    value = float(raw)
    if not low <= value <= high:
        raise _invalid(f"query parameter {name!r} must be in {low}..{high}")
    return value
