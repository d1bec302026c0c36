"""Helpers for the status page's tests (tests/test_ui_*.py): a signed-in browser session over
httpx, the strict HTML5 parser every page must pass, and an idle stand-in for the effects
dispatcher."""

from __future__ import annotations

import re
from typing import Any

import anyio
import html5lib  # type: ignore[import-untyped]  # no stubs; tests only
import httpx

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


def strict(page: str) -> None:
    """Parse `page` as a whole document; html5lib raises at its first parse error."""
    html5lib.HTMLParser(strict=True).parse(page)


def strict_fragment(part: str) -> None:
    html5lib.HTMLParser(strict=True).parseFragment(part)


def csrf_of(page: str) -> str:
    found = _CSRF.search(page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    """Post the login form as a browser would (same origin); answer the response."""
    return await client.post(
        "/ui/login",
        data={"token": secret},
        headers={"Origin": str(client.base_url).rstrip("/")},
    )


class IdleDispatcher:
    """Stands in for the supervisor's dispatcher where a test drives deliveries through the
    ledger's effects methods by hand: nothing may reach the network."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def run(self) -> None:
        await anyio.sleep_forever()
