"""A bound on how long a connection may take to send a request's head (the request line and
headers): past `header_read_timeout_s` the supervisor closes it (docs/design.md, Threat model:
The owned side).

uvicorn arms no timer before a request's head is complete: its keep-alive timer starts only
after a response, so a client that opens a connection and sends half a head (no token needed)
holds a socket and a file descriptor for as long as it likes. None of the ways out it offers
bound that: `limit_concurrency` answers 503 only once a head is complete, and a connection cap
(`--limit-max-requests` is per worker lifetime, a backlog is about accepting) would let a
half-sent flood lock operators out instead of closing the flood. Other ASGI servers
(hypercorn, granian) have a header-read timeout but would replace the server the supervisor
was measured on (httptools: 870-970 steps/s against h11's 665, pyproject.toml). So this is
uvicorn's httptools protocol with one timer more: armed when a connection is made, and again
whenever bytes arrive between requests, disarmed when the head is complete. Measured with
tests/test_head_timeout_live.py: 300 half-sent connections are all closed within the bound
while an operator's reads are served throughout.

A request's body, and the reply, are not bounded here: both belong to a request already
authenticated, read by the app (`max_body_bytes`, the routes' own waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadTimeouts(Collector):
    """How many connections were closed for want of a head: a Prometheus collector."""

    def __init__(self) -> None:
        self.closed = 0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "tether_http_head_timeouts_total",
            "Connections closed: no complete request head within header_read_timeout_s.",
            value=self.closed,
        )


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that closes a connection whose request head is not complete
    `head_timeout_s` after the connection was made or its next request's first byte arrived."""

    head_timeout_s: float = 5.0
    tally: HeadTimeouts = HeadTimeouts()
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:  # between requests: a new head
            self._arm()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.tally.closed += 1
            self.transport.close()


def head_timeout_protocol(timeout_s: float, tally: HeadTimeouts) -> type[HeadTimeoutProtocol]:
    """The protocol class for uvicorn's `http` setting: closes after `timeout_s`, counted in
    `tally`."""
    return type(
        "HeadTimeoutProtocol", (HeadTimeoutProtocol,), {"head_timeout_s": timeout_s, "tally": tally}
    )
