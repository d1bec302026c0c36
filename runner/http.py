"""The runner's `httpx.AsyncClient`s: keep no cookies.

The runner authenticates with bearer tokens and needs no cookies, and the standard library's
cookie jar reads the wall clock on every answer (`http.cookiejar` stamps `time.time()`), which
the runner never does (SPEC A3). So its clients carry a jar that refuses to store anything.
"""

from __future__ import annotations

import http.cookiejar
import urllib.request
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
