"""Refused requests' log lines, at most `PER_SECOND` a second per client address: a client
sending bad tokens needs no token of its own, and one line per refusal would let it fill the
disk (docs/design.md, Threat model: The owned side). The rest are counted, never dropped
silently: `tether_auth_refusals_suppressed_total` in /metrics.

Counts are kept for the current second only, for at most `CLIENTS` addresses: a client beyond
them in one second has its refusals counted, not logged, so a flood from many addresses
writes a bounded number of lines too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

PER_SECOND: Final = 5
CLIENTS: Final = 1_000


class RefusalLog(Collector):
    """Whether each refusal may be logged now; a Prometheus collector of those that were not."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._second = -1
        self._logged: dict[str | None, int] = {}
        self.suppressed = 0

    def may_log(self, client: str | None) -> bool:
        """True for the first `PER_SECOND` refusals of `client` in this second; else counted."""
        second = int(self._clock())
        if second != self._second:
            self._second = second
            self._logged.clear()
        logged = self._logged.get(client)
        if logged is None and len(self._logged) >= CLIENTS:
            logged = PER_SECOND
        if logged is not None and logged >= PER_SECOND:
            self.suppressed += 1
            return False
        self._logged[client] = (logged or 0) + 1
        return True

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "tether_auth_refusals_suppressed_total",
            f"Refused requests not logged: past {PER_SECOND} a second from one client address.",
            value=self.suppressed,
        )
