"""Approve and cancel (docs/design.md, Approval): approval binds the plan hash and base SHA and
queues at once;
cancel ends any task that has not ended, and a terminal task refuses, on the record."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import FakeClock, count, make_spec, queued_task, report_for
from tests.plain import plain
from tests.supervisor.ledger.test_ledger_verification import add_repo
from tether.supervisor.ledger import (
    InvalidRequest,
    InvalidTransition,
    NotFound,
    PlanMismatch,
    SqliteLedger,
    TaskState,
    TerminalState,
)
from tether.supervisor.ledger.transitions import transition
from tether.wire import ReleaseReason

pytestmark = pytest.mark.backends


async def state_events(ledger: SqliteLedger, task_id: str) -> list[str]:
    return [
        e["state"] for e in plain(await ledger.events(task_id, None, 0, 0)) if e["kind"] == "state"
    ]


async def rejections(ledger: SqliteLedger, task_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = plain(await ledger.task(task_id))["rejections"]
    return rows


async def test_plan_mismatch_is_refused_and_changes_nothing(ledger: SqliteLedger) -> None:
    spec = make_spec()
    task_id = (await ledger.create_task(spec)).task_id
    before = plain(await ledger.task(task_id))
    with pytest.raises(PlanMismatch):
        await ledger.approve("acme", task_id, "0" * 64, None)
    after = plain(await ledger.task(task_id))
    assert after == before
    assert after["state"] == "PLANNED"
    assert count(ledger, "events") == 1


async def test_approve_binds_the_base_and_queues_with_two_events(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec(repository="repo", base_sha="declared")
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, "base1", "base1")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "QUEUED"
    assert view["base_sha"] == "base1"
    events = plain(await ledger.events(task_id, None, 0, 0))
    assert [(e["kind"], e["state"]) for e in events] == [
        ("state", "PLANNED"),
        ("state", "APPROVED"),
        ("state", "QUEUED"),
    ]
    assert events[1]["data"]["base_sha"] == "base1"
    assert events[1]["data"]["plan_hash"] == spec.plan_hash
    assert events[1]["seq"] < events[2]["seq"]
    assert [s["state"] for s in view["steps"]] == ["queued"]


async def test_repeating_the_same_approval_is_answered_as_done(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec(repository="repo")
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, "base1", "base1")
    before = plain(await ledger.events(task_id, None, 0, 0))
    await ledger.approve("acme", task_id, spec.plan_hash, "base1", "base1")
    assert plain(await ledger.events(task_id, None, 0, 0)) == before
    assert plain(await ledger.task(task_id))["rejections"] == []


async def test_approving_again_with_another_base_is_refused(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec(repository="repo")
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, "base1", "base1")
    with pytest.raises(InvalidTransition):
        await ledger.approve("acme", task_id, spec.plan_hash, "base2", "base2")
    view = plain(await ledger.task(task_id))
    assert (view["state"], view["base_sha"]) == ("QUEUED", "base1")
    assert [r["code"] for r in view["rejections"]] == ["invalid_transition"]


async def test_a_repository_task_needs_a_base_sha(ledger: SqliteLedger) -> None:
    await add_repo(ledger)
    spec = make_spec(repository="repo")
    task_id = (await ledger.create_task(spec)).task_id
    with pytest.raises(InvalidRequest):
        await ledger.approve("acme", task_id, spec.plan_hash, None, "base1")
    assert plain(await ledger.task(task_id))["state"] == "PLANNED"
    assert await state_events(ledger, task_id) == ["PLANNED"]


async def test_another_tenant_cannot_see_or_touch_the_task(ledger: SqliteLedger) -> None:
    spec = make_spec()
    task_id = (await ledger.create_task(spec)).task_id
    with pytest.raises(NotFound):
        await ledger.approve("globex", task_id, spec.plan_hash, None)
    with pytest.raises(NotFound):
        await ledger.cancel("globex", task_id, "mine now")
    assert plain(await ledger.task(task_id))["state"] == "PLANNED"


async def planned(ledger: SqliteLedger) -> str:
    return (await ledger.create_task(make_spec())).task_id


async def approved(ledger: SqliteLedger) -> str:
    """APPROVED is passed through inside approve's one transaction; this stops a task there."""
    spec = make_spec()
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.write(lambda tx: transition(tx, task_id, TaskState.APPROVED))
    return task_id


async def queued(ledger: SqliteLedger) -> str:
    return await queued_task(ledger)


async def running(ledger: SqliteLedger) -> str:
    task_id = await queued_task(ledger)
    await ledger.claim("r1", "default", 1, 0)
    return task_id


@pytest.mark.parametrize(
    ("make", "state"),
    [(planned, "PLANNED"), (approved, "APPROVED"), (queued, "QUEUED"), (running, "RUNNING")],
)
async def test_cancel_ends_a_task_that_has_not_ended(
    ledger: SqliteLedger, make: Any, state: str
) -> None:
    task_id = await make(ledger)
    assert plain(await ledger.task(task_id))["state"] == state
    await ledger.cancel("acme", task_id, "changed my mind")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "CANCELLED"
    assert view["reason"] == "changed my mind"
    # A step that was leased is cancelled; one that never ran is shown as skipped.
    assert all(s["state"] == ("cancelled" if s["attempts"] else "skipped") for s in view["steps"])
    assert all(a["state"] != "leased" for s in view["steps"] for a in s["attempts"])
    assert (await state_events(ledger, task_id))[-2:] == [state, "CANCELLED"]
    assert await ledger.claim("r2", "default", 1, 0) == []
    assert await ledger.violations() == []


async def test_cancelling_an_ended_task_is_refused_and_recorded(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    [lease] = await ledger.claim("r1", "default", 1, 0)
    await ledger.report(report_for(lease))
    assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"
    with pytest.raises(TerminalState):
        await ledger.cancel("acme", task_id, "too late")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    assert [r["code"] for r in view["rejections"]] == ["terminal"]
    with pytest.raises(TerminalState):
        await ledger.cancel("acme", task_id, "again")
    assert len(await rejections(ledger, task_id)) == 2


async def test_a_running_step_learns_of_the_cancel_at_renew_and_its_result_is_refused(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger)
    [lease] = await ledger.claim("r1", "default", 1, 0)
    assert (await ledger.renew(lease.step_id, lease.fence)).cancelled is False
    await ledger.cancel("acme", task_id, "stop")
    renewal = await ledger.renew(lease.step_id, lease.fence)
    assert renewal.cancelled is True
    clock.advance(1)
    with pytest.raises(TerminalState):
        await ledger.report(report_for(lease))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "CANCELLED"
    assert view["steps"][0]["effect_key"] is None
    assert [(r["code"], r["fence"]) for r in view["rejections"]] == [("terminal", lease.fence)]
    # A release after the cancel is answered quietly: the runner was going to stop anyway.
    await ledger.release(lease.step_id, lease.fence, ReleaseReason.SHUTDOWN, True, "bye")
    assert plain(await ledger.task(task_id))["state"] == "CANCELLED"
