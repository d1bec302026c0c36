"""Bearer tokens: stored hashed, scoped (operators to a tenant, runners to a pool), revocable.

The secret is shown once, at creation; the ledger keeps only its sha256. Requests are checked
against the ledger file through the API's token cache (one second: `api/auth.py`), so a
revocation made by the CLI from another process takes effect within about a second.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
import sqlite3

from supervisor.ledger import names
from supervisor.ledger.errors import InvalidRequest, NotFound
from supervisor.ledger.tx import Tx
from tether.wire import sha256_hex

TOKEN_PREFIX = "tether_"  # noqa: S105 - a prefix, not a secret


class Role(enum.StrEnum):
    OPERATOR = "operator"
    RUNNER = "runner"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Principal:
    token_id: str
    scope: str  # the tenant of an operator, the pool of a runner
    role: Role


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenRecord:
    id: str
    scope: str
    role: Role
    created_at: float
    revoked: bool


def hash_secret(secret: str) -> str:
    return sha256_hex(secret.encode("utf-8"))


def create_token(tx: Tx, scope: str, role: str) -> tuple[str, str]:
    """Answer `(token_id, secret)`; the secret is never stored."""
    try:
        parsed = Role(role)
    except ValueError:
        raise InvalidRequest("role must be operator or runner") from None
    if parsed is Role.OPERATOR:
        names.check_tenant_name(scope, tx)
    else:
        names.check_pool_name(scope, tx)
    token_id = secrets.token_hex(6)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tx.run(
        "INSERT INTO tokens (id, scope, role, secret_hash, created_at) VALUES (?, ?, ?, ?, ?)",
        (token_id, scope, parsed.value, hash_secret(secret), tx.now),
    )
    return token_id, secret


def revoke_token(tx: Tx, token_id: str) -> None:
    changed = tx.run(
        "UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?", (tx.now, token_id)
    )
    if not changed:
        raise NotFound(f"no token {token_id}")


def list_tokens(db: sqlite3.Connection) -> list[TokenRecord]:
    return [
        TokenRecord(
            id=r["id"], scope=r["scope"], role=Role(r["role"]), created_at=r["created_at"],
            revoked=r["revoked_at"] is not None,
        )
        for r in db.execute("SELECT * FROM tokens ORDER BY created_at, id").fetchall()
    ]  # fmt: skip


def authenticate(db: sqlite3.Connection, secret: str) -> Principal | None:
    """The principal behind a live token, or None for an unknown or revoked one."""
    row = db.execute(
        "SELECT id, scope, role FROM tokens WHERE secret_hash = ? AND revoked_at IS NULL",
        (hash_secret(secret),),
    ).fetchone()
    if row is None:
        return None
    return Principal(token_id=row["id"], scope=row["scope"], role=Role(row["role"]))
