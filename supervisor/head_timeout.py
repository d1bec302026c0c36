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
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:  # the api package imports this module when its app is made
    from tether.supervisor.api.refusal_log import RefusalLog


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


class _RefusalLines(logging.LoggerAdapter[logging.Logger]):
    """uvicorn's connection logger, whose warnings (a malformed request, an unsupported
    upgrade: anyone can send one without a token) obey the refusal log's per-address limit."""

    def __init__(self, logger: logging.Logger, refusals: RefusalLog, client: str | None) -> None:
        super().__init__(logger)
        self._refusals = refusals
        self._client = client

    @property
    def level(self) -> int:  # uvicorn reads its logger's level before a trace line
        return self.logger.level

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if self._refusals.may_log(self._client):
            self.logger.warning(msg, *args, **kwargs)


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that closes a connection whose request head is not complete
    `head_timeout_s` after the connection was made or its next request's first byte arrived,
    and logs the malformed requests of one client address at most `refusal_log.PER_SECOND` a
    second (the rest counted with the refused tokens)."""

    head_timeout_s: float = 5.0
    tally: HeadTimeouts = HeadTimeouts()
    refusals: RefusalLog  # given by `head_timeout_protocol`
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        client = self.client[0] if self.client else None
        self.logger = _RefusalLines(self.logger, self.refusals, client)  # type: ignore[assignment]
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


def head_timeout_protocol(
    timeout_s: float, tally: HeadTimeouts, refusals: RefusalLog
) -> type[HeadTimeoutProtocol]:
    """The protocol class for uvicorn's `http` setting: closes after `timeout_s`, counted in
    `tally`; malformed requests' lines limited by `refusals`."""
    return type(
        "HeadTimeoutProtocol",
        (HeadTimeoutProtocol,),
        {"head_timeout_s": timeout_s, "tally": tally, "refusals": refusals},
    )
