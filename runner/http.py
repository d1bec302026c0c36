"""The runner's `httpx.AsyncClient`s: keep no cookies, and keep connection pools small.

The runner authenticates with bearer tokens and needs no cookies, and the standard library's
cookie jar reads the wall clock on every answer (`http.cookiejar` stamps `time.time()`), which
the runner never does (docs/design.md, Borrowed servers). So its clients carry a jar that refuses to store anything.
"""

from __future__ import annotations

import http.cookiejar
import itertools
import os
import urllib.request
from collections.abc import Callable
from typing import Any

import httpx


class NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that stores nothing and so never looks at the clock."""

    def extract_cookies(self, response: Any, request: urllib.request.Request) -> None:
        return None

    def add_cookie_header(self, request: urllib.request.Request) -> None:
        return None


def make_client(
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    base_url: str = "",
    timeout: float = 10.0,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        transport=transport,
        timeout=timeout,
        cookies=NoCookies(),
        headers={"User-Agent": "tether-runner"},
        follow_redirects=False,
    )


CONNECTIONS_PER_POOL = 4
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


class ShardedPools(httpx.AsyncBaseTransport):
    """Requests spread round-robin over several small connection pools.

    httpcore looks at every idle connection of a pool (its peer name, whether it is readable)
    on every request, so one pool shared by many concurrent steps costs time in proportion to
    its size on each call. Pools of a few connections each keep that check short.
    """

    def __init__(
        self, shards: int, make_pool: Callable[[], httpx.AsyncBaseTransport] | None = None
    ) -> None:
        if make_pool is None:
            context = httpx.create_ssl_context()  # one, shared: building one is not cheap
            make_pool = lambda: httpx.AsyncHTTPTransport(verify=context)  # noqa: E731
        self._pools = [make_pool() for _ in range(max(1, shards))]
        self._turn = itertools.cycle(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._turn).handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


def pooled_transport(concurrency: int) -> httpx.AsyncBaseTransport | None:
    """The transport for `concurrency` steps at once, or None for httpx's own when the
    environment names a proxy (only httpx's default transport applies those)."""
    if any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES):
        return None
    return ShardedPools(-(-concurrency // CONNECTIONS_PER_POOL))
