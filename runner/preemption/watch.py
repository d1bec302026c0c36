"""The runner's watch for its cloud's preemption notice: poll the source every
`preemption_poll_s` and hand the first notice to the runner (docs/design.md, The runner).

A source that cannot be read (the metadata address unreachable, an answer in another shape,
a bug) never stops the runner: it is logged once, polled again with backoff doubling up to
`BACKOFF_MAX_S`, and logged once more when it answers again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import httpx
import structlog

from tether.clocks import MonotonicClock
from tether.runner.preemption.notice import Notice, NoticeUnreadable

log = structlog.get_logger("runner.preemption")

BACKOFF_MAX_S = 60.0


class NoticeSource(Protocol):
    """One provider's notice, asked for once: None while there is none."""

    provider: str

    async def poll(self) -> Notice | None: ...


class PreemptionWatch:
    """Polls `source` until it gives a notice, then calls `on_notice(notice, heard_at)`
    (`heard_at`: when the answer arrived, on the runner's monotonic clock) and ends."""

    def __init__(
        self,
        source: NoticeSource,
        *,
        poll_s: float,
        clock: MonotonicClock,
        on_notice: Callable[[Notice, float], None],
        where: str,
    ) -> None:
        self._source = source
        self._poll_s = poll_s
        self._clock = clock
        self._on_notice = on_notice
        self._where = where  # the address or path, for the log
        self.failing = False

    async def run(self) -> None:
        log.info(
            "watching for preemption notices",
            provider=self._source.provider,
            at=self._where,
            poll_s=self._poll_s,
        )
        wait_s = self._poll_s
        while True:
            try:
                notice = await self._source.poll()
            except (NoticeUnreadable, httpx.HTTPError, OSError) as exc:
                wait_s = self._unreadable(exc, wait_s, bug=False)
            except Exception as exc:  # a bug must not end the runner: it serves on
                wait_s = self._unreadable(exc, wait_s, bug=True)
            else:
                if self.failing:
                    self.failing = False
                    log.info("preemption notices readable again", provider=self._source.provider)
                wait_s = self._poll_s
                if notice is not None:
                    self._on_notice(notice, self._clock.now())
                    return
            await self._clock.sleep(wait_s)

    def _unreadable(self, exc: Exception, wait_s: float, *, bug: bool) -> float:
        """Log the first failure of a run of them; the next wait, doubled from the last."""
        if not self.failing:
            self.failing = True
            error = str(exc) or type(exc).__name__
            message = "preemption notices cannot be read; serving on, polling with backoff"
            if bug:
                log.exception(message, provider=self._source.provider, at=self._where)
            else:
                log.warning(message, provider=self._source.provider, at=self._where, error=error)
            return self._poll_s
        return min(2 * wait_s, max(BACKOFF_MAX_S, self._poll_s))
