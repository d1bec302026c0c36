"""Shared fixtures: a fresh ledger file per test, driven by a clock the test controls."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.ledger import Checks, LedgerConfig, Report, SqliteLedger, StepSpec, TaskSpec, Tx
from supervisor.ledger.batch import Outcome, execute_batch
from supervisor.ledger.schema import open_ledger_file


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


def make_spec(key: str = "k1", steps: int = 1, tenant: str = "acme", **extra: Any) -> TaskSpec:
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


# -- helpers for the ledger unit tests (tests/test_ledger_*.py) -------------------------------


LEDGER_CONFIG = LedgerConfig(lease_ttl_s=30, accept_window_s=10)


def open_ledger(path: Path, clock: FakeClock, **kwargs: Any) -> Any:
    """`SqliteLedger.open` with the `ledger` fixture's settings, for tests that reopen a file."""
    kwargs.setdefault("config", LEDGER_CONFIG)
    return SqliteLedger.open(path, clock=clock, **kwargs)


def report_for(lease: Any, output: Any = "done", **extra: Any) -> Report:
    """The result a well-behaved runner sends for `lease`."""
    extra.setdefault("usage", {"total_tokens": 3})
    return Report(
        step_id=lease.step_id,
        fence=lease.fence,
        payload_hash=lease.payload_hash,
        output=output,
        **extra,
    )


def raw_db(path: Path) -> sqlite3.Connection:
    """A plain connection to a ledger file, for reading or planting rows by hand."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.row_factory = sqlite3.Row
    return db


def count(path: Path, table: str, where: str = "1", params: tuple[Any, ...] = ()) -> int:
    db = raw_db(path)
    try:
        return int(db.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}", params).fetchone()[0])
    finally:
        db.close()


@dataclasses.dataclass
class Sim:
    """Ledger rules run straight through `execute_batch` on one connection, as the schedule
    explorer runs them: no writer thread, a deterministic clock and ids."""

    db: sqlite3.Connection
    clock: FakeClock
    config: LedgerConfig = LEDGER_CONFIG
    checks: Checks = dataclasses.field(default_factory=Checks)
    ids: int = 0

    def new_id(self) -> str:
        self.ids += 1
        return f"t{self.ids}"

    def make_tx(self) -> Tx:
        return Tx(
            db=self.db, now=self.clock(), config=self.config, new_id=self.new_id, checks=self.checks
        )

    def batch(self, *rules: Callable[[Tx], Any]) -> list[Outcome]:
        return execute_batch(self.db, rules, self.make_tx).outcomes

    def run(self, rule: Callable[[Tx], Any]) -> Any:
        """One rule in its own batch: its value, or its error raised."""
        [outcome] = self.batch(rule)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value


@pytest.fixture
def sim(ledger_path: Path, clock: FakeClock) -> Iterator[Sim]:
    db = open_ledger_file(ledger_path, synchronous="OFF")
    try:
        yield Sim(db=db, clock=clock)
    finally:
        db.close()
