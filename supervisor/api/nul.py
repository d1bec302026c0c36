"""Refusing a NUL in a request's path or query string, before routing.

Ids in the path (`/v1/leases/{step_id}/renew`) and query parameters reach the ledger as text as
they are; PostgreSQL cannot hold a NUL in text and SQLite would just find nothing. A NUL in a
body's string is refused where bodies are decoded (`tether.wire.nul`); this is the same rule for the
URL, so both backends answer the same 422. A plain ASGI wrapper: one `in` test on the path and one
on the raw query per request (Starlette's `BaseHTTPMiddleware` would add a task per request).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tether.supervisor.api.errors import error_response
from tether.wire import ErrorCode


class RefuseNul:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            "\x00" in scope["path"] or b"%00" in scope.get("query_string", b"")
        ):
            where = "path" if "\x00" in scope["path"] else "query string"
            response = error_response(
                ErrorCode.INVALID_FIELD, f"the request's {where} must not contain NUL (%00)"
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
