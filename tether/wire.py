"""The v1 wire protocol: hashing rules, error codes and the shapes both sides exchange.

Hashes are sha256 over canonical JSON (sorted keys, no insignificant whitespace, UTF-8), so a
runner and the supervisor compute the same `payload_hash` for the same payload on any machine.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any, Final, NotRequired, TypedDict

API_PREFIX: Final = "/v1"


def canonical_json(value: Any) -> bytes:
    """Encode `value` the one way both sides hash it: sorted keys, compact, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(value: Any) -> str:
    """`plan_hash` of a plan, `payload_hash` of a step's payload."""
    return sha256_hex(canonical_json(value))


def effect_key(step_id: str, payload_hash: str) -> str:
    """The identity of a step's one effect: sha256 over the canonical pair."""
    return sha256_hex(canonical_json([step_id, payload_hash]))


class ErrorCode(enum.StrEnum):
    """Stable codes of `{"error": CODE, "detail": TEXT}` bodies."""

    BAD_REQUEST = "bad_request"
    MALFORMED_JSON = "malformed_json"
    INVALID_FIELD = "invalid_field"
    BODY_TOO_LARGE = "body_too_large"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    PLAN_MISMATCH = "plan_mismatch"
    INVALID_TRANSITION = "invalid_transition"
    TERMINAL = "terminal"
    STALE_FENCE = "stale_fence"
    PAYLOAD_DRIFT = "payload_drift"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ReleaseReason(enum.StrEnum):
    """Why a runner hands a lease back (SPEC §5)."""

    SHUTDOWN = "shutdown"
    OPERATOR = "operator"  # rejected key, exhausted quota: not counted toward max_attempts
    TRANSIENT = "transient"
    INVALID = "invalid"


class Outcome(enum.StrEnum):
    APPLIED = "applied"
    REPLAYED = "replayed"


class EarlierOutput(TypedDict):
    step_id: str
    name: str
    output: Any


class LeaseBody(TypedDict):
    step_id: str
    task_id: str
    name: str
    kind: str
    attempt: int
    fence: int
    payload: Any
    payload_hash: str
    ttl_s: float
    renew_every_s: float
    outputs: list[EarlierOutput]


class ClaimBody(TypedDict):
    leases: list[LeaseBody]


class RenewBody(TypedDict):
    ttl_s: float
    renew_every_s: float
    cancelled: bool


class ResultRequest(TypedDict):
    fence: int
    payload_hash: str
    output: Any
    usage: dict[str, int]
    candidate_sha: NotRequired[str | None]
    artifacts: NotRequired[dict[str, str]]


class ErrorBody(TypedDict):
    error: str
    detail: str
