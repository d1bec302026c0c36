"""The runner's `httpx.AsyncClient`s: keep no cookies, keep connection pools small, and let
go of an idle connection before the server does.
"""

from __future__ import annotations

import http.cookiejar
import itertools
import os
import urllib.request
from collections.abc import Callable
from typing import Any

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
    return httpx.AsyncClient(
        base_url=base_url,
        transport=transport,
        timeout=timeout,
        limits=httpx.Limits(keepalive_expiry=keepalive_expiry_s),
        cookies=NoCookies(),
        headers={"User-Agent": "tether-runner"},
        follow_redirects=False,
        trust_env=trust_env,
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
        self,
        shards: int,
        make_pool: Callable[[], httpx.AsyncBaseTransport] | None = None,
        *,
        keepalive_expiry_s: float = MODEL_KEEPALIVE_EXPIRY_S,
    ) -> None:
        if make_pool is None:
            context = httpx.create_ssl_context()  # one, shared: building one is not cheap
            limits = httpx.Limits(keepalive_expiry=keepalive_expiry_s)
            make_pool = lambda: httpx.AsyncHTTPTransport(verify=context, limits=limits)  # noqa: E731
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
