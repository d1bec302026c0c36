"""A lease as the runner holds it: the supervisor's wire shape, checked and frozen.

`claim_answered_at` is when the claim answer arrived, on the runner's monotonic clock: the
lease was granted no later than that, so it cannot still be valid `ttl_s` after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runner.errors import SupervisorRefused


@dataclasses.dataclass(frozen=True, kw_only=True)
class EarlierOutput:
    step_id: str
    name: str
    output: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lease:
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
    outputs: tuple[EarlierOutput, ...]
    claim_answered_at: float

    def log_context(self) -> dict[str, Any]:
        """The fields every log line about this step carries."""
        return {
            "task_id": self.task_id,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "fence": self.fence,
        }


def _field(raw: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = raw.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise SupervisorRefused(200, "bad_lease", f"lease field {name!r} is missing or mistyped")
    return value


def parse_lease(raw: Any, *, answered_at: float) -> Lease:
    """Check one lease of a claim answer; `SupervisorRefused` names the bad field."""
    if not isinstance(raw, dict):
        raise SupervisorRefused(200, "bad_lease", "a lease must be a JSON object")
    if "payload" not in raw:
        raise SupervisorRefused(200, "bad_lease", "lease field 'payload' is missing")
    ttl_s = float(_field(raw, "ttl_s", (int, float)))
    renew_every_s = float(_field(raw, "renew_every_s", (int, float)))
    if not 0 < renew_every_s <= ttl_s:
        raise SupervisorRefused(200, "bad_lease", "lease needs 0 < renew_every_s <= ttl_s")
    outputs = []
    for item in raw.get("outputs") or []:
        if not isinstance(item, dict):
            raise SupervisorRefused(200, "bad_lease", "lease outputs must be objects")
        outputs.append(
            EarlierOutput(
                step_id=str(item.get("step_id", "")),
                name=str(item.get("name", "")),
                output=item.get("output"),
            )
        )
    return Lease(
        step_id=_field(raw, "step_id", str),
        task_id=_field(raw, "task_id", str),
        name=_field(raw, "name", str),
        kind=_field(raw, "kind", str),
        attempt=_field(raw, "attempt", int),
        fence=_field(raw, "fence", int),
        payload=raw["payload"],
        payload_hash=_field(raw, "payload_hash", str),
        ttl_s=ttl_s,
        renew_every_s=renew_every_s,
        outputs=tuple(outputs),
        claim_answered_at=answered_at,
    )
