"""Effects and verification (docs/design.md, The invariant; Verification): one effect per step
keyed by its identity, replays
answered without a second effect. Repository-bound tasks' evidence: test_ledger_verification.py."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anyio
import pytest

from tests.conftest import FakeClock, count, queued_task, report_for
from tests.plain import plain
from tests.supervisor.ledger.test_ledger_fencing import asleep
from tether.supervisor.ledger import (
    InvalidRequest,
    Lease,
    SqliteLedger,
    TerminalState,
)
from tether.wire import Outcome, effect_key

pytestmark = pytest.mark.backends

CHECKS = ("tests", "lint")


async def claim_one(ledger: SqliteLedger) -> Lease:
    [lease] = await ledger.claim("r1", "default", 1, 0)
    return lease


async def test_a_replayed_report_answers_replayed_and_adds_no_effect(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    task_id = await queued_task(ledger, steps=2)
    lease = await claim_one(ledger)
    assert await ledger.report(report_for(lease, output="first")) is Outcome.APPLIED
    events = count(ledger, "events")
    clock.advance(5)
    for output in ("first", "a different output", "first"):
        assert await ledger.report(report_for(lease, output=output)) is Outcome.REPLAYED
    assert count(ledger, "effects") == 1
    assert count(ledger, "events") == events
    view = plain(await ledger.task(task_id))
    assert view["steps"][0]["output"] == "first"
    assert view["state"] == "RUNNING"
    assert view["rejections"] == []


async def test_the_effect_key_is_sha256_of_step_id_and_payload_hash(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.report(report_for(lease))
    [step] = plain(await ledger.task(task_id))["steps"]
    canonical = json.dumps([lease.step_id, lease.payload_hash], separators=(",", ":"))
    expected = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert step["effect_key"] == expected == effect_key(lease.step_id, lease.payload_hash)
    assert step["payload_hash"] == lease.payload_hash
    assert step["id"] == lease.step_id


async def test_tokens_spent_are_added_to_the_tenant_s_usage(ledger: SqliteLedger) -> None:
    await queued_task(ledger, steps=2)
    await ledger.report(report_for(await claim_one(ledger), usage={"total_tokens": 7}))
    await ledger.report(
        report_for(await claim_one(ledger), usage={"prompt_tokens": 2, "completion_tokens": 3})
    )
    assert count(ledger, "tenants", "name = 'acme' AND tokens_used = 12") == 1


async def test_cancel_then_success_one_terminal_outcome_the_report_is_the_rejection(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.cancel("acme", task_id, "race")
    with pytest.raises(TerminalState):
        await ledger.report(report_for(lease))
    view = plain(await ledger.task(task_id))
    assert view["state"] == "CANCELLED"
    assert count(ledger, "effects") == 0
    assert [(r["code"], r["step_id"]) for r in view["rejections"]] == [("terminal", lease.step_id)]
    assert await terminal_events(ledger, task_id) == ["CANCELLED"]


async def test_success_then_cancel_one_terminal_outcome_the_cancel_is_the_rejection(
    ledger: SqliteLedger,
) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    await ledger.report(report_for(lease))
    with pytest.raises(TerminalState):
        await ledger.cancel("acme", task_id, "race")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "SUCCEEDED"
    assert count(ledger, "effects") == 1
    assert [r["code"] for r in view["rejections"]] == ["terminal"]
    assert await terminal_events(ledger, task_id) == ["SUCCEEDED"]


async def test_cancel_and_success_submitted_together_end_exactly_once(
    ledger: SqliteLedger,
) -> None:
    for i in range(10):
        task_id = await queued_task(ledger, f"race{i}")
        lease = await claim_one(ledger)
        errors: list[str] = []

        async def attempt(call: Any, *args: Any, into: list[str] = errors) -> None:
            try:
                await call(*args)
            except TerminalState as exc:
                into.append(exc.code.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, ledger.report, report_for(lease))
            tg.start_soon(attempt, ledger.cancel, "acme", task_id, "race")
        view = plain(await ledger.task(task_id))
        assert errors == ["terminal"]
        assert view["state"] in {"SUCCEEDED", "CANCELLED"}
        assert len(await terminal_events(ledger, task_id)) == 1
        assert [r["code"] for r in view["rejections"]] == ["terminal"]
    assert await ledger.violations() == []


async def terminal_events(ledger: SqliteLedger, task_id: str) -> list[str]:
    return [
        e["state"]
        for e in plain(await ledger.events(task_id, None, 0, 0))
        if e["kind"] == "state" and e["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}
    ]


async def test_a_spent_budget_holds_leases_back_without_failing_tasks(
    ledger: SqliteLedger,
) -> None:
    await ledger.set_budget("acme", 5)
    first = await queued_task(ledger, "k1")
    await ledger.report(report_for(await claim_one(ledger), usage={"total_tokens": 5}))
    assert plain(await ledger.task(first))["state"] == "SUCCEEDED"
    waiting = await queued_task(ledger, "k2")
    other = await queued_task(ledger, "k3", tenant="globex")
    # Only the other tenant's work is handed out; acme's task waits in QUEUED.
    assert [lease.task_id for lease in await ledger.claim("r1", "default", 5, 0)] == [other]
    assert plain(await ledger.task(waiting))["state"] == "QUEUED"
    await ledger.set_budget("acme", 100)
    [lease] = await ledger.claim("r1", "default", 5, 0)
    assert lease.task_id == waiting


async def test_raising_the_budget_wakes_a_waiting_claim(ledger: SqliteLedger) -> None:
    await ledger.set_budget("acme", 0)
    task_id = await queued_task(ledger)
    waiting = asleep(ledger)
    got: list[Lease] = []

    async def claimer() -> None:
        got.extend(await ledger.claim("r1", "default", 1, 60))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claimer)
            await waiting.wait()
            await ledger.set_budget("acme", None)
    assert [lease.task_id for lease in got] == [task_id]


async def test_a_negative_budget_is_refused(ledger: SqliteLedger) -> None:
    with pytest.raises(InvalidRequest):
        await ledger.set_budget("acme", -1)
