"""Bearer tokens: stored hashed, scoped (operators to a tenant, runners to a pool), revocable,
optionally named so an operator can tell them apart (`box-17`).

The secret is shown once, at creation; the ledger keeps only its sha256. Requests are checked
against the ledger file through the API's token cache (one second: `api/auth.py`), so a
revocation made by the CLI from another process takes effect within about a second.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets

from tether.supervisor.ledger import names
from tether.supervisor.ledger.errors import InvalidRequest, NotFound
from tether.supervisor.ledger.records import LiveToken, TokenRow
from tether.supervisor.ledger.tx import Tx, TypedReads
from tether.wire import sha256_hex

TOKEN_PREFIX = "tether_"  # noqa: S105 - a prefix, not a secret
# A token's last use is written when the one stored is older than this: `token list` is
# about a minute late at worst, and a busy token costs one write a minute, not one a request.
LAST_USE_EVERY_S = 60.0


class Role(enum.StrEnum):
    OPERATOR = "operator"
    RUNNER = "runner"
    METRICS = "metrics"  # reads `GET /metrics` and nothing else; its scope is only a label


@dataclasses.dataclass(frozen=True, kw_only=True)
class Principal:
    token_id: str
    scope: str  # the tenant of an operator, the pool of a runner
    role: Role
    last_used_at: float | None = None  # as stored when the token was looked up


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenRecord:
    id: str
    scope: str
    role: Role
    created_at: float
    revoked: bool
    name: str | None
    last_used_at: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class NewToken:
    id: str
    name: str | None
    secret: str  # shown once, never stored


def hash_secret(secret: str) -> str:
    return sha256_hex(secret.encode("utf-8"))


def create_token(tx: Tx, scope: str, role: str, name: str | None = None) -> NewToken:
    """A new token; its `name`, if given, must be free among the tokens not revoked."""
    try:
        parsed = Role(role)
    except ValueError:
        raise InvalidRequest("role must be operator, runner or metrics") from None
    if parsed is Role.RUNNER:
        names.check_pool_name(scope, tx)
    else:
        names.check_tenant_name(scope, tx)
    if name is not None:
        names.check_token_name(name)
        held = tx.one("live_token_named", name=name)
        if held is not None:
            raise InvalidRequest(
                f"token {held['id']} is already named {name!r}: revoke it or choose another name"
            )
    token_id = secrets.token_hex(6)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tx.run(
        "insert_token",
        token_id=token_id,
        scope=scope,
        role=parsed.value,
        secret_hash=hash_secret(secret),
        now=tx.now,
        name=name,
    )
    return NewToken(id=token_id, name=name, secret=secret)


def revoke_token(tx: Tx, token: str) -> TokenRecord:
    """Revoke the token whose id is `token`, or else the live token named `token`, and return
    it. Revoking again changes nothing: by name, that finds the newest revoked token so named."""
    row = tx.one_as(TokenRow, "token_by_id", token_id=token) or tx.one_as(
        TokenRow, "token_by_name", name=token
    )
    if row is None:
        raise NotFound(f"no token with id or name {token!r}")
    tx.run("revoke_token", now=tx.now, token_id=row.id)
    return _record(row)


def _record(row: TokenRow) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        scope=row.scope,
        role=Role(row.role),
        created_at=row.created_at,
        revoked=row.revoked_at is not None,
        name=row.name,
        last_used_at=row.last_used_at,
    )


def list_tokens(s: TypedReads) -> list[TokenRecord]:
    return [_record(r) for r in s.all_as(TokenRow, "list_tokens")]


def authenticate(s: TypedReads, secret: str) -> Principal | None:
    """The principal behind a live token, or None for an unknown or revoked one."""
    row = s.one_as(LiveToken, "live_token_by_secret_hash", secret_hash=hash_secret(secret))
    if row is None:
        return None
    return Principal(
        token_id=row.id, scope=row.scope, role=Role(row.role), last_used_at=row.last_used_at
    )


def use_is_stale(principal: Principal, now: float) -> bool:
    """Whether the token's stored last use is old enough to be written again."""
    last = principal.last_used_at
    return last is None or now - last >= LAST_USE_EVERY_S


def note_use(tx: Tx, token_id: str) -> None:
    """Record that the token authenticated now, unless another request just did."""
    tx.run(
        "note_token_use",
        now=tx.now,
        token_id=token_id,
        used_before=tx.now - LAST_USE_EVERY_S,
    )
