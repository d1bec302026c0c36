"""Who is signed in to the status page, and whether a write may go ahead.

The operator's token is posted once to the login form, checked with the API's own check
(`tether.supervisor.api.auth.require`) and exchanged for a session the ledger keeps
(`ledger/ui_sessions.py`): the cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure over https)
holds the session's id, never the token, and nothing puts either in a URL. Each request looks
the session up in the ledger: sign-out, its expiry (`ui_session_ttl_s`) and its token's
revocation end it at once. Every write carries a CSRF token, an HMAC of the cookie under a key
made when the process starts (a restart asks for a reload, never a new login), and is refused
when its Origin or Referer names another host.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.responses import Response

from tether.supervisor.api import requests as rq
from tether.supervisor.api.auth import require
from tether.supervisor.api.errors import ApiError
from tether.supervisor.ledger import LedgerStore, Principal, Role
from tether.wire import ErrorCode

COOKIE = "tether_ui"
PATH = "/ui"
FORM_FIELDS_MAX = 20
# Tokens are `tether_` and URL-safe base64; anything else cannot be one, and must not reach a
# header or a cookie.
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_\-.~+/=]{1,512}")
_KEY = secrets.token_bytes(32)


class SignedOut(Exception):
    """The request carries no session, or its token is no longer valid."""


class WriteRefused(Exception):
    """A write that fails the CSRF or origin check: refused before it reads anything."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def well_formed(secret: str) -> bool:
    return bool(_TOKEN_SHAPE.fullmatch(secret))


def _as_bearer(request: Request, secret: str) -> Request:
    """`request` as the API would see it with `secret` in its Authorization header."""
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"authorization"]
    headers.append((b"authorization", f"Bearer {secret}".encode("ascii")))
    return Request({**request.scope, "headers": headers}, request.receive)


async def operator_for(request: Request, secret: str) -> Principal:
    """The operator `secret` stands for; `ApiError` (401 unknown or revoked, 403 a runner's
    token) from the API's own check otherwise."""
    if not well_formed(secret):
        raise ApiError(ErrorCode.UNAUTHORIZED, "the token is unknown or revoked")
    return await require(_as_bearer(request, secret), Role.OPERATOR)


def _ledger(request: Request) -> LedgerStore:
    ledger: LedgerStore = request.app.state.ledger
    return ledger


async def signed_in(request: Request) -> Principal:
    """The operator of the cookie's live session; `SignedOut` if there is none."""
    session_id = request.cookies.get(COOKIE, "")
    if not well_formed(session_id):
        raise SignedOut
    found = await _ledger(request).ui_session(session_id)
    if found is None:
        raise SignedOut
    return found


async def start(request: Request, operator: Principal) -> str:
    """A new session of `operator` (its token checked by `operator_for`): the cookie's value."""
    ttl_s: float = request.app.state.settings.ui_session_ttl_s
    return await _ledger(request).start_ui_session(operator, ttl_s)


async def end(request: Request) -> None:
    """End the cookie's session (sign-out)."""
    session_id = request.cookies.get(COOKIE, "")
    if well_formed(session_id):
        await _ledger(request).end_ui_session(session_id)


def csrf_token(request: Request) -> str:
    """The CSRF token of this session: it proves a form was served to the cookie's holder."""
    secret = request.cookies.get(COOKIE, "")
    return hmac.new(_KEY, secret.encode("utf-8"), hashlib.sha256).hexdigest()


def same_origin(request: Request) -> bool:
    """False when the request names an Origin (or, lacking one, a Referer) on another host
    than the one it was sent to; True when it names none (a browser sends Origin with every
    POST, so only other clients lack both)."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host
    referer = request.headers.get("referer")
    return referer is None or urlsplit(referer).netloc == host


async def form(request: Request) -> dict[str, str]:
    """The posted form's fields (urlencoded, within `max_body_bytes`); a name sent twice keeps
    its first value."""
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        raise WriteRefused("send the page's form (application/x-www-form-urlencoded)")
    raw = await rq.body_bytes(request, request.app.state.settings.max_body_bytes)
    try:
        pairs = parse_qsl(
            raw.decode("utf-8"), keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX
        )
    except (UnicodeDecodeError, ValueError):
        raise WriteRefused("the form could not be read") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


async def checked_form(request: Request) -> dict[str, str]:
    """The form of a write by the signed-in operator, once its origin and CSRF token are
    checked; `WriteRefused` otherwise, before anything is changed."""
    if not same_origin(request):
        raise WriteRefused("the form was sent from another site")
    fields = await form(request)
    sent = fields.get("csrf", "")
    if not request.cookies.get(COOKIE) or not hmac.compare_digest(
        sent.encode("utf-8"), csrf_token(request).encode("ascii")
    ):
        raise WriteRefused("the form is stale or not this session's; reload the page")
    return fields


def keep(response: Response, request: Request, session_id: str) -> None:
    """Set the session cookie on `response`."""
    response.set_cookie(
        COOKIE,
        session_id,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def forget(response: Response, request: Request) -> None:
    """Clear the session cookie on `response`."""
    response.delete_cookie(
        COOKIE,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
