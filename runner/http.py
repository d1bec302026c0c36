"""The runner's `httpx.AsyncClient`s: keep no cookies, keep connection pools small, and let
go of an idle connection before the server does.
"""

from __future__ import annotations

import http.cookiejar
import itertools
import os
import ssl
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import httpcore
import httpx

# A server closes a keep-alive connection that stayed idle past its own timeout, and a request
# sent on it at that moment (the close still on the wire) gets no reply: the runner used to log
# `renew got no answer; retrying` with `ReadError: ` while the supervisor was healthy, because
# uvicorn's timeout and httpx's idle expiry were both 5 s. So the client drops an idle
# connection well before the server would. To the supervisor: below its `TIMEOUT_KEEP_ALIVE_S`
# (30 s, `supervisor/server.py`; a reverse proxy in front must keep idle connections at least
# as long), and above the renew interval (10 s by default), so that renewals reuse their
# connection. To the model: below the 5 s that uvicorn-based OpenAI-compatible servers keep.
SUPERVISOR_KEEPALIVE_EXPIRY_S = 20.0
MODEL_KEEPALIVE_EXPIRY_S = 4.0


class NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that stores nothing and so never looks at the clock.

    The runner authenticates with bearer tokens and needs no cookies, and the standard
    library's jar stamps `time.time()` on every response, a wall-clock read the runner never
    makes (docs/design.md, Borrowed servers).
    """

    def extract_cookies(self, response: Any, request: urllib.request.Request) -> None:
        return None

    def add_cookie_header(self, request: urllib.request.Request) -> None:
        return None


class DroppedCookies(httpx.Cookies):
    """httpx's cookies over a `NoCookies` jar, which also skip reading an answer's cookies.

    httpx hands every answer to its cookies, building a `urllib` request and response for the
    jar first (3 % of a runner's CPU per step at 64, issue 28), only for `NoCookies` to drop
    them.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class RunnerClient(httpx.AsyncClient):
    """`httpx.AsyncClient` whose cookies are `DroppedCookies`: none stored, none read."""

    _dropped = DroppedCookies(NoCookies())

    @property
    def cookies(self) -> httpx.Cookies:
        return self._dropped

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        raise TypeError("the runner's HTTP clients keep no cookies")


def make_client(
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    base_url: str = "",
    timeout: float = 10.0,
    keepalive_expiry_s: float = MODEL_KEEPALIVE_EXPIRY_S,
    trust_env: bool = True,
) -> httpx.AsyncClient:
    """A client without cookies; `keepalive_expiry_s` applies to httpx's own transport, used
    when `transport` is None (a `pooled_transport` sets its own). `trust_env=False` ignores
    the proxies the environment names."""
    return RunnerClient(
        base_url=base_url,
        transport=transport,
        timeout=timeout,
        limits=httpx.Limits(keepalive_expiry=keepalive_expiry_s),
        headers={"User-Agent": "tether-runner"},
        follow_redirects=False,
        trust_env=trust_env,
    )


# Two, not four: httpcore's check of each idle connection is most of a request's cost in a pool
# (issue 28: at 32 concurrent requests, 904 -> 680 us of CPU per request; one a pool read 642,
# within the noise of two, and would open more connections whenever a pool's one is busy).
CONNECTIONS_PER_POOL = 2
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


class ShardedPools(httpx.AsyncBaseTransport):
    """Requests spread round-robin over several small connection pools.

    httpcore looks at every idle connection of a pool (its peer name, whether it is readable)
    on every request, so one pool shared by many concurrent steps costs time in proportion to
    its size on each call. Pools of a few connections each keep that check short.
    """

    def __init__(
        self,
        shards: int,
        make_pool: Callable[[], httpx.AsyncBaseTransport] | None = None,
        *,
        keepalive_expiry_s: float = MODEL_KEEPALIVE_EXPIRY_S,
    ) -> None:
        if make_pool is None:
            context = httpx.create_ssl_context()  # one, shared: building one is not cheap
            limits = httpx.Limits(keepalive_expiry=keepalive_expiry_s)
            make_pool = lambda: one_write_requests(  # noqa: E731
                httpx.AsyncHTTPTransport(verify=context, limits=limits)
            )
        self._pools = [make_pool() for _ in range(max(1, shards))]
        self._turn = itertools.cycle(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._turn).handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


def pooled_transport(
    concurrency: int, *, keepalive_expiry_s: float = MODEL_KEEPALIVE_EXPIRY_S
) -> httpx.AsyncBaseTransport | None:
    """The transport for `concurrency` steps at once, or None for httpx's own when the
    environment names a proxy (only httpx's default transport applies those)."""
    if any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES):
        return None
    shards = -(-concurrency // CONNECTIONS_PER_POOL)
    return ShardedPools(shards, keepalive_expiry_s=keepalive_expiry_s)


# A request's head and a body of up to this many bytes go out in one write; a larger body is
# sent as httpcore writes it, not copied.
JOINED_BODY_MAX = 64 * 1024


class OneWriteStream(httpcore.AsyncNetworkStream):
    """A connection that holds each write back until the next write or read, and sends a held
    write together with the write that follows it.

    httpcore writes an HTTP/1.1 request's head and its body separately, two sends and so two
    TCP segments, and the server wakes up for each. Held and joined, a request with a body
    of up to `JOINED_BODY_MAX` bytes is one send: in `bench.ab` at 64 this cut the runner's
    CPU per step (see bench/README.md, issue 28). The connection always reads the answer
    after writing the request, so a held write never waits for anything but the next call.
    """

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._held = b""
        self._held_timeout: float | None = None

    async def _flush(self) -> None:
        if self._held:
            held, self._held = self._held, b""
            await self._stream.write(held, timeout=self._held_timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        if not self._held:
            self._held, self._held_timeout = buffer, timeout
        elif len(buffer) <= JOINED_BODY_MAX:
            held, self._held = self._held, b""
            await self._stream.write(held + buffer, timeout=timeout)
        else:
            await self._flush()
            await self._stream.write(buffer, timeout=timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        await self._flush()
        return await self._stream.read(max_bytes, timeout=timeout)

    async def aclose(self) -> None:
        self._held = b""
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        await self._flush()
        tls = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        return OneWriteStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class OneWriteBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, its connections `OneWriteStream`s."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return OneWriteStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return OneWriteStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def one_write_requests(transport: httpx.AsyncHTTPTransport) -> httpx.AsyncHTTPTransport:
    """`transport`, its connections `OneWriteStream`s.

    httpx's transport takes no network backend, so this sets its httpcore pool's
    (`_pool._network_backend`, private to both; tests/runner/test_http.py fails if either
    moves).
    """
    pool = transport._pool
    if isinstance(pool, httpcore.AsyncConnectionPool):
        pool._network_backend = OneWriteBackend(pool._network_backend)
    return transport
