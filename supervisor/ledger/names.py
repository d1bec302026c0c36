"""Tenant, pool and token names: what the ledger accepts, in one place.

A name is printed in `token list` (one line per token, fields split by spaces), in logs and in
error messages, and a tenant's own pools are `<tenant>/<name>`. So: letters, digits and
`. _ @ : + -`, starting with a letter or digit; a pool may join such names with `/`. No
spaces, no line breaks, no `*` (the ledger's wake-every-pool sentinel).
"""

from __future__ import annotations

import re

from tether.supervisor.ledger.errors import InvalidRequest
from tether.supervisor.ledger.tx import ALL_POOLS, Tx

MAX_NAME = 200
_PART = r"[A-Za-z0-9][A-Za-z0-9._@:+-]*"
_TENANT = re.compile(_PART)
_POOL = re.compile(rf"{_PART}(?:/{_PART})*")
_TOKEN_ID = re.compile(r"[0-9a-f]{12}")  # the form of `tokens.create_token`'s ids
_RULE = "letters, digits and . _ @ : + -, starting with a letter or digit"


_HELD = {"tenant": "tenant_name_held", "pool": "pool_name_held"}


def _known(tx: Tx | None, kind: str, name: str) -> bool:
    """Held by the ledger already (a token's scope, a tenant with a budget, a task's pool,
    from before these rules): then it is not refused now, so its tokens can be rotated and
    its budget set."""
    if tx is None or name == ALL_POOLS or not name.strip():
        return False
    return tx.one(_HELD[kind], name=name) is not None


def check_tenant_name(name: str, tx: Tx | None = None) -> str:
    """Return `name` if it is a valid tenant name (or one `tx`'s ledger already holds)."""
    if (len(name) > MAX_NAME or not _TENANT.fullmatch(name)) and not _known(tx, "tenant", name):
        if "/" in name:
            raise InvalidRequest(
                f"tenant name {name!r}: a tenant's name has no '/': '/' separates a tenant"
                " from its pools"
            )
        raise InvalidRequest(f"tenant name {name!r} is not allowed: {_RULE}, 1..{MAX_NAME}")
    return name


def check_pool_name(name: str, tx: Tx | None = None) -> str:
    """Return `name` if it is a valid pool name (or one `tx`'s ledger already holds)."""
    if (len(name) > MAX_NAME or not _POOL.fullmatch(name)) and not _known(tx, "pool", name):
        raise InvalidRequest(
            f"pool name {name!r} is not allowed: {_RULE}, in parts joined by '/', 1..{MAX_NAME}"
        )
    return name


def check_token_name(name: str) -> str:
    """Return `name` if it may name a token: a tenant name's characters, and not shaped like a
    token id (`token revoke` takes either, the id first)."""
    if len(name) > MAX_NAME or not _TENANT.fullmatch(name):
        raise InvalidRequest(f"token name {name!r} is not allowed: {_RULE}, 1..{MAX_NAME}")
    if _TOKEN_ID.fullmatch(name):
        raise InvalidRequest(f"token name {name!r} looks like a token id: choose another")
    return name
