"""Reading a provider's `Retry-After`, a tenacity wait and stop built on it, and the runner's
way into a tenacity loop (`first_then_retrying`).

A date is turned into seconds against the same reply's own `Date` header, never against this
machine's wall clock (docs/design.md, Borrowed servers); without a `Date` header a date is
ignored and the ordinary backoff applies.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from tether.clocks import MonotonicClock

T = TypeVar("T")

# A provider asking for more than this is treated as asking for this much.
MAX_RETRY_AFTER_S = 3600.0


def _seconds(raw: str, unit_s: float = 1.0) -> float | None:
    """`raw` (a number of `unit_s`) in seconds, at most `MAX_RETRY_AFTER_S`; None if unusable."""
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(value * unit_s, MAX_RETRY_AFTER_S)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the provider asks us to wait, or None when it did not say (usably)."""
    if (ms := headers.get("retry-after-ms")) is not None:
        seconds = _seconds(ms.strip(), unit_s=0.001)
        if seconds is not None:
            return seconds
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    if (seconds := _seconds(raw)) is not None:
        return seconds
    date = headers.get("date")
    if date is None:
        return None
    try:
        then = email.utils.parsedate_to_datetime(raw)
        now = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    if then.tzinfo is None or now.tzinfo is None:
        return None
    return min(max(0.0, (then - now).total_seconds()), MAX_RETRY_AFTER_S)


class HasRetryAfter(Exception):
    """An exception that may carry the provider's requested wait."""

    retry_after_s: float | None = None


class wait_retry_after(wait_base):
    """Wait what the failed reply's `Retry-After` asked for, else `fallback`."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        if isinstance(exc, HasRetryAfter) and exc.retry_after_s is not None:
            return exc.retry_after_s
        return float(self.fallback(retry_state))


class stop_before_deadline(stop_base):
    """Stop when sleeping the upcoming wait would reach `deadline` on `clock`."""

    def __init__(self, clock: MonotonicClock, deadline: float) -> None:
        self.clock = clock
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.clock.now() + retry_state.upcoming_sleep >= self.deadline


async def first_then_retrying(
    call: Callable[[], Awaitable[T]],
    retryable: type[Exception],
    retrying: Callable[[], AsyncRetrying],
) -> T:
    """`call()`, and only if it raises `retryable` the tenacity loop `retrying()` builds, that
    first failure handed to the loop as its first attempt: waits, attempt numbers and stops
    are what the loop alone gives, provided its stop reads the runner's clock (a deadline,
    `stop_never`), never tenacity's time since its start. Building the loop for every call
    cost a runner about 2-3 % of its CPU per step (issue 28), and calls nearly always
    succeed at once."""
    try:
        return await call()
    except retryable as exc:
        first: Exception | None = exc
    async for attempt in retrying():
        with attempt:
            if first is not None:
                failed, first = first, None
                raise failed
            return await call()
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover
