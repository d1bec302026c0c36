"""A lease as the runner holds it: the supervisor's wire shape, checked and frozen.

`claim_answered_at` is when the claim answer arrived, on the runner's monotonic clock: the
lease was granted no later than that, so it cannot still be valid `ttl_s` after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runner.errors import SupervisorRefused
from tether import wire
from tether.wire import EarlierOutput

__all__ = ["EarlierOutput", "Lease", "parse_lease"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lease(wire.Lease):
    claim_answered_at: float

    def log_context(self) -> dict[str, Any]:
        """The fields every log line about this step carries."""
        return {
            "task_id": self.task_id,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "fence": self.fence,
        }


def parse_lease(raw: Any, *, answered_at: float) -> Lease:
    """Check one lease of a claim answer; `SupervisorRefused` names the bad field."""
    try:
        fields = wire.Lease.fields_from_wire(raw)
    except wire.WireError as exc:
        raise SupervisorRefused(200, "bad_lease", str(exc)) from None
    return Lease(**fields, claim_answered_at=answered_at)
