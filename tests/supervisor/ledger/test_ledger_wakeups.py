"""Long-poll wake-ups are per pool: work queued for one pool does not wake the claims waiting
in another (with a thousand idle runners, a broadcast would cost a claim each per approval)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from tests.conftest import make_spec
from tether.supervisor.ledger import SqliteLedger, StorageError, batch
from tether.supervisor.ledger.batch import BatchResult, Rule, RuleOutcome

pytestmark = pytest.mark.backends


async def rules_committed(ledger: SqliteLedger, count: int) -> None:
    """Return once the ledger has committed `count` rules since it opened. A claim arms its
    wake-up before its first rule runs, so once that rule is committed the claim is waiting:
    whatever is committed after it wakes it. (`anyio.wait_all_tasks_blocked` cannot say this:
    a batch in the writer's thread looks blocked, and on PostgreSQL the listener's 0.1 s poll
    can keep it from ever returning.)"""
    while ledger.counters.batched_rules < count:  # noqa: ASYNC110 (a counter, no event)
        await anyio.sleep(0.005)


async def test_work_in_one_pool_wakes_only_that_pools_claims(ledger: SqliteLedger) -> None:
    granted: dict[str, list[str]] = {}
    cpu_granted = anyio.Event()

    async def wait_in(pool: str) -> None:
        leases = await ledger.claim(f"runner-{pool}", pool, 1, 30)
        granted[pool] = [lease.task_id for lease in leases]
        if pool == "cpu":
            cpu_granted.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            rules_before = ledger.counters.batched_rules
            tg.start_soon(wait_in, "gpu")
            tg.start_soon(wait_in, "cpu")
            await rules_committed(ledger, rules_before + 2)  # each claim looked once

            spec = make_spec("cpu-work", pool="cpu")
            created = await ledger.create_task(spec)
            await ledger.approve(spec.tenant, created.task_id, spec.plan_hash, None)
            await cpu_granted.wait()
            # A woken gpu claim would have queued its rule before this one.
            await ledger.write(lambda tx: None)

            # The two looks, create + approve, the woken cpu claim, the write above; the gpu
            # claim ran no rule after its first look.
            assert ledger.counters.batched_rules - rules_before == 6
            assert granted == {"cpu": [created.task_id]}
            tg.cancel_scope.cancel()


async def test_raising_a_budget_wakes_every_pool(ledger: SqliteLedger) -> None:
    spec = make_spec("budgeted", pool="gpu")
    await ledger.set_budget(spec.tenant, 0)
    created = await ledger.create_task(spec)
    await ledger.approve(spec.tenant, created.task_id, spec.plan_hash, None)
    granted: list[str] = []

    async def wait_in_gpu() -> None:
        granted.extend(lease.task_id for lease in await ledger.claim("r", "gpu", 1, 30))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            rules_before = ledger.counters.batched_rules
            tg.start_soon(wait_in_gpu)
            await rules_committed(ledger, rules_before + 1)
            assert granted == []  # over budget: the task waits
            await ledger.set_budget(spec.tenant, 1000)
    assert granted == [created.task_id]


async def test_a_batch_whose_commit_answer_was_lost_wakes_every_waiting_claim(
    ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding 5: COMMIT happened but its answer was lost (the connection dropped).
    The batch fails with a StorageError and tells nothing of what it woke, and on PostgreSQL
    this process's listener drops its own notification: every waiter is woken instead."""
    spec = make_spec("lost-answer", pool="gpu")
    created = await ledger.create_task(spec)
    committed = batch.execute_batch
    lost = StorageError("the ledger could not commit: server closed the connection")

    def answer_lost(db: Any, rules: Sequence[Rule], *args: Any, **kwargs: Any) -> BatchResult:
        committed(db, rules, *args, **kwargs)  # committed, then the answer is lost
        return BatchResult([RuleOutcome(error=lost) for _ in rules], set(), set())

    granted: list[str] = []

    async def wait_in_gpu() -> None:
        granted.extend(lease.task_id for lease in await ledger.claim("r", "gpu", 1, 30))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            rules_before = ledger.counters.batched_rules
            tg.start_soon(wait_in_gpu)
            await rules_committed(ledger, rules_before + 1)
            monkeypatch.setattr(batch, "execute_batch", answer_lost)
            with pytest.raises(StorageError):
                await ledger.approve(spec.tenant, created.task_id, spec.plan_hash, None)
            monkeypatch.setattr(batch, "execute_batch", committed)
    assert granted == [created.task_id]
