"""The runner's only sense of time: anyio's monotonic clock, behind a small port.

The borrowed server's wall clock is not comparable to the supervisor's (SPEC A3), so nothing in
the runner reads it: leases are measured as durations on this clock. Tests inject another
`Clock` to jump time forward or to record sleeps instead of waiting.
"""

from __future__ import annotations

from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time (at once when `seconds` <= 0)."""
        ...


class MonotonicClock:
    """anyio's event-loop clock: monotonic, unaffected by wall-clock jumps."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))
