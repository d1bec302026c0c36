"""Checkpoints (docs/design.md, Checkpoints): accepted only under the step's current fence
(a stale one refused and recorded), never going back a turn, carried as `Lease.resume` by the
next grant of the same step only, and charged to the tenant by delta with the results and
releases of the same attempt."""

from __future__ import annotations

import hashlib

import pytest
from structlog.testing import capture_logs

from tests.conftest import FakeClock, queued_task, report_for
from tests.plain import plain
from tether.supervisor.ledger import InvalidRequest, Lease, SqliteLedger, StaleFence
from tether.wire import ReleaseReason
from tether.wire.records import Checkpoint, Checkpointed, ResumePoint

pytestmark = pytest.mark.backends


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def claim_one(ledger: SqliteLedger) -> Lease:
    [lease] = await ledger.claim("r1", "default", 1, 0)
    return lease


def turn(lease: Lease, n: int, **extra: object) -> Checkpoint:
    fields: dict[str, object] = {
        "fence": lease.fence,
        "turn": n,
        "transcript": digest(f"transcript {n}"),
        "bundle": digest(f"bundle {n}"),
        "sha": f"wip{n}",
        "usage": {"total_tokens": 10 * n},
        "step_usage": {"total_tokens": 10 * n},
    }
    fields.update(extra)
    return Checkpoint(**fields)  # type: ignore[arg-type]


async def spent(ledger: SqliteLedger) -> int:
    return (await ledger.budget("acme")).spent


async def expire(ledger: SqliteLedger, clock: FakeClock) -> None:
    clock.advance(31)
    await ledger.expire()


async def test_a_checkpoint_is_accepted_and_shown_on_its_step(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    with capture_logs() as logs:
        answer = await ledger.checkpoint(lease.step_id, turn(lease, 1))
    assert answer == Checkpointed(turn=1)
    [line] = [line for line in logs if line["event"] == "step checkpointed"]
    assert (line["step_id"], line["fence"], line["turn"]) == (lease.step_id, lease.fence, 1)
    step = plain(await ledger.task(task_id))["steps"][0]
    assert step["checkpoint"] == {"turn": 1, "fence": lease.fence}


async def test_the_same_turn_again_is_the_same_answer(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.checkpoint(lease.step_id, turn(lease, 2))
    again = turn(lease, 2, transcript=digest("another"))
    assert await ledger.checkpoint(lease.step_id, again) == Checkpointed(turn=2)
    await expire(ledger, clock)
    replay = await claim_one(ledger)
    assert replay.resume is not None
    assert replay.resume.transcript == digest("transcript 2")  # the first answer stands


async def test_a_turn_never_goes_back(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.checkpoint(lease.step_id, turn(lease, 3))
    with pytest.raises(InvalidRequest, match="go back"):
        await ledger.checkpoint(lease.step_id, turn(lease, 2))
    assert plain(await ledger.task(task_id))["steps"][0]["checkpoint"]["turn"] == 3


async def test_a_bundle_comes_with_its_commit(ledger: SqliteLedger) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    with pytest.raises(InvalidRequest, match="sha"):
        await ledger.checkpoint(lease.step_id, turn(lease, 1, sha=None))
    no_changes = turn(lease, 1, sha=None, bundle=None)
    assert await ledger.checkpoint(lease.step_id, no_changes) == Checkpointed(turn=1)


async def test_a_stale_checkpoint_is_refused_recorded_and_still_charged(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    old = await claim_one(ledger)
    await expire(ledger, clock)
    new = await claim_one(ledger)
    with pytest.raises(StaleFence):
        await ledger.checkpoint(old.step_id, turn(old, 1, usage={"total_tokens": 7}))
    view = plain(await ledger.task(task_id))
    assert view["steps"][0]["checkpoint"] is None
    assert [(r["code"], r["fence"]) for r in view["rejections"]] == [("stale_fence", old.fence)]
    assert await spent(ledger) == 7  # what the fenced-out attempt spent still counts
    assert (await ledger.claim("r1", "default", 1, 0)) == []
    assert new.resume is None


async def test_a_lapsed_lease_cannot_checkpoint(ledger: SqliteLedger, clock: FakeClock) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    clock.advance(31)  # past the deadline, not yet reaped
    with pytest.raises(StaleFence, match="lapsed"):
        await ledger.checkpoint(lease.step_id, turn(lease, 1))


async def test_the_next_grant_of_the_same_step_resumes_from_its_checkpoint(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger, steps=2)
    first = await claim_one(ledger)
    assert first.resume is None
    await ledger.checkpoint(first.step_id, turn(first, 1))
    await ledger.checkpoint(first.step_id, turn(first, 2, step_usage={"total_tokens": 25}))
    await expire(ledger, clock)
    replay = await claim_one(ledger)
    assert replay.step_id == first.step_id
    assert replay.resume == ResumePoint(
        turn=2,
        fence=first.fence,
        transcript=digest("transcript 2"),
        bundle=digest("bundle 2"),
        sha="wip2",
        usage={"total_tokens": 25},
    )
    await ledger.report(report_for(replay))
    following = await claim_one(ledger)
    assert following.step_id == f"{task_id}.1"
    assert following.resume is None  # another step's lease never carries it
    assert await ledger.violations() == []


async def test_a_checkpoint_then_a_result_charge_the_running_total(
    ledger: SqliteLedger,
) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.checkpoint(lease.step_id, turn(lease, 1, usage={"total_tokens": 100}))
    assert await spent(ledger) == 100
    await ledger.checkpoint(lease.step_id, turn(lease, 1, usage={"total_tokens": 100}))
    assert await spent(ledger) == 100  # a repeat adds nothing
    await ledger.checkpoint(lease.step_id, turn(lease, 2, usage={"total_tokens": 90}))
    assert await spent(ledger) == 100  # a smaller total adds nothing
    await ledger.report(report_for(lease, usage={"total_tokens": 150}))
    assert await spent(ledger) == 150


async def test_a_release_after_checkpoints_charges_only_the_rest(
    ledger: SqliteLedger,
) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.checkpoint(lease.step_id, turn(lease, 1, usage={"total_tokens": 40}))
    await ledger.release(
        lease.step_id,
        lease.fence,
        ReleaseReason.SHUTDOWN,
        True,
        "sigterm",
        usage={"total_tokens": 55},
    )
    assert await spent(ledger) == 55
    replay = await claim_one(ledger)
    assert replay.resume is not None
    assert replay.resume.turn == 1
