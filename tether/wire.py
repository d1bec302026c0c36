"""The v1 wire protocol: hashing rules, error codes and the shapes both sides exchange.

Hashes are sha256 over canonical JSON (sorted keys, no insignificant whitespace, UTF-8), so a
runner and the supervisor compute the same `payload_hash` for the same payload on any machine.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
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


def plan_document(steps: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a plan is, for hashing: each step's name, kind and payload, in order. Any other key
    a client sends along with a step is not part of the plan."""
    return {
        "steps": [{"name": s.get("name"), "kind": s.get("kind"), "payload": s.get("payload")}
                  for s in steps]
    }  # fmt: skip


def plan_hash(steps: Iterable[Mapping[str, Any]]) -> str:
    """The `plan_hash` an approval must name: the supervisor's and the operator's are equal."""
    return content_hash(plan_document(steps))


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


class WireError(ValueError):
    """A message does not have the shape this protocol version gives it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EarlierOutput:
    """A committed output of an earlier step of the same task, carried by a lease."""

    step_id: str
    name: str
    output: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lease:
    """A lease as it crosses the wire (SPEC §5): the supervisor grants it, the runner holds it.

    `ttl_s` and `renew_every_s` are durations, never deadlines: the runner measures them on its
    own monotonic clock (A3).
    """

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
    outputs: tuple[EarlierOutput, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"outputs": [dataclasses.asdict(o) for o in self.outputs]}

    @classmethod
    def fields_from_wire(cls, raw: Any) -> dict[str, Any]:
        """The checked fields of one lease of a claim answer; `WireError` names a bad one."""
        if not isinstance(raw, dict):
            raise WireError("a lease must be a JSON object")
        if "payload" not in raw:
            raise WireError("lease field 'payload' is missing")
        fields: dict[str, Any] = {"payload": raw["payload"]}
        for name, kind in _LEASE_FIELDS.items():
            value = raw.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise WireError(f"lease field {name!r} is missing or mistyped")
            fields[name] = (
                float(value) if isinstance(value, int | float) and name.endswith("_s") else value
            )
        if not 0 < fields["renew_every_s"] <= fields["ttl_s"]:
            raise WireError("lease needs 0 < renew_every_s <= ttl_s")
        outputs = []
        for item in raw.get("outputs") or []:
            if not isinstance(item, dict):
                raise WireError("lease outputs must be objects")
            outputs.append(
                EarlierOutput(
                    step_id=str(item.get("step_id", "")),
                    name=str(item.get("name", "")),
                    output=item.get("output"),
                )
            )
        fields["outputs"] = tuple(outputs)
        return fields


_LEASE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "step_id": str,
    "task_id": str,
    "name": str,
    "kind": str,
    "attempt": int,
    "fence": int,
    "payload_hash": str,
    "ttl_s": (int, float),
    "renew_every_s": (int, float),
}
