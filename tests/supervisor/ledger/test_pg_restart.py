"""Restarts with several supervisors on one PostgreSQL ledger (review finding 1): a supervisor
that starts while another serves moves no lease, however often it restarts."""

from __future__ import annotations

import pytest

from tests import pgdb
from tests.conftest import FakeClock, queued_task
from tether.supervisor.ledger import LedgerConfig
from tether.supervisor.ledger.store import open_ledger

pytestmark = pytest.mark.anyio

pg_url = pgdb.pg_url

CONFIG = LedgerConfig(lease_ttl_s=30, accept_window_s=10)


async def test_another_supervisors_restarts_never_keep_a_lost_runners_lease_alive(
    pg_url: str, clock: FakeClock
) -> None:
    """A serves (its reaper turns each second); B crash-loops every 5 s. A's lost runner's
    lease lapses at its deadline, as if B never started."""
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as a:
        await queued_task(a)
        [lease] = await a.claim("r1", "default", 1, 0)
        await a.renew(lease.step_id, lease.fence)  # then the runner dies
        deadline = clock.now + CONFIG.lease_ttl_s
        reaped = 0
        while reaped == 0 and clock.now < deadline + 60:
            for _ in range(5):
                clock.advance(1)
                reaped += await a.expire()
            async with open_ledger(pg_url, clock=clock, config=CONFIG):
                pass
        assert reaped == 1
        assert clock.now <= deadline + 5
