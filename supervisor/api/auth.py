"""Bearer-token authentication: operators act for one tenant, runners for one pool; and which
pools a tenant's tasks may name.

Each token is looked up by its hash in the ledger file. A short cache spares the ledger one read
per request under load; its lifetime bounds how late a revocation made by the CLI in another
process takes effect.
"""

from __future__ import annotations

import time

from starlette.requests import Request

from supervisor.api.errors import ApiError
from supervisor.ledger import Ledger, Principal, Role
from tether.wire import ErrorCode

CACHE_S = 1.0


class TokenCache:
    def __init__(self, ledger: Ledger, lifetime_s: float = CACHE_S) -> None:
        self._ledger = ledger
        self._lifetime = lifetime_s
        self._entries: dict[str, tuple[float, Principal | None]] = {}

    async def principal(self, secret: str) -> Principal | None:
        now = time.monotonic()
        hit = self._entries.get(secret)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await self._ledger.authenticate(secret)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[secret] = (now + self._lifetime, found)
        return found


async def require(request: Request, role: Role) -> Principal:
    """The caller's principal, which must hold `role`; 401 or 403 otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(ErrorCode.UNAUTHORIZED, "send 'Authorization: Bearer <token>'")
    cache: TokenCache = request.app.state.tokens
    principal = await cache.principal(secret.strip())
    if principal is None:
        raise ApiError(ErrorCode.UNAUTHORIZED, "the token is unknown or revoked")
    if principal.role is not role:
        article = "an" if role is Role.OPERATOR else "a"
        raise ApiError(ErrorCode.FORBIDDEN, f"this call needs {article} {role} token")
    return principal


def require_pool_access(tenant: str, pool: str, shared: frozenset[str]) -> None:
    """A tenant's tasks run in a shared pool (setting `shared_pools`, default `default`), in
    the pool named after the tenant, or in one of its own `<tenant>/<name>` pools; any other
    pool is refused. Otherwise a tenant could send its payloads to runners set up for another
    tenant, to run with that tenant's model key, quota and network."""
    if pool in shared or pool == tenant or pool.startswith(f"{tenant}/"):
        return
    open_to = ", ".join(sorted(shared)) or "none"
    raise ApiError(
        ErrorCode.FORBIDDEN,
        f"tenant {tenant!r} may not use pool {pool!r}: name a shared pool ({open_to}),"
        f" {tenant!r} or {tenant + '/<name>'!r}",
    )
