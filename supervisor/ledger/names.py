"""Tenant and pool names: what the ledger accepts, in one place.

A name is printed in `token list` (one line per token, fields split by spaces), in logs and in
error messages, and a tenant's own pools are `<tenant>/<name>`. So: letters, digits and
`. _ @ : + -`, starting with a letter or digit; a pool may join such names with `/`. No
spaces, no line breaks, no `*` (the ledger's wake-every-pool sentinel).
"""

from __future__ import annotations

import re

from supervisor.ledger.errors import InvalidRequest

MAX_NAME = 200
_PART = r"[A-Za-z0-9][A-Za-z0-9._@:+-]*"
_TENANT = re.compile(_PART)
_POOL = re.compile(rf"{_PART}(?:/{_PART})*")
_RULE = "letters, digits and . _ @ : + -, starting with a letter or digit"


def check_tenant(name: str) -> str:
    if len(name) > MAX_NAME or not _TENANT.fullmatch(name):
        raise InvalidRequest(f"tenant name {name!r} is not allowed: {_RULE}, 1..{MAX_NAME}")
    return name


def check_pool(name: str) -> str:
    if len(name) > MAX_NAME or not _POOL.fullmatch(name):
        raise InvalidRequest(
            f"pool name {name!r} is not allowed: {_RULE}, in parts joined by '/', 1..{MAX_NAME}"
        )
    return name
