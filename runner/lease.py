"""A lease as the runner holds it: the contract's lease and when its claim reply arrived.

`claim_answered_at` is on the runner's monotonic clock: the lease was granted no later than
that, so it cannot still be valid `ttl_s` after it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tether.wire import records as messages
from tether.wire.records import EarlierOutput

__all__ = ["EarlierOutput", "Lease"]


class Lease(messages.Lease, frozen=True, kw_only=True):
    claim_answered_at: float

    @classmethod
    def held(cls, lease: messages.Lease, *, answered_at: float) -> Lease:
        """`lease`, as granted by a claim reply that arrived at `answered_at`."""
        return cls(**msgspec.structs.asdict(lease), claim_answered_at=answered_at)

    def log_context(self) -> dict[str, Any]:
        """The fields every log line about this step carries."""
        return {
            "task_id": self.task_id,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "fence": self.fence,
        }
