"""The two kinds of clock tether reads, one name each.

`WallClock` is the supervisor's: seconds since the epoch, trusted, stored in lease deadlines and
events so that they outlive a restart. `MonotonicClock` is the runner's: the borrowed server's
wall clock is not comparable to the supervisor's (docs/design.md, Borrowed servers), so the
runner measures only durations, on a clock where only differences mean anything. Tests inject
either to move time by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import anyio

WallClock = Callable[[], float]
"""Seconds since the epoch, e.g. `time.time`."""


class MonotonicClock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time (at once when `seconds` <= 0)."""
        ...


class LoopClock:
    """anyio's event-loop clock: a `MonotonicClock` unaffected by wall-clock jumps."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))
