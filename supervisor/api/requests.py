"""Reading request bodies and fields: size-limited JSON, typed fields, clear refusals.

Wire-level typing lives here; what the values mean (a plan, a fence) is the ledger's business.
A body is accepted only if it is strict JSON that canonical JSON can encode, so nothing a
client sends can reach a ledger rule and fail there (that would be a 500, not a refusal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from supervisor.api.errors import ApiError
from tether.wire import ErrorCode, canonical_json

MAX_TEXT = 10_000
MAX_USAGE = 10**12  # tokens in one step's report; no model comes near
_INTEGER = re.compile(r"-?[0-9]{1,19}")
_DECIMAL = re.compile(r"-?([0-9]{1,19}(\.[0-9]{0,9})?|\.[0-9]{1,9})")


def _invalid(detail: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_FIELD, detail)


async def json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, refusing bodies over `limit` bytes before reading them all."""
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
    raw = b"".join(chunks)
    if not raw:
        raise ApiError(ErrorCode.MALFORMED_JSON, "the body is empty; send a JSON object")
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
        # Everything accepted must hash and store: canonical JSON refuses lone surrogates.
        canonical_json(body)
    except RecursionError:
        raise ApiError(ErrorCode.MALFORMED_JSON, "the body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeError, an integer of 4300+ digits
        raise ApiError(ErrorCode.MALFORMED_JSON, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.MALFORMED_JSON, "the body must be a JSON object")
    return body


def _refuse_constant(name: str) -> Any:
    """Python's json reads NaN and Infinity, which are not JSON: a payload or an output holding
    one could be stored but never answered (every response is strict JSON)."""
    raise ValueError(f"{name} is not a JSON value")


def text(body: Mapping[str, Any], name: str, *, limit: int = 200) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise _invalid(f"{name!r} must be a non-empty string")
    if len(value) > limit:
        raise _invalid(f"{name!r} must be at most {limit} characters")
    return value


def optional_text(body: Mapping[str, Any], name: str, *, limit: int = 200) -> str | None:
    if body.get(name) is None:
        return None
    return text(body, name, limit=limit)


def free_text(body: Mapping[str, Any], name: str, *, default: str = "") -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise _invalid(f"{name!r} must be a string")
    return value[:MAX_TEXT]


def integer(body: Mapping[str, Any], name: str, *, low: int, high: int) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{name!r} must be an integer")
    if not low <= value <= high:
        raise _invalid(f"{name!r} must be in {low}..{high}")
    return value


def number(body: Mapping[str, Any], name: str, *, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(f"{name!r} must be a number")
    if not low <= value <= high:
        raise _invalid(f"{name!r} must be in {low}..{high}")
    return float(value)


def boolean(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if not isinstance(value, bool):
        raise _invalid(f"{name!r} must be true or false")
    return value


def text_list(body: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _invalid(f"{name!r} must be a list of non-empty strings")
    return tuple(value)


def string_map(body: Mapping[str, Any], name: str) -> dict[str, str]:
    value = body.get(name, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _invalid(f"{name!r} must be an object of strings")
    return dict(value)


def usage_map(body: Mapping[str, Any], name: str) -> dict[str, int]:
    """Token counts. Bounded so that a tenant's running total always fits SQLite's 64-bit
    integers: an unbounded count would fail the commit itself, and the runner could never
    report that step."""
    value = body.get(name, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and isinstance(v, int)
        and not isinstance(v, bool)
        and 0 <= v <= MAX_USAGE
        for k, v in value.items()
    ):
        raise _invalid(f"{name!r} must be an object of integers in 0..{MAX_USAGE}")
    return dict(value)


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
