"""Fenced leases (docs/design.md, Fencing and leases): one strictly increasing fence counter, steps
in order, stale
tokens refused on the record, bounded retries, the acceptance window, the reaper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from tests.conftest import FakeClock, count, make_spec, open_ledger, queued_task, report_for
from tests.plain import plain
from tether.supervisor.ledger import (
    InvalidRequest,
    Lease,
    LedgerConfig,
    NotFound,
    PayloadDrift,
    SqliteLedger,
    StaleFence,
)
from tether.supervisor.ledger.operator import approve
from tether.wire import Outcome, ReleaseReason
from tether.wire.records import Checkpoint, EarlierOutput

pytestmark = pytest.mark.backends


async def claim_one(ledger: SqliteLedger, runner: str = "r1") -> Lease:
    [lease] = await ledger.claim(runner, "default", 1, 0)
    return lease


def asleep(ledger: SqliteLedger) -> anyio.Event:
    """Set once a claim has looked, found nothing and gone to sleep: lets a test wake it
    deterministically instead of guessing how long to wait."""
    waiting = anyio.Event()
    signal = ledger._work["default"]
    original = signal.wait

    async def wait(*args: Any, **kwargs: Any) -> None:
        waiting.set()
        await original(*args, **kwargs)

    signal.wait = wait  # type: ignore[method-assign]
    return waiting


async def fences_ever(ledger: SqliteLedger, *task_ids: str) -> list[int]:
    views = [plain(await ledger.task(t)) for t in task_ids]
    return [a["fence"] for v in views for s in v["steps"] for a in s["attempts"]]


async def test_fences_strictly_increase_across_every_grant(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    tasks = [await queued_task(ledger, f"k{i}", steps=2) for i in range(3)]
    granted: list[int] = []
    for _ in range(3):  # grant, let the lease lapse, grant again: new fences every time
        granted += [lease.fence for lease in await ledger.claim("r1", "default", 10, 0)]
        clock.advance(31)
        assert await ledger.expire() == 3
    for lease in await ledger.claim("r2", "default", 10, 0):
        granted.append(lease.fence)
        await ledger.report(report_for(lease))
    granted += [lease.fence for lease in await ledger.claim("r3", "default", 10, 0)]
    assert len(granted) == 15
    assert granted == sorted(granted)
    assert len(set(granted)) == len(granted)
    assert sorted(await fences_ever(ledger, *tasks)) == granted


async def test_steps_of_a_task_run_in_order_and_carry_earlier_outputs(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger, steps=3)
    first = await claim_one(ledger)
    assert (first.step_id, first.attempt, first.outputs) == (f"{task_id}.0", 1, ())
    assert await ledger.claim("r2", "default", 5, 0) == []  # step 1 waits for step 0's commit
    await ledger.report(report_for(first, output={"patch": "one"}))
    second = await claim_one(ledger)
    assert second.step_id == f"{task_id}.1"
    assert second.fence > first.fence
    assert second.payload == {"cmd": "apply-patch", "rev": 1}
    assert second.outputs == (
        EarlierOutput(step_id=first.step_id, name="s0", output={"patch": "one"}),
    )
    await ledger.report(report_for(second, output="two"))
    third = await claim_one(ledger)
    assert [o.output for o in third.outputs] == [{"patch": "one"}, "two"]
    assert plain(await ledger.task(task_id))["state"] == "RUNNING"


async def test_a_lease_tells_durations_never_deadlines(ledger: SqliteLedger) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    assert lease.ttl_s == 30
    assert 0 < lease.renew_every_s <= 5  # often enough to acknowledge within accept_window_s
    assert set(msgspec.to_builtins(lease)) >= {
        "step_id",
        "task_id",
        "attempt",
        "fence",
        "payload",
        "payload_hash",
        "ttl_s",
        "renew_every_s",
        "outputs",
    }


async def test_capacity_bounds_one_answer_oldest_task_first(ledger: SqliteLedger) -> None:
    tasks = [await queued_task(ledger, f"k{i}") for i in range(3)]
    leases = await ledger.claim("r1", "default", 2, 0)
    assert [lease.task_id for lease in leases] == tasks[:2]
    [rest] = await ledger.claim("r1", "default", 2, 0)
    assert rest.task_id == tasks[2]
    assert await ledger.claim("r1", "default", 2, 0) == []
    for bad in (0, 257):
        with pytest.raises(InvalidRequest):
            await ledger.claim("r1", "default", bad, 0)


async def test_a_claim_in_another_pool_gets_nothing(ledger: SqliteLedger) -> None:
    await queued_task(ledger)
    assert await ledger.claim("r1", "gpu", 5, 0) == []
    assert len(await ledger.claim("r1", "default", 5, 0)) == 1


async def test_claim_long_poll_wakes_when_work_is_approved_while_it_waits(
    ledger: SqliteLedger,
) -> None:
    """The claim must be asleep before the approval: the signal is watched, not the clock."""
    spec = make_spec()
    task_id = (await ledger.create_task(spec)).task_id
    waiting = asleep(ledger)
    got: list[Lease] = []

    async def claimer() -> None:
        got.extend(await ledger.claim("r1", "default", 1, 60))

    with anyio.fail_after(10):  # far below wait_s: only a wake-up can finish in time
        async with anyio.create_task_group() as tg:
            tg.start_soon(claimer)
            await waiting.wait()
            await ledger.approve("acme", task_id, spec.plan_hash, None)
    assert [lease.task_id for lease in got] == [task_id]


async def test_claim_racing_the_approval_in_one_batch_is_not_left_asleep(
    ledger: SqliteLedger,
) -> None:
    """A claim that finds nothing in the same group-commit batch as the approval that queues
    work must still be woken by it (no lost wake-up between the look and the wait)."""
    for i in range(20):
        spec = make_spec(f"race{i}")
        task_id = (await ledger.create_task(spec)).task_id
        got: list[Lease] = []

        async def claimer(into: list[Lease]) -> None:
            into.extend(await ledger.claim("r1", "default", 1, 60))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(claimer, got)
                tg.start_soon(ledger.approve, "acme", task_id, spec.plan_hash, None)
        assert [lease.task_id for lease in got] == [task_id]


async def test_an_approval_between_the_look_and_the_sleep_still_wakes_the_claim(
    ledger: SqliteLedger,
) -> None:
    """Deterministic form of the race above: the claim finds nothing, then the approval commits
    and fires before the claim sleeps."""
    spec = make_spec()
    task_id = (await ledger.create_task(spec)).task_id
    original = ledger.write
    interfered = False

    async def write_then_approve(rule: Any) -> Any:
        nonlocal interfered
        value = await original(rule)
        if not interfered and value == []:
            interfered = True
            await original(lambda tx: approve(tx, "acme", task_id, spec.plan_hash, None))
        return value

    ledger.write = write_then_approve  # type: ignore[method-assign]
    with anyio.fail_after(10):
        got = await ledger.claim("r1", "default", 1, 60)
    assert interfered
    assert [lease.task_id for lease in got] == [task_id]


async def test_claim_long_poll_gives_up_empty_after_wait_s(ledger: SqliteLedger) -> None:
    started = anyio.current_time()
    with anyio.fail_after(10):
        assert await ledger.claim("r1", "default", 1, 0.05) == []
    assert anyio.current_time() - started >= 0.05  # it did wait, then answered empty


async def test_stale_fences_are_refused_recorded_and_change_nothing(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    old = await claim_one(ledger)
    clock.advance(31)
    assert await ledger.expire() == 1
    new = await claim_one(ledger)
    assert new.fence > old.fence
    before = plain(await ledger.task(task_id))
    events_before = count(ledger, "events")
    with pytest.raises(StaleFence):
        await ledger.renew(old.step_id, old.fence)
    with pytest.raises(StaleFence):
        await ledger.release(old.step_id, old.fence, ReleaseReason.TRANSIENT, True, "x")
    with pytest.raises(StaleFence):
        await ledger.report(report_for(old))
    # A fence the step was never granted is no lease at all: `not_found`, as an unknown step,
    # and not recorded, so guessing fences teaches nothing (it was `stale_fence` before a
    # lease belonged to its token).
    with pytest.raises(NotFound):
        await ledger.renew(old.step_id, new.fence + 1000)
    after = plain(await ledger.task(task_id))
    # The one write that stands: the fenced-out result's tokens count toward the budget, once
    # (docs/design.md, Budgets).
    assert after["budget"]["spent"] == before["budget"]["spent"] + 3
    assert after["steps"][0]["attempts"][0]["usage"] == {"total_tokens": 3}
    after["budget"] = before["budget"]
    after["steps"][0]["attempts"][0]["usage"] = None
    assert {k: v for k, v in after.items() if k != "rejections"} == {
        k: v for k, v in before.items() if k != "rejections"
    }
    assert count(ledger, "events") == events_before
    assert [(r["code"], r["fence"], r["step_id"]) for r in after["rejections"]] == [
        ("stale_fence", old.fence, old.step_id),
        ("stale_fence", old.fence, old.step_id),
        ("stale_fence", old.fence, old.step_id),
    ]
    # The current holder is unaffected.
    assert (await ledger.renew(new.step_id, new.fence)).cancelled is False
    assert await ledger.report(report_for(new)) is Outcome.APPLIED


async def test_a_renewal_crossing_its_own_result_is_refused_but_not_recorded(
    ledger: SqliteLedger,
) -> None:
    """The runner renews while its result is out, so a renewal can reach the ledger after
    the result committed under the same fence: the lease is over (`stale_fence`), but the
    holder's step succeeded, so no rejected attempt is recorded for the review to question."""
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    assert await ledger.report(report_for(lease)) is Outcome.APPLIED
    with pytest.raises(StaleFence) as refused:
        await ledger.renew(lease.step_id, lease.fence)
    assert refused.value.code == "stale_fence"
    assert plain(await ledger.task(task_id))["rejections"] == []


