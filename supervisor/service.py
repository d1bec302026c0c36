"""The running supervisor's core, without HTTP: the ledger opened on its file plus the reaper.

The HTTP app's lifespan, the demo and the benchmarks all start the supervisor through
`running_ledger`, so there is exactly one way the reaper gets attached to a ledger.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

import anyio
import structlog

from supervisor.ledger import SqliteLedger
from supervisor.settings import SupervisorSettings

log = structlog.get_logger("tether.supervisor")

REAP_EVERY_MAX_S = 1.0


async def reap_forever(ledger: SqliteLedger) -> None:
    """Expire leases past their deadline, waking at the next deadline or at least every second.

    A lease granted while the reaper sleeps has a deadline at least `accept_window_s` away, so
    the cap bounds how late any expiry is noticed.
    """
    cap = min(REAP_EVERY_MAX_S, ledger.config.accept_window_s / 4)
    while True:
        reaped = await ledger.expire()
        if reaped:
            log.info("leases expired", count=reaped)
        deadline = await ledger.next_deadline()
        pause = cap if deadline is None else min(cap, max(0.01, deadline - ledger.clock()))
        await anyio.sleep(pause)


@contextlib.asynccontextmanager
async def running_ledger(
    settings: SupervisorSettings, *, clock: Callable[[], float] = time.time, reaper: bool = True
) -> AsyncIterator[SqliteLedger]:
    async with (
        SqliteLedger.open(
            settings.db,
            config=settings.ledger_config,
            clock=clock,
            synchronous=settings.synchronous,
        ) as ledger,
        anyio.create_task_group() as tg,
    ):
        if reaper:
            tg.start_soon(reap_forever, ledger)
        try:
            yield ledger
        finally:
            tg.cancel_scope.cancel()
