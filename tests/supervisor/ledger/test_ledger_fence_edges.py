"""Two edges of fencing: who may hear `replayed`, and a lease that lapsed before the reaper
noticed. Both refusals are recorded as rejected attempts, never as new states."""

from __future__ import annotations

import msgspec
import pytest

from tests.conftest import FakeClock, count, queued_task, report_for
from tests.plain import plain
from tether.supervisor.ledger import NotFound, SqliteLedger, StaleFence
from tether.wire import Outcome

pytestmark = pytest.mark.backends


async def test_only_the_committing_fence_hears_replayed(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    [stale] = await ledger.claim("runner-a", "default", 1, 0)
    clock.advance(31)
    assert await ledger.expire() == 1
    [current] = await ledger.claim("runner-b", "default", 1, 0)
    assert await ledger.report(report_for(current)) is Outcome.APPLIED

    with pytest.raises(StaleFence):  # the fenced-out worker comes back after the commit
        await ledger.report(report_for(stale))
    # A fence the step was never granted is no lease: `not_found` like an unknown step, and
    # not recorded (a lease belongs to the token it was granted to; guessing teaches nothing).
    never_issued = msgspec.structs.replace(report_for(current), fence=999_999)
    with pytest.raises(NotFound):
        await ledger.report(never_issued)
    assert await ledger.report(report_for(current)) is Outcome.REPLAYED  # its ack was lost

    assert count(ledger, "effects") == 1
    assert count(ledger, "rejections", "code = 'stale_fence'") == 1


async def test_a_lapsed_lease_is_over_before_the_reaper_runs(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    [lease] = await ledger.claim("runner-a", "default", 1, 0)
    await ledger.renew(lease.step_id, lease.fence)  # acknowledged
    clock.advance(30.5)  # past the TTL on the supervisor's clock; the reaper has not run

    with pytest.raises(StaleFence):
        await ledger.renew(lease.step_id, lease.fence)
    with pytest.raises(StaleFence):
        await ledger.report(report_for(lease))
    assert count(ledger, "effects") == 0
    assert count(ledger, "rejections", "code = 'stale_fence'") == 2

    assert await ledger.expire() == 1  # the reaper requeues it: same step, new fence
    [again] = await ledger.claim("runner-b", "default", 1, 0)
    assert (again.step_id, again.fence > lease.fence) == (lease.step_id, True)
    assert await ledger.report(report_for(again)) is Outcome.APPLIED
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"


async def test_an_unacknowledged_lease_lapses_at_the_acceptance_window(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    [lease] = await ledger.claim("runner-a", "default", 1, 0)
    clock.advance(10)  # the claim answer was lost: no renew within accept_window_s
    with pytest.raises(StaleFence):
        await ledger.renew(lease.step_id, lease.fence)
