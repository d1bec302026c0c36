"""The two kinds of clock tether reads, one name each.

`WallClock` is the supervisor's: seconds since the epoch, trusted, stored in lease deadlines and
events so that they outlive a restart. `MonotonicClock` is the runner's: the borrowed server's
wall clock is not comparable to the supervisor's (docs/design.md, Borrowed servers), so the
runner measures only durations, on a clock where only differences mean anything. Tests inject
either to move time by hand.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Protocol, overload

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


@overload
def iso(at: float) -> str: ...
@overload
def iso(at: None) -> None: ...
def iso(at: float | None) -> str | None:
    """A wall-clock time as every time in the API and the CLI is written: ISO 8601 in UTC to
    the millisecond, e.g. `2025-01-02T03:04:05.678Z`; None stays None."""
    if at is None:
        return None
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(text: str) -> float:
    """An `iso` time back as seconds since the epoch (for durations between two of them)."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} is not a UTC time")
    return moment.timestamp()
