"""A token's last use (finding 4): written when it authenticates, at most once a minute, never
once per request; `token list` shows it."""

from __future__ import annotations

import time

from tests.conftest import ApiHarness, raw_db
from tether.supervisor import admin
from tether.supervisor.api import auth
from tether.supervisor.ledger.tokens import LAST_USE_EVERY_S


class Monotonic:
    """The token cache's clock, and only its: the event loop keeps the real one."""

    def __init__(self) -> None:
        self.now = 5_000.0

    def __call__(self) -> float:
        return self.now


def last_used(api: ApiHarness) -> dict[str, float | None]:
    db = raw_db(api.path)
    try:
        rows = db.execute("SELECT scope, role, last_used_at FROM tokens").fetchall()
    finally:
        db.close()
    return {f"{r['role']}:{r['scope']}": r["last_used_at"] for r in rows}


async def test_last_use_is_written_on_first_use_then_at_most_once_a_minute(
    api: ApiHarness,
) -> None:
    cache_clock = Monotonic()
    api.app.state.tokens = auth.TokenCache(api.app.state.ledger, timer=cache_clock)
    start = api.clock.now

    async def use_operator() -> None:
        assert (await api.client.get("/v1/tasks", headers=api.operator)).status_code == 200
        cache_clock.now += auth.CACHE_S + 0.01  # each use a cache miss: the worst case

    assert set(last_used(api).values()) == {None}
    await use_operator()
    assert last_used(api)["operator:acme"] == start
    for _ in range(5):  # requests within the minute: no write
        api.clock.advance(LAST_USE_EVERY_S / 6)
        await use_operator()
    assert last_used(api)["operator:acme"] == start
    api.clock.advance(LAST_USE_EVERY_S / 6)
    await use_operator()
    assert last_used(api)["operator:acme"] == start + LAST_USE_EVERY_S
    # Only the token that was used: the others were never seen.
    others = [v for k, v in last_used(api).items() if k != "operator:acme"]
    assert others
    assert others == [None] * len(others)

    shown = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + LAST_USE_EVERY_S))
    listing = admin.list_tokens(api.path)
    assert [line.rsplit(" ", 1)[1] for line in listing].count(f"last_used={shown}") == 1


async def test_a_refused_token_leaves_no_last_use(api: ApiHarness) -> None:
    admin.revoke_token(api.path, admin.list_tokens(api.path)[0].split()[0])  # the operator's
    assert (await api.client.get("/v1/tasks", headers=api.operator)).status_code == 401
    assert last_used(api)["operator:acme"] is None
