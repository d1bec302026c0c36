"""The built-in `http` effect kind: one HTTP request per attempt, with `Idempotency-Key`
(docs/design.md, Effects).

The rendered request is `{"method", "url", "headers", "body", ...}` (`outbox_render.render_request`:
the URL filled by position, header values checked); header values may still hold
`{{ credential.<name> }}` placeholders (tether/wire/templates.py), replaced here at send time
by the credential's value (never stored, never logged; masked in the answer kept,
`credentials.mask`). Every try carries `Idempotency-Key: <effect_key>`, replacing any header
of that name the plan set. Redirects are not followed, no proxy is used (the client is made
with `trust_env=False`: the address checked must be the one connected to), and the request
goes to the one address `addresses.checked_address` resolved and allowed, the URL's name kept
as `Host` and as the TLS server name.

How an answer is classified:

    2xx                                Delivered (replayed when `Idempotent-Replayed: true`)
    408, 429, 5xx                      Unanswered(sent=True), RetryLater when `Retry-After`
    any other status (3xx, 4xx)        Undeliverable `receiver_refused`
    no connection (connect error or    Unanswered(sent=False): nothing reached the receiver
      timeout, no pooled connection,
      a name not resolved)
    any other transport failure        Unanswered(sent=True): it may have been applied
    a destination not allowed          Undeliverable `destination_refused`, nothing sent
    a named credential missing         Undeliverable `credential_missing`, nothing sent
    a step placeholder left unfilled,  Undeliverable `effect_render_failed`, nothing sent
      a header value HTTP cannot carry
      (a credential's line break), a
      request the client cannot build

The answer's detail is `HTTP <status>: <body>`, the body masked and cut to 2 KiB.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any, Final

import httpx

from tether.clocks import WallClock
from tether.git import redact
from tether.supervisor.effects.addresses import (
    DestinationRefused,
    NotResolved,
    Resolver,
    checked_address,
    system_resolver,
)
from tether.supervisor.effects.credentials import CredentialMissing, Credentials, mask
from tether.supervisor.effects.registry import RetryLater
from tether.supervisor.ledger.destinations import (
    PUBLIC_HOSTS,
    Destinations,
    HostRefused,
    http_destination,
)
from tether.supervisor.ledger.outbox import Answer, Delivered, Outgoing, Unanswered, Undeliverable
from tether.wire.templates import TemplateError, fill_credentials, header_value_problem

KEY_HEADER: Final = "Idempotency-Key"
REPLAYED_HEADER: Final = "Idempotent-Replayed"
EXCERPT_BYTES: Final = 2048
_READ_AT_MOST: Final = 64 * 1024  # of a receiver's body, before masking and cutting
# One try: 10 s to connect, 20 s for each read or write. Kept well below the dispatcher's
# bound on an attempt (half the hold), so that httpx, not that bound, classifies a timeout.
TIMEOUT: Final = httpx.Timeout(20.0, connect=10.0)
RETRYABLE: Final = frozenset({408, 429})


class HttpDeliverer:
    """Delivers `http` effects through one shared `httpx.AsyncClient` (made without keep-alive
    and without the environment's proxies: `service.effects_client`), to the destinations
    `destinations` allows, resolved by `resolver`."""

    kind = "http"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        clock: WallClock = time.time,
        destinations: Destinations | None = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        self.client = client
        self.clock = clock
        self.destinations = destinations or PUBLIC_HOSTS
        self.resolver = resolver

    async def deliver(self, out: Outgoing, secrets: Credentials) -> Answer:
        request = out.request
        try:
            url = httpx.URL(str(request["url"]))
            host, port = http_destination(str(request["url"]))
        except HostRefused as exc:
            return Undeliverable(status=None, detail=str(exc), code="destination_refused")
        except (httpx.InvalidURL, ValueError) as exc:
            return Undeliverable(
                status=None, detail=f"bad URL: {redact(str(exc))}", code="invalid_url"
            )
        try:
            headers, used = resolve_headers(request.get("headers") or {}, secrets)
        except CredentialMissing as exc:
            return Undeliverable(status=None, detail=str(exc), code="credential_missing")
        except TemplateError as exc:
            return Undeliverable(status=None, detail=str(exc), code="effect_render_failed")
        headers[KEY_HEADER] = out.effect_key
        try:
            address = await checked_address(
                self.destinations, out.tenant, host, port, self.resolver
            )
        except DestinationRefused as exc:
            return Undeliverable(status=None, detail=str(exc), code="destination_refused")
        except NotResolved as exc:
            return Unanswered(detail=f"not connected: {exc}", sent=False)
        extensions: dict[str, str] = {}
        if host.address is None:  # a name: connect to its checked address, name kept
            headers["Host"] = url.netloc.decode("ascii")
            if url.scheme == "https":
                extensions["sni_hostname"] = str(host.name)
            url = url.copy_with(host=str(address))
        body = request.get("body")
        try:  # nothing has left yet: a request that cannot be built was never sent
            built = self.client.build_request(
                str(request.get("method", "POST")).upper(),
                url,
                headers=headers,
                json=body,
                timeout=TIMEOUT,
                extensions=extensions,
            )
        except (httpx.HTTPError, ValueError, TypeError) as exc:
            detail = f"the request cannot be built: {_name(exc, used)}"
            return Undeliverable(status=None, detail=detail, code="effect_render_failed")
        try:
            response = await self.client.send(built, stream=True, follow_redirects=False)
            try:
                text = await _excerpt(response, used)
            finally:
                await response.aclose()
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return Unanswered(detail=f"not connected: {_name(exc, used)}", sent=False)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            return Undeliverable(
                status=None, detail=f"bad URL: {_name(exc, used)}", code="invalid_url"
            )
        except httpx.HTTPError as exc:
            return Unanswered(detail=f"no answer: {_name(exc, used)}", sent=True)
        return self.classify(response, text)

    def classify(self, response: httpx.Response, text: str) -> Answer:
        status = response.status_code
        detail = f"HTTP {status}: {text}" if text else f"HTTP {status}"
        if 200 <= status < 300:
            replayed = response.headers.get(REPLAYED_HEADER, "").strip().lower() == "true"
            return Delivered(status=status, detail=detail, replayed=replayed)
        if status in RETRYABLE or status >= 500:
            after = retry_after(response.headers.get("Retry-After"), self.clock())
            if after is not None:
                return RetryLater(detail=detail, sent=True, status=status, retry_after_s=after)
            return Unanswered(detail=detail, sent=True, status=status)
        return Undeliverable(status=status, detail=detail, code="receiver_refused")


def resolve_headers(
    headers: Mapping[str, Any], secrets: Credentials
) -> tuple[dict[str, str], set[str]]:
    """The header values with credential placeholders replaced, and the values used (to mask);
    `TemplateError` for a value HTTP cannot carry once filled (a credential's line break).
    A header the plan named `Idempotency-Key` is dropped: the effect key replaces it."""
    used: set[str] = set()

    def value_of(name: str) -> str:
        value = secrets.read(name)
        used.add(value)
        return value

    resolved: dict[str, str] = {}
    for name, value in headers.items():
        if name.lower() != KEY_HEADER.lower():
            resolved[str(name)] = filled = fill_credentials(str(value), value_of)
            if header_value_problem(filled) is not None:  # not said which: it is a secret's
                raise TemplateError(
                    f"request: header {name}: with its credentials filled in, the value holds"
                    " a line break, a control character or a non-ASCII letter, which an HTTP"
                    " header value may not"
                )
    return resolved, used


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


async def _excerpt(response: httpx.Response, secrets: set[str]) -> str:
    """The start of the response's body, decoded, masked and cut to `EXCERPT_BYTES`."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= _READ_AT_MOST:
            break
    text = mask(data.decode("utf-8", errors="replace"), secrets)
    cut = text.encode("utf-8")[:EXCERPT_BYTES]
    return cut.decode("utf-8", errors="ignore").strip()


def _name(exc: Exception, secrets: set[str]) -> str:
    """An exception's type and message (httpx's name no header or body; a URL's user and
    password are masked all the same)."""
    message = mask(redact(str(exc)), secrets).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
