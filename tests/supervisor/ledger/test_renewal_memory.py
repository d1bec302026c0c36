"""Renewals answered from memory (docs/design.md, Fencing and leases; issue 23, finding 4): a
renew within half a renew interval of the last one written gets that write's deadline back
without a ledger write, never a fresh TTL; anything that happens to the task (a cancel, a
result, a release) is heard at the very next renewal. The defaults here: TTL 30 s, renew every
5 s, so the memory holds a write for 2.5 s."""

from __future__ import annotations

import anyio
import pytest

from tests.conftest import ApiHarness, FakeClock, count, queued_task, report_for
from tether.supervisor.ledger import NotFound, SqliteLedger, StaleFence
from tether.wire import ReleaseReason

pytestmark = pytest.mark.backends

TOKEN = "tok-a"


async def lease_of(ledger: SqliteLedger, key: str = "k1") -> tuple[str, int]:
    task_id = await queued_task(ledger, key)
    [lease] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    assert lease.task_id == task_id
    return lease.step_id, lease.fence


async def test_a_renewal_within_half_an_interval_is_answered_from_the_write_before(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    step_id, fence = await lease_of(ledger)
    first = await ledger.renew(step_id, fence, token_id=TOKEN)
    assert first.ttl_s == 30.0
    batches = ledger.counters.batches
    for _ in range(20):  # a flood: 20 renewals in 2 s
        clock.advance(0.1)
        again = await ledger.renew(step_id, fence, token_id=TOKEN)
        assert again.cancelled is False
    assert ledger.counters.batches == batches  # not one write
    assert again.ttl_s == pytest.approx(28.0)  # what is left of the deadline written: no fresh TTL
    assert ledger.counters.renewals_remembered == 20
    clock.advance(0.6)  # 2.6 s after the write: past half an interval, written again
    written = await ledger.renew(step_id, fence, token_id=TOKEN)
    assert written.ttl_s == 30.0
    assert ledger.counters.batches == batches + 1


async def test_a_cancel_is_heard_at_the_next_renewal(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    step_id, fence = await lease_of(ledger)
    await ledger.renew(step_id, fence, token_id=TOKEN)
    task_id = step_id.rsplit(".", 1)[0]
    clock.advance(0.1)
    await ledger.cancel("acme", task_id, "changed mind")
    clock.advance(0.1)
    heard = await ledger.renew(step_id, fence, token_id=TOKEN)
    assert (heard.cancelled, heard.ttl_s) == (True, 0.0)


async def test_a_cancel_in_the_renewals_own_batch_is_heard_too(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """The renewal and the cancel reach the writer together (one batch, the renewal's rule
    first): the memory must not keep the renewal it wrote just before the cancel."""
    step_id, fence = await lease_of(ledger)
    task_id = step_id.rsplit(".", 1)[0]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: ledger.renew(step_id, fence, token_id=TOKEN))
        tg.start_soon(lambda: ledger.cancel("acme", task_id, "changed mind"))
    clock.advance(0.1)
    assert (await ledger.renew(step_id, fence, token_id=TOKEN)).cancelled is True


async def test_a_result_or_a_release_ends_what_the_memory_answers(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    step_id, fence = await lease_of(ledger, "k1")
    await ledger.renew(step_id, fence, token_id=TOKEN)
    await ledger.release(step_id, fence, ReleaseReason.TRANSIENT, True, "x", token_id=TOKEN)
    clock.advance(0.1)
    with pytest.raises(StaleFence):  # requeued: the fence is no longer current
        await ledger.renew(step_id, fence, token_id=TOKEN)
    [again] = await ledger.claim("r1", "default", 1, 0, token_id=TOKEN)
    await ledger.renew(again.step_id, again.fence, token_id=TOKEN)
    await ledger.report(report_for(again), token_id=TOKEN)
    clock.advance(0.1)
    with pytest.raises(StaleFence):  # committed: the lease is over
        await ledger.renew(again.step_id, again.fence, token_id=TOKEN)


async def test_the_memory_answers_only_the_lease_it_wrote_for(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    step_id, fence = await lease_of(ledger)
    await ledger.renew(step_id, fence, token_id=TOKEN)
    clock.advance(0.1)
    with pytest.raises(NotFound):  # another token of the pool: no such lease, remembered or not
        await ledger.renew(step_id, fence, token_id="tok-intruder")
    with pytest.raises(NotFound):
        await ledger.renew(step_id, fence, "elsewhere", token_id=TOKEN)
    assert ledger.counters.renewals_remembered == 0


async def test_a_cancel_over_http_reaches_the_runners_next_renewal(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    url = f"/v1/leases/{lease['step_id']}/renew"
    body = {"fence": lease["fence"]}
    assert (await api.client.post(url, headers=api.runner, json=body)).json()["cancelled"] is False
    api.clock.advance(0.1)
    remembered = await api.client.post(url, headers=api.runner, json=body)
    assert remembered.json()["ttl_s"] == pytest.approx(29.9)
    cancelled = await api.client.post(
        f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={}
    )
    assert cancelled.status_code == 200, cancelled.text
    heard = await api.client.post(url, headers=api.runner, json=body)
    assert heard.json()["cancelled"] is True
    assert count(api.path, "rejections") == 0
