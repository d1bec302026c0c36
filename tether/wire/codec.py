"""The one codec of the v1 API: a body is read into its record, checked as it is read, and a
record is written out as JSON.

A body is accepted only if it is strict JSON (no NaN, no lone surrogate, no number out of
range) with every field its record asks for, so nothing a client sends can reach a ledger rule
and fail there. A refusal is a `BadMessage` with the code the API replies with.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, TypeVar

import msgspec

from tether.wire import ErrorCode, canonical_json
from tether.wire.nul import ESCAPED_NUL, nul_field
from tether.wire.payloads import with_hint
from tether.wire.records import Record

R = TypeVar("R", bound=Record)

_encoder = msgspec.json.Encoder()
encode = _encoder.encode
"""A record (or plain data) as compact UTF-8 JSON."""


class BadMessage(ValueError):
    """A body that is not the message it should be; `code` says how (`malformed_json`,
    `invalid_field`), `detail` names the field."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@functools.cache
def _decoder(into: type[R]) -> msgspec.json.Decoder[R]:
    return msgspec.json.Decoder(into)


def decode(raw: bytes, into: type[R]) -> R:
    """The record `into` that `raw` holds; `BadMessage` if it holds none."""
    if not raw:
        raise BadMessage(ErrorCode.MALFORMED_JSON, "the body is empty; send a JSON object")
    try:
        record: R = _decoder(into).decode(raw)
    except msgspec.ValidationError as exc:
        # Refused while reading, so not yet known to be JSON at all: a body that is not
        # strict JSON is malformed, whichever field the reader stopped at (the error path
        # only, so the happy path reads the body once).
        _require_json_object(raw)
        detail = _field_detail(with_hint(str(exc), into))
        raise BadMessage(ErrorCode.INVALID_FIELD, detail) from None
    except msgspec.DecodeError as exc:
        raise BadMessage(ErrorCode.MALFORMED_JSON, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadMessage(ErrorCode.MALFORMED_JSON, "the body is nested too deeply") from None
    # JSON spells NUL only as `\u0000`. Most bodies have no backslash at all: a one-byte
    # search (memchr) is ~50x faster than the six-byte one, and `find` skips the int lookup
    # of `in`. Only a body that spells one is walked.
    if raw.find(b"\\") != -1 and raw.find(ESCAPED_NUL) != -1:
        where = nul_field(record, into)
        if where is not None:
            raise BadMessage(ErrorCode.INVALID_FIELD, f"{where}: must not contain NUL (\\u0000)")
    return record


def _require_json_object(raw: bytes) -> None:
    """`BadMessage(malformed_json)` unless `raw` is a JSON object canonical JSON can encode."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
        canonical_json(body)  # refuses 1e999 (read as infinity)
    except RecursionError:
        raise BadMessage(ErrorCode.MALFORMED_JSON, "the body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeError, an integer of 4300+ digits
        raise BadMessage(ErrorCode.MALFORMED_JSON, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadMessage(ErrorCode.MALFORMED_JSON, "the body must be a JSON object")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_AT = re.compile(r"^(?P<what>.*) - at `\$\.?(?P<path>[^`]*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")
# A record's own check that names a field inside the value it checked (`tether.wire.payloads`).
_INNER = re.compile(r"^`(?P<path>[^`]+)`: (?P<what>.*)$", re.DOTALL)


def _field_detail(message: str) -> str:
    """msgspec's `Expected `int`, got `str` - at `$.results[1].fence`` as
    `'results[1].fence': expected `int`, got `str``, naming the field as the client wrote it."""
    at = _AT.match(message)
    what, path = (at["what"], at["path"]) if at else (message, "")
    inner = _INNER.match(what)
    if inner:
        what, path = inner["what"], f"{path}.{inner['path']}" if path else inner["path"]
    missing = _MISSING.match(what)
    if missing:
        field = f"{path}.{missing['field']}" if path else missing["field"]
        return f"{field!r} is required"
    what = what[:1].lower() + what[1:]
    return f"{path!r}: {what}" if path else f"the body: {what}"


def encode_strict(record: Record) -> bytes:
    """`encode`, refusing what JSON cannot hold instead of changing it: `ValueError` for a NaN
    or an infinity (which `encode` writes as null), `UnicodeEncodeError` for a lone surrogate,
    `TypeError` for an object that is not JSON."""
    data = encode(record)
    if b"null" in data and _non_finite(msgspec.to_builtins(record)):
        raise ValueError("NaN and Infinity are not JSON values")
    return data


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False
