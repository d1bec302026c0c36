"""Shared fixtures: a fresh ledger file per test, driven by a clock the test controls."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.ledger import LedgerConfig, SqliteLedger, StepSpec, TaskSpec


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclasses.dataclass
class FakeClock:
    """The supervisor's clock, advanced by hand."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
async def ledger(ledger_path: Path, clock: FakeClock) -> AsyncIterator[SqliteLedger]:
    async with SqliteLedger.open(
        ledger_path, clock=clock, config=LedgerConfig(lease_ttl_s=30, accept_window_s=10)
    ) as opened:
        yield opened


def make_spec(
    key: str = "k1", steps: int = 1, tenant: str = "acme", **extra: Any
) -> TaskSpec:
    return TaskSpec(
        tenant=tenant,
        idempotency_key=key,
        steps=tuple(
            StepSpec(name=f"s{i}", kind="chat", payload={"cmd": "apply-patch", "rev": i})
            for i in range(steps)
        ),
        **extra,
    )


async def queued_task(ledger: SqliteLedger, key: str = "k1", steps: int = 1, **extra: Any) -> str:
    """Create and approve a task; answer its id."""
    spec = make_spec(key, steps, **extra)
    created = await ledger.create_task(spec)
    await ledger.approve(spec.tenant, created.task_id, spec.plan_hash, extra.get("base_sha"))
    return created.task_id
