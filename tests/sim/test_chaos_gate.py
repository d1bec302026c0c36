"""The chaos gate (docs/design.md, Proof obligations): the four trials of the first seed article
and the six injections of
the second, against the real ledger, on SQLite and on PostgreSQL. Each trial ends the same way:
every step that committed has exactly one effect, every other step none, each task is in the
state the trial expects, and the ledger's own invariant check finds nothing."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import FakeClock, make_spec, queued_task
from tests.pgledger import rows
from tests.plain import plain
from tests.supervisor.ledger.test_ledger_verification import add_repo, check_specs, ran
from tether.supervisor.ledger import (
    IdempotencyConflict,
    LedgerConfig,
    Report,
    StaleFence,
    TaskState,
    TerminalState,
)
from tether.supervisor.ledger.store import LedgerStore, open_ledger
from tether.supervisor.ledger.transitions import transition
from tether.supervisor.ledger.verification import Evidence
from tether.wire import Outcome, ReleaseReason
from tether.wire.records import Lease

CONFIG = LedgerConfig(lease_ttl_s=30, accept_window_s=10)
pytestmark = pytest.mark.backends


class Gate:
    """One trial's ledger, which the trial may crash and restart on the same file or
    database."""

    def __init__(self, db: Path | str, clock: FakeClock) -> None:
        self.db, self.clock = db, clock
        self._stack = contextlib.AsyncExitStack()
        self.ledger: LedgerStore

    async def start(self) -> None:
        self.ledger = await self._stack.enter_async_context(
            open_ledger(self.db, clock=self.clock, config=CONFIG)
        )

    async def restart(self) -> None:
        await self._stack.aclose()
        self._stack = contextlib.AsyncExitStack()
        await self.start()

    async def stop(self) -> None:
        await self._stack.aclose()


@dataclasses.dataclass(frozen=True)
class Expect:
    task_id: str
    state: TaskState


def result(lease: Lease, **extra: Any) -> Report:
    return Report(
        step_id=lease.step_id,
        fence=lease.fence,
        payload_hash=lease.payload_hash,
        output={"done": lease.step_id},
        usage={"total_tokens": 5},
        **extra,
    )


async def claim_one(ledger: LedgerStore, runner: str) -> Lease:
    [lease] = await ledger.claim(runner, "default", 1, 0)
    return lease


# -- the four trials of the first article ---------------------------------------------------


async def no_fault(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "no-fault")
    lease = await claim_one(gate.ledger, "runner-a")
    assert await gate.ledger.report(result(lease)) is Outcome.APPLIED
    assert await gate.ledger.report(result(lease)) is Outcome.REPLAYED
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def kill_before_commit(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "kill-before")
    first = await claim_one(gate.ledger, "runner-a")  # runner-a vanishes before reporting
    gate.clock.advance(CONFIG.lease_ttl_s + 1)
    assert await gate.ledger.expire() == 1
    again = await claim_one(gate.ledger, "runner-b")
    assert (again.step_id, again.attempt) == (first.step_id, first.attempt + 1)
    assert again.fence > first.fence
    assert await gate.ledger.report(result(again)) is Outcome.APPLIED
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def kill_after_commit(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "kill-after")
    lease = await claim_one(gate.ledger, "runner-a")
    assert await gate.ledger.report(result(lease)) is Outcome.APPLIED  # the ack is lost
    assert await gate.ledger.report(result(lease)) is Outcome.REPLAYED  # the retry
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def duplicate_delivery(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "dup-delivery", steps=2)
    lease = await claim_one(gate.ledger, "runner-a")
    outcomes: list[Outcome] = []

    async def deliver() -> None:
        outcomes.append(await gate.ledger.report(result(lease)))

    async with anyio.create_task_group() as tg:  # the network delivers the result twice at once
        for _ in range(3):
            tg.start_soon(deliver)
    assert sorted(outcomes) == [Outcome.APPLIED, Outcome.REPLAYED, Outcome.REPLAYED]
    last = await claim_one(gate.ledger, "runner-a")
    assert await gate.ledger.report(result(last)) is Outcome.APPLIED
    return [Expect(task_id, TaskState.SUCCEEDED)]


# -- the six injections of the second article -----------------------------------------------


async def duplicate_create(gate: Gate) -> list[Expect]:
    spec = make_spec("dup-create")
    created = []

    async def create() -> None:
        created.append(await gate.ledger.create_task(spec))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(create)
    assert len({c.task_id for c in created}) == 1
    assert sum(c.created for c in created) == 1
    with pytest.raises(IdempotencyConflict):
        await gate.ledger.create_task(make_spec("dup-create", steps=2))
    task_id = created[0].task_id
    await gate.ledger.approve(spec.tenant, task_id, spec.plan_hash, None)
    lease = await claim_one(gate.ledger, "runner-a")
    assert await gate.ledger.report(result(lease)) is Outcome.APPLIED
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def crash_after_write(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "crash-after-write", steps=2)
    lease = await claim_one(gate.ledger, "runner-a")
    assert await gate.ledger.report(result(lease)) is Outcome.APPLIED
    await gate.restart()  # the supervisor dies after the commit, before the answer
    assert await gate.ledger.report(result(lease)) is Outcome.REPLAYED
    second = await claim_one(gate.ledger, "runner-a")
    assert second.fence > lease.fence  # the fence counter survived the crash
    assert await gate.ledger.report(result(second)) is Outcome.APPLIED
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def late_running_event(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "late-running")
    lease = await claim_one(gate.ledger, "runner-a")
    assert await gate.ledger.report(result(lease)) is Outcome.APPLIED
    last_seq = plain(await gate.ledger.task(task_id))["seq"]
    with pytest.raises(StaleFence):
        await gate.ledger.renew(lease.step_id, lease.fence)
    with pytest.raises(StaleFence):
        await gate.ledger.release(lease.step_id, lease.fence, ReleaseReason.TRANSIENT, True, "late")
    with pytest.raises(TerminalState):
        await gate.ledger.write(lambda tx: transition(tx, task_id, TaskState.RUNNING))
    view = plain(await gate.ledger.task(task_id))
    assert view["seq"] == last_seq  # nothing was appended to the journal
    # The renew crossed its own committed result (LeaseOver): refused, not recorded; the
    # release after it and the transition are.
    assert [r["code"] for r in view["rejections"]] == ["stale_fence", "terminal"]
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def expired_lease(gate: Gate) -> list[Expect]:
    task_id = await queued_task(gate.ledger, "expired")
    old = await claim_one(gate.ledger, "runner-a")
    await gate.ledger.renew(old.step_id, old.fence)
    gate.clock.advance(CONFIG.lease_ttl_s + 5)  # runner-a is paused past its TTL
    assert await gate.ledger.expire() == 1
    new = await claim_one(gate.ledger, "runner-b")
    assert new.fence > old.fence
    with pytest.raises(StaleFence):
        await gate.ledger.renew(old.step_id, old.fence)
    with pytest.raises(StaleFence):
        await gate.ledger.report(result(old))
    assert await gate.ledger.report(result(new)) is Outcome.APPLIED
    rejected = plain(await gate.ledger.task(task_id))["rejections"]
    assert [(r["code"], r["fence"]) for r in rejected] == [("stale_fence", old.fence)] * 2
    return [Expect(task_id, TaskState.SUCCEEDED)]


async def changed_base(gate: Gate) -> list[Expect]:
    await add_repo(gate.ledger)
    spec = make_spec("changed-base", repository="repo", base_sha="sha0", checks=check_specs())
    task_id = (await gate.ledger.create_task(spec)).task_id
    await gate.ledger.approve("acme", task_id, spec.plan_hash, "sha0", "sha0")
    lease = await claim_one(gate.ledger, "runner-a")
    # The base moves mid-step: the supervisor reads the new head when the result arrives.
    report = result(lease, **ran("cand1"))
    assert await gate.ledger.report(report, evidence=Evidence(head_sha="sha1")) is Outcome.APPLIED
    view = plain(await gate.ledger.task(task_id))
    assert view["reason"] == "stale_base: approved sha0, repository repo is at sha1"
    # A webhook telling the same fails a second task on the old base at once, mid-step too.
    other = make_spec("changed-base-2", repository="repo", base_sha="sha1", checks=check_specs())
    other_id = (await gate.ledger.create_task(other)).task_id
    await gate.ledger.approve("acme", other_id, other.plan_hash, "sha1", "sha1")
    second = await claim_one(gate.ledger, "runner-a")
    await gate.ledger.set_repository_head("acme", "repo", "sha2")
    with pytest.raises(TerminalState):
        await gate.ledger.report(result(second, **ran("cand2")), evidence=Evidence(head_sha="sha2"))
    return [Expect(task_id, TaskState.FAILED), Expect(other_id, TaskState.FAILED)]


async def cancel_success_race(gate: Gate) -> list[Expect]:
    ledger = gate.ledger
    expects = []
    for key, cancel_first in (("race-cancel-first", True), ("race-report-first", False)):
        task_id = await queued_task(ledger, key)
        lease = await claim_one(ledger, "runner-a")
        if cancel_first:
            await ledger.cancel("acme", task_id, "operator changed its mind")
            with pytest.raises(TerminalState):
                await ledger.report(result(lease))
            expects.append(Expect(task_id, TaskState.CANCELLED))
        else:
            assert await ledger.report(result(lease)) is Outcome.APPLIED
            with pytest.raises(TerminalState):
                await ledger.cancel("acme", task_id, "too late")
            expects.append(Expect(task_id, TaskState.SUCCEEDED))
        assert [r["code"] for r in plain(await ledger.task(task_id))["rejections"]] == ["terminal"]

    task_id = await queued_task(ledger, "race-together")
    lease = await claim_one(ledger, "runner-a")
    outcomes: dict[str, object] = {}

    async def attempt(name: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            outcomes[name] = await call()
        except TerminalState as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt, "cancel", lambda: ledger.cancel("acme", task_id, "race"))
        tg.start_soon(attempt, "report", lambda: ledger.report(result(lease)))
    losers = [n for n, v in outcomes.items() if isinstance(v, TerminalState)]
    assert len(losers) == 1  # exactly one terminal outcome; the loser is a rejected attempt
    winner = TaskState.SUCCEEDED if losers == ["cancel"] else TaskState.CANCELLED
    expects.append(Expect(task_id, winner))
    return expects


TRIALS: dict[str, Callable[[Gate], Awaitable[list[Expect]]]] = {
    "no fault": no_fault,
    "kill before commit": kill_before_commit,
    "kill after commit": kill_after_commit,
    "duplicate delivery": duplicate_delivery,
    "duplicate create": duplicate_create,
    "crash after write": crash_after_write,
    "late running event": late_running_event,
    "expired lease": expired_lease,
    "changed base": changed_base,
    "cancel/success race": cancel_success_race,
}


@contextlib.asynccontextmanager
async def gate_on(db: Path | str, clock: FakeClock) -> AsyncIterator[Gate]:
    gate = Gate(db, clock)
    await gate.start()
    try:
        yield gate
    finally:
        await gate.stop()


@pytest.mark.parametrize("trial", list(TRIALS))
async def test_chaos_gate(trial: str, ledger_db: Path | str, clock: FakeClock) -> None:
    async with gate_on(ledger_db, clock) as gate:
        expects = await TRIALS[trial](gate)
        ledger = gate.ledger
        effects = dict(
            rows(
                gate.db,
                "SELECT s.id, COUNT(e.effect_key) FROM steps s"
                " LEFT JOIN effects e ON e.step_id = s.id GROUP BY s.id",
            )
        )
        assert expects
        for expect in expects:
            view = plain(await ledger.task(expect.task_id))
            assert view["state"] == expect.state, view
            for step in view["steps"]:
                assert effects[step["id"]] == (1 if step["state"] == "committed" else 0), step
            if expect.state is TaskState.SUCCEEDED:
                assert all(step["state"] == "committed" for step in view["steps"])
        assert await ledger.violations() == []
