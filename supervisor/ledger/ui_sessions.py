"""The status page's sessions (docs/design.md, Status page and OpenAPI document): a sign-in
with an operator token starts one, and the page's cookie holds the session's id instead of the
token. The ledger keeps only the id's sha256, like a token's. A session is over at sign-out, at
its expiry, or as soon as its token is revoked: every lookup wants the token live.
"""

from __future__ import annotations

import secrets
from typing import Final

from tether.supervisor.ledger.records import LiveToken
from tether.supervisor.ledger.tokens import Principal, Role, hash_secret
from tether.supervisor.ledger.tx import Tx, TypedReads

SESSION_PREFIX: Final = "tether_ui_"
# Ended and expired sessions are kept this long, then removed at a later sign-in.
KEEP_ENDED_S: Final = 7 * 86400.0


def start(tx: Tx, operator: Principal, ttl_s: float) -> str:
    """A new session of `operator`'s token, live for `ttl_s`: its id, shown once (the cookie)."""
    if operator.role is not Role.OPERATOR:
        raise ValueError("a status-page session is an operator token's")
    tx.run("forget_old_ui_sessions", before=tx.now - KEEP_ENDED_S)
    session_id = SESSION_PREFIX + secrets.token_urlsafe(32)
    tx.run(
        "start_ui_session",
        id_hash=hash_secret(session_id),
        token_id=operator.token_id,
        now=tx.now,
        expires_at=tx.now + ttl_s,
    )
    return session_id


def operator_of(s: TypedReads, session_id: str, now: float) -> Principal | None:
    """The operator of a live session; None when it is unknown, ended, expired, or its token
    was revoked."""
    row = s.one_as(LiveToken, "live_ui_session", id_hash=hash_secret(session_id), now=now)
    if row is None:
        return None
    return Principal(
        token_id=row.id, scope=row.scope, role=Role(row.role), last_used_at=row.last_used_at
    )


def end(tx: Tx, session_id: str) -> None:
    """Sign-out: the session is over from now on."""
    tx.run("end_ui_session", now=tx.now, id_hash=hash_secret(session_id))
