"""The v1 wire protocol's rules: hashing, error codes and what each code means to both sides.

Hashes are sha256 over canonical JSON (sorted keys, no insignificant whitespace, UTF-8), so a
runner and the supervisor compute the same `payload_hash` for the same payload on any machine.
The messages themselves are the records of `tether.wire.records`, read and written by
`tether.wire.codec`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

API_PREFIX: Final = "/v1"
# Results one `POST /v1/steps/results` may carry (a runner sends what is ready at once).
RESULTS_PER_REQUEST_MAX: Final = 64


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


def plan_document(
    steps: Iterable[Mapping[str, Any]], verify: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a plan is, for hashing: each step's name, kind and payload, in order, and the
    verifier the task names (`{"pool"}`), when it names one. Any other key a client sends
    along with a step is not part of the plan."""
    document: dict[str, Any] = {
        "steps": [
            {"name": s.get("name"), "kind": s.get("kind"), "payload": s.get("payload")}
            for s in steps
        ]
    }
    if verify is not None:
        document["verify"] = {"pool": verify.get("pool")}
    return document


def plan_hash(steps: Iterable[Mapping[str, Any]], verify: Mapping[str, Any] | None = None) -> str:
    """The `plan_hash` an approval must name: the supervisor's and the operator's are equal."""
    return content_hash(plan_document(steps, verify))


def effect_key(step_id: str, payload_hash: str) -> str:
    """The identity of a step's one effect: sha256 over the canonical pair."""
    return sha256_hex(canonical_json([step_id, payload_hash]))


class ErrorCode(enum.StrEnum):
    """Stable codes of `{"error": CODE, "detail": TEXT}` bodies."""

    BAD_REQUEST = "bad_request"
    MALFORMED_JSON = "malformed_json"
    INVALID_FIELD = "invalid_field"
    BODY_TOO_LARGE = "body_too_large"
    QUOTA_EXCEEDED = "quota_exceeded"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    PLAN_MISMATCH = "plan_mismatch"
    INVALID_TRANSITION = "invalid_transition"
    TERMINAL = "terminal"
    STALE_FENCE = "stale_fence"
    STALE_BASE = "stale_base"
    PAYLOAD_DRIFT = "payload_drift"
    DIGEST_MISMATCH = "digest_mismatch"
    GATE_MISMATCH = "gate_mismatch"
    EFFECT_NOT_HELD = "effect_not_held"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class RunnerAction(enum.StrEnum):
    """What a runner does with an error response; each is one of the runner's exceptions."""

    RETRY = "retry"  # SupervisorUnreachable: back off and send it again
    STOP = "stop"  # TokenRejected: the token is wrong or revoked; stop claiming
    DROP = "drop"  # LeaseLost: the step is no longer ours; report nothing more about it
    REFUSED = "refused"  # SupervisorRefused: it will never be accepted as sent


@dataclasses.dataclass(frozen=True)
class Meaning:
    """An error code's HTTP status, and what a runner does when it hears it."""

    status: int
    runner: RunnerAction


_R = RunnerAction
ERRORS: Final[Mapping[ErrorCode, Meaning]] = MappingProxyType(
    {
        ErrorCode.BAD_REQUEST: Meaning(400, _R.REFUSED),
        ErrorCode.MALFORMED_JSON: Meaning(400, _R.REFUSED),
        ErrorCode.INVALID_FIELD: Meaning(422, _R.REFUSED),
        ErrorCode.BODY_TOO_LARGE: Meaning(413, _R.REFUSED),
        ErrorCode.QUOTA_EXCEEDED: Meaning(413, _R.REFUSED),
        ErrorCode.UNAUTHORIZED: Meaning(401, _R.STOP),
        ErrorCode.FORBIDDEN: Meaning(403, _R.STOP),
        ErrorCode.NOT_FOUND: Meaning(404, _R.DROP),
        ErrorCode.METHOD_NOT_ALLOWED: Meaning(405, _R.REFUSED),
        ErrorCode.IDEMPOTENCY_CONFLICT: Meaning(409, _R.REFUSED),
        ErrorCode.PLAN_MISMATCH: Meaning(409, _R.REFUSED),
        ErrorCode.INVALID_TRANSITION: Meaning(409, _R.REFUSED),
        ErrorCode.TERMINAL: Meaning(409, _R.DROP),
        ErrorCode.STALE_FENCE: Meaning(409, _R.DROP),
        ErrorCode.STALE_BASE: Meaning(409, _R.REFUSED),
        ErrorCode.PAYLOAD_DRIFT: Meaning(409, _R.DROP),
        ErrorCode.DIGEST_MISMATCH: Meaning(422, _R.REFUSED),
        ErrorCode.GATE_MISMATCH: Meaning(409, _R.REFUSED),
        ErrorCode.EFFECT_NOT_HELD: Meaning(409, _R.DROP),
        ErrorCode.UNAVAILABLE: Meaning(503, _R.RETRY),
        ErrorCode.INTERNAL: Meaning(500, _R.RETRY),
    }
)
_BY_CODE: Final = {str(code): meaning for code, meaning in ERRORS.items()}


def runner_action(status: int, code: str) -> RunnerAction:
    """What a runner does with an error response of `status` carrying `code`.

    A code from the table is read from it. A response that is not the supervisor's (a proxy's
    502, a code this runner does not know) is read from its status alone, the same way.
    """
    meaning = _BY_CODE.get(code)
    if meaning is not None and meaning.status == status:
        return meaning.runner
    if status in (401, 403):
        return RunnerAction.STOP
    if status >= 500 or status in (408, 429):
        return RunnerAction.RETRY
    if status == 404:
        return RunnerAction.DROP
    return RunnerAction.REFUSED


class ReleaseReason(enum.StrEnum):
    """Why a runner hands a lease back (docs/design.md, Fencing and leases)."""

    SHUTDOWN = "shutdown"
    OPERATOR = "operator"  # rejected key, exhausted quota: not counted toward max_attempts
    PREEMPTED = "preempted"  # the cloud reclaims the server: not counted either
    TRANSIENT = "transient"
    INVALID = "invalid"


class Outcome(enum.StrEnum):
    APPLIED = "applied"
    REPLAYED = "replayed"