async def test_payload_drift_is_refused_recorded_and_changes_nothing(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    before = plain(await ledger.task(task_id))
    drifted = report_for(lease)
    drifted = type(drifted)(
        step_id=lease.step_id, fence=lease.fence, payload_hash="f" * 64, output="x"
    )
    with pytest.raises(PayloadDrift):
        await ledger.report(drifted)
    after = plain(await ledger.task(task_id))
    assert after["steps"] == before["steps"]
    assert after["state"] == "RUNNING"
    assert [(r["code"], r["fence"]) for r in after["rejections"]] == [
        ("payload_drift", lease.fence)
    ]
    assert count(ledger, "effects") == 0


@pytest.mark.parametrize(
    "reason", [ReleaseReason.OPERATOR, ReleaseReason.SHUTDOWN, ReleaseReason.PREEMPTED]
)
async def test_operator_shutdown_and_preempted_releases_never_burn_the_step(
    ledger: SqliteLedger, reason: ReleaseReason
) -> None:
    task_id = await queued_task(ledger)
    for _ in range(12):  # more than max_attempts (5)
        lease = await claim_one(ledger)
        await ledger.release(lease.step_id, lease.fence, reason, True, "quota exhausted")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "RUNNING"
    assert view["steps"][0]["state"] == "queued"
    assert [a["state"] for a in view["steps"][0]["attempts"]] == ["released"] * 12
    lease = await claim_one(ledger)
    assert lease.attempt == 13
    assert await ledger.report(report_for(lease)) is Outcome.APPLIED


async def test_transient_releases_count_and_exhaust_max_attempts(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    for attempt in range(1, 6):
        lease = await claim_one(ledger)
        assert lease.attempt == attempt
        assert plain(await ledger.task(task_id))["state"] == "RUNNING"
        await ledger.release(lease.step_id, lease.fence, ReleaseReason.TRANSIENT, True, "503")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert "5 of 5 attempts" in view["reason"]
    assert view["steps"][0]["state"] == "failed"
    assert await ledger.claim("r1", "default", 1, 0) == []
    assert await ledger.violations() == []


async def test_uncounted_releases_do_not_reset_the_count(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    for i in range(8):
        lease = await claim_one(ledger)
        reason = ReleaseReason.TRANSIENT if i % 2 else ReleaseReason.OPERATOR
        await ledger.release(lease.step_id, lease.fence, reason, True, "flaky")
    assert plain(await ledger.task(task_id))["state"] == "RUNNING"  # 4 counted so far
    lease = await claim_one(ledger)
    await ledger.release(lease.step_id, lease.fence, ReleaseReason.TRANSIENT, True, "flaky")
    assert plain(await ledger.task(task_id))["state"] == "FAILED"


async def test_a_non_retryable_release_fails_the_task_with_its_reason(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger, steps=2)
    lease = await claim_one(ledger)
    await ledger.release(
        lease.step_id, lease.fence, ReleaseReason.INVALID, False, "model answered 400"
    )
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert "model answered 400" in view["reason"]
    assert [s["state"] for s in view["steps"]] == ["failed", "skipped"]  # never to run
    assert await ledger.claim("r1", "default", 5, 0) == []
    with pytest.raises(StaleFence):
        await ledger.renew(lease.step_id, lease.fence)


async def test_expiries_count_toward_max_attempts(ledger: SqliteLedger, clock: FakeClock) -> None:
    task_id = await queued_task(ledger)
    for _ in range(5):
        await claim_one(ledger)
        clock.advance(31)
        assert await ledger.expire() == 1
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert [a["state"] for a in view["steps"][0]["attempts"]] == ["expired"] * 5


async def test_an_unacknowledged_lease_is_reaped_after_the_accept_window(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    clock.advance(9.9)
    assert await ledger.expire() == 0
    clock.advance(0.1)
    assert await ledger.expire() == 1
    again = await claim_one(ledger, "r2")
    assert (again.step_id, again.attempt) == (lease.step_id, lease.attempt + 1)
    assert again.fence > lease.fence


async def test_an_acknowledged_lease_is_kept_until_its_ttl(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await queued_task(ledger)
    lease = await claim_one(ledger)
    clock.advance(1)
    await ledger.renew(lease.step_id, lease.fence)  # the acknowledgement
    clock.advance(28.9)  # 29.9 s after the grant, 28.9 after the renew
    assert await ledger.expire() == 0
    assert await ledger.claim("r2", "default", 1, 0) == []
    clock.advance(1.1)
    assert await ledger.expire() == 1


async def test_renewing_keeps_a_lease_alive_past_the_original_ttl(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    for _ in range(12):  # 108 s in all, more than three original TTLs
        clock.advance(9)  # inside the 10 s acceptance window, then well inside each TTL
        renewal = await ledger.renew(lease.step_id, lease.fence)
        assert (renewal.ttl_s, renewal.cancelled) == (30, False)
        assert await ledger.expire() == 0
    assert await ledger.report(report_for(lease)) is Outcome.APPLIED
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"


async def test_the_reaper_requeues_the_same_step_as_a_new_attempt_under_a_new_fence(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger, steps=2)
    first = await claim_one(ledger)
    await ledger.report(report_for(first))
    lease = await claim_one(ledger)
    await ledger.renew(lease.step_id, lease.fence)
    assert await ledger.next_deadline() == clock.now + 30
    clock.advance(30)
    assert await ledger.expire() == 1
    view = plain(await ledger.task(task_id))
    assert view["state"] == "RUNNING"
    assert [a["state"] for a in view["steps"][1]["attempts"]] == ["expired"]
    assert view["steps"][1]["state"] == "queued"
    again = await claim_one(ledger, "r2")
    assert again.step_id == lease.step_id
    assert again.attempt == lease.attempt + 1
    assert again.fence > lease.fence
    assert again.payload_hash == lease.payload_hash
    assert again.outputs == lease.outputs


async def test_a_preempted_release_requeues_at_once_uncounted_from_its_checkpoint(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    """A runner whose server is being reclaimed hands its step back `preempted`: the step is
    leasable in the same instant (no lease deadline or acceptance window to wait out, the
    clock never moves here), under a new fence, resuming from the checkpoint, and even with
    `max_attempts = 1` the step still has its one attempt."""
    async with open_ledger(ledger_db, clock, config=LedgerConfig(max_attempts=1)) as ledger:
        task_id = await queued_task(ledger)
        lease = await claim_one(ledger, "spot-a")
        checkpoint = Checkpoint(
            fence=lease.fence,
            turn=2,
            transcript="a" * 64,
            usage={"total_tokens": 20},
            step_usage={"total_tokens": 20},
        )
        await ledger.checkpoint(lease.step_id, checkpoint)
        await ledger.release(
            lease.step_id, lease.fence, ReleaseReason.PREEMPTED, True, "aws: terminate at 12:00"
        )
        again = await claim_one(ledger, "spot-b")
        assert (again.step_id, again.attempt) == (lease.step_id, 2)
        assert again.fence > lease.fence
        assert again.resume is not None
        assert (again.resume.turn, again.resume.fence) == (2, lease.fence)
        assert await ledger.report(report_for(again)) is Outcome.APPLIED
        view = plain(await ledger.task(task_id))
        assert view["state"] == "SUCCEEDED"
        attempts = view["steps"][0]["attempts"]
        assert [(a["runner_id"], a["state"]) for a in attempts] == [
            ("spot-a", "released"),
            ("spot-b", "committed"),
        ]
        assert attempts[0]["reason"] == "preempted: aws: terminate at 12:00"
        assert ledger.counters.leases_preempted == 1
        assert ledger.counters.leases_released == 1
        assert await ledger.violations() == []


async def test_max_attempts_comes_from_the_config(ledger_db: Path | str, clock: FakeClock) -> None:
    async with open_ledger(ledger_db, clock, config=LedgerConfig(max_attempts=1)) as ledger:
        task_id = await queued_task(ledger)
        lease = await claim_one(ledger)
        await ledger.release(lease.step_id, lease.fence, ReleaseReason.TRANSIENT, True, "503")
        assert plain(await ledger.task(task_id))["state"] == "FAILED"


@pytest.mark.parametrize("wake_by", ["commit", "release", "expiry"])
async def test_claim_long_poll_wakes_when_a_step_becomes_leasable(
    ledger: SqliteLedger, clock: FakeClock, wake_by: str
) -> None:
    """Work is queued not only by approval: the next step after a commit, a released step and a
    reaped step must each wake a claim that is already asleep."""
    task_id = await queued_task(ledger, steps=2)
    lease = await claim_one(ledger)
    waiting = asleep(ledger)
    got: list[Lease] = []

    async def claimer() -> None:
        got.extend(await ledger.claim("r2", "default", 1, 60))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claimer)
            await waiting.wait()
            if wake_by == "commit":
                await ledger.report(report_for(lease))
            elif wake_by == "release":
                await ledger.release(lease.step_id, lease.fence, ReleaseReason.SHUTDOWN, True, "")
            else:
                clock.advance(31)
                assert await ledger.expire() == 1
    expected = f"{task_id}.1" if wake_by == "commit" else lease.step_id
    assert [g.step_id for g in got] == [expected]
