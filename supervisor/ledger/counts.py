"""What a ledger has done since it opened, counted in memory for `/metrics` and the benchmarks.

Plain counts, no metrics library: the HTTP API turns them into Prometheus counters when it is
scraped (`supervisor/api/health.py`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from tether.wire import ErrorCode, Outcome


@dataclasses.dataclass(kw_only=True)
class LedgerCounts:
    leases_granted: int = 0
    leases_renewed: int = 0
    renewals_remembered: int = 0
    """Of those renewals, the ones answered from memory, without a write (`RenewalMemory`)."""
    leases_released: int = 0
    leases_preempted: int = 0
    """Of those released, the ones a runner gave back on its cloud's preemption notice."""
    leases_expired: int = 0
    commits: Counter[Outcome] = dataclasses.field(default_factory=Counter)
    """Step results accepted, by outcome."""
    rejections: Counter[ErrorCode] = dataclasses.field(default_factory=Counter)
    """Rules the ledger refused (stale fence, bad transition, ...), by error code."""
    batches: int = 0
    """Group-commit transactions."""
    batched_rules: int = 0
    """Rules run in those transactions."""
