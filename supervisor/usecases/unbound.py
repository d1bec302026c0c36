"""Which granted steps belong to a task without a repository, remembered at claim, so that
their results skip the binding read (docs/design.md, Repositories and candidates).

A report of a repository-bound task's step needs evidence, and only the ledger knows a step's
task: without this, every result, a chat step's too, would pay one read of the ledger (a
worker-thread hop, about as much as the rest of an in-process result) before its write. A
lease already says whether its task has a repository; what it says never changes (a task's
repository is fixed at creation), so remembering it is always right, and a step not
remembered (granted before a restart, or pushed out) is simply read.
"""

from __future__ import annotations

from collections.abc import Iterable

from cachetools import LRUCache

from tether.wire.records import Lease

# Far more than the steps in flight at once; past it the oldest go, and cost a read again.
REMEMBERED = 100_000


class UnboundSteps:
    """The ids of steps this process granted whose task names no repository."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self._ids: LRUCache[str, bool] = LRUCache(maxsize=size)

    def granted(self, leases: Iterable[Lease]) -> None:
        for lease in leases:
            if lease.repository is None:
                self._ids[lease.step_id] = True

    def take(self, step_id: str) -> bool:
        """Whether `step_id` was granted unbound; forgotten here (a step reports once)."""
        return self._ids.pop(step_id, False)
