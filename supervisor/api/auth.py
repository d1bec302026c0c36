"""Bearer-token authentication: operators act for one tenant, runners for one pool; and which
pools a tenant's tasks may name.

Each token is looked up by its hash in the ledger file. A short cache spares the ledger one read
per request under load; its lifetime bounds how late a revocation made by the CLI in another
process takes effect. Every refusal here is logged at warning, with the token's id when it is
known (never the secret), at most `refusal_log.PER_SECOND` a second per client address.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog
from cachetools import TTLCache
from starlette.requests import Request

from tether.supervisor.api.errors import ApiError
from tether.supervisor.api.refusal_log import RefusalLog
from tether.supervisor.ledger import Principal, Role
from tether.wire import ErrorCode

CACHE_S = 1.0
# Past this many distinct secrets the least recently used go first: a caller spraying made-up
# tokens cannot grow the cache, only shorten the stay of the others.
CACHE_ENTRIES = 10_000

log = structlog.get_logger("tether.api")


class TokenLookup(Protocol):
    """What a `TokenCache` asks of the ledger: the principal behind a secret, if any."""

    async def authenticate(self, secret: str) -> Principal | None: ...


class TokenCache:
    """The principal behind each recently seen secret (None for an unknown or revoked one),
    kept `lifetime_s` on the `timer` clock. A hit in `cachetools.TTLCache` costs about 1 µs
    (measured; a bare dict 0.1 µs), nothing beside the request around it."""

    def __init__(
        self,
        ledger: TokenLookup,
        lifetime_s: float = CACHE_S,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._entries: TTLCache[str, Principal | None] = TTLCache(
            maxsize=CACHE_ENTRIES, ttl=lifetime_s, timer=timer
        )

    async def principal(self, secret: str) -> Principal | None:
        try:
            return self._entries[secret]
        except KeyError:
            pass
        found = await self._ledger.authenticate(secret)
        self._entries[secret] = found
        return found


def refused(request: Request, code: ErrorCode, detail: str, **about: Any) -> ApiError:
    """Log a refused request at warning (the route, the client, `about`), unless its client
    has had its share of lines this second (`RefusalLog`), and return its error."""
    client = request.client.host if request.client else None
    lines: RefusalLog = request.app.state.refusal_log
    if lines.may_log(client):
        log.warning(
            "access refused",
            code=code.value,
            detail=detail,
            method=request.method,
            path=request.url.path,
            client=client,
            **about,
        )
    return ApiError(code, detail)


async def require(request: Request, role: Role, *or_roles: Role) -> Principal:
    """The caller's principal, which must hold `role` (or one of `or_roles`); 401 or 403
    otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise refused(request, ErrorCode.UNAUTHORIZED, "send 'Authorization: Bearer <token>'")
    cache: TokenCache = request.app.state.tokens
    principal = await cache.principal(secret.strip())
    if principal is None:
        raise refused(request, ErrorCode.UNAUTHORIZED, "the token is unknown or revoked")
    if principal.role is not role and principal.role not in or_roles:
        article = "an" if role is Role.OPERATOR else "a"
        wanted = " or ".join(r.value for r in (role, *or_roles))
        raise refused(
            request,
            ErrorCode.FORBIDDEN,
            f"this call needs {article} {wanted} token",
            token_id=principal.token_id,
            role=principal.role.value,
            scope=principal.scope,
        )
    return principal


def may_use_pool(tenant: str, pool: str, shared: frozenset[str]) -> bool:
    """Whether `tenant`'s tasks may run in `pool` (see `require_pool_access`)."""
    return pool in shared or pool == tenant or pool.startswith(f"{tenant}/")


def require_pool_access(
    request: Request, who: Principal, pool: str, shared: frozenset[str]
) -> None:
    """A tenant's tasks run in a shared pool (setting `shared_pools`, default `default`), in
    the pool named after the tenant, or in one of its own `<tenant>/<name>` pools; any other
    pool is refused. Otherwise a tenant could send its payloads to runners set up for another
    tenant, to run with that tenant's model key, quota and network."""
    tenant = who.scope
    if may_use_pool(tenant, pool, shared):
        return
    open_to = ", ".join(sorted(shared)) or "none"
    raise refused(
        request,
        ErrorCode.FORBIDDEN,
        f"tenant {tenant!r} may not use pool {pool!r}: name a shared pool ({open_to}),"
        f" {tenant!r} or {tenant + '/<name>'!r}",
        token_id=who.token_id,
        tenant=tenant,
        pool=pool,
    )
