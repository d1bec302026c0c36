"""TCP liveness on every PostgreSQL ledger connection (review finding 6): keepalives and a TCP
user timeout on the writer, the read pool and the listener, so a server gone silent is noticed
in seconds; a URL's own values of those parameters win."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests import pgdb
from tests.conftest import FakeClock, queued_task
from tether.supervisor.ledger import LedgerConfig
from tether.supervisor.ledger.pg_schema import LIVENESS
from tether.supervisor.ledger.store import open_ledger

pytestmark = pytest.mark.anyio

pg_url = pgdb.pg_url

CONFIG = LedgerConfig(lease_ttl_s=30, accept_window_s=10)


def parameters(conn: Any) -> dict[str, str]:
    """The libpq parameters `conn` was opened with, of `LIVENESS`'s names."""
    return {
        o.keyword.decode(): o.val.decode()
        for o in conn.pgconn.info
        if o.keyword.decode() in LIVENESS and o.val is not None
    }


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every connection psycopg opens in the test, sync (writer, read pool) and async
    (listener)."""
    seen: list[Any] = []
    sync_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    async_connect = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

    def spy_sync(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = sync_connect(cls, *args, **kwargs)
        seen.append(conn)
        return conn

    async def spy_async(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = await async_connect(cls, *args, **kwargs)
        seen.append(conn)
        return conn

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(spy_sync))
    monkeypatch.setattr(psycopg, "connect", psycopg.Connection.connect)  # an alias made at import
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(spy_async))
    return seen


async def test_every_ledger_connection_has_keepalives_and_a_user_timeout(
    pg_url: str, clock: FakeClock, opened: list[Any]
) -> None:
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as ledger:
        await queued_task(ledger)
        await ledger.queue_depth()
        kinds = {type(conn).__name__ for conn in opened}
        assert kinds == {"Connection", "AsyncConnection"}  # the writer and reads, the listener
        assert len(opened) >= 3
        expected = {name: str(value) for name, value in LIVENESS.items()}
        assert all(parameters(conn) == expected for conn in opened)
        assert LIVENESS["keepalives_idle"] + 3 * LIVENESS["keepalives_interval"] <= 30


async def test_the_urls_own_liveness_parameters_win(
    pg_url: str, clock: FakeClock, opened: list[Any]
) -> None:
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}keepalives_idle=120&tcp_user_timeout=5000"
    async with open_ledger(url, clock=clock, config=CONFIG) as ledger:
        await ledger.queue_depth()
        assert len(opened) >= 3
        for conn in opened:
            assert parameters(conn)["keepalives_idle"] == "120"
            assert parameters(conn)["tcp_user_timeout"] == "5000"
            assert parameters(conn)["keepalives_count"] == "3"
