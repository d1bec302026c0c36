"""Before and after group commit: the ledger alone, in process, at concurrency 64.

64 workers each loop claim (capacity 1, no wait) -> renew (one renewal, as a step that outlives
half a renew interval sends) -> result on pre-queued one-step tasks, as a runner would but
without HTTP. Run once with the stock `SqliteLedger` (the writer takes every waiting rule into
one transaction) and once with `OneRulePerBatch`, a bench-local subclass whose writer takes one
rule per transaction, i.e. one fsync per rule: the ledger as it would be without group commit.
The supervisor's code is not touched; the subclass only overrides how a batch is gathered.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import anyio

from bench import seed
from tether.supervisor.ledger import Report, SqliteLedger


class OneRulePerBatch(SqliteLedger):
    """The ledger without group commit: every rule is its own transaction and fsync."""

    max_batch = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class LedgerRun:
    steps: int
    seconds: float
    batches: int
    rules: int

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def rules_per_batch(self) -> float:
        return self.rules / self.batches if self.batches else 0.0


async def _drive(ledger: SqliteLedger, pool: str, workers: int) -> int:
    done = 0

    async def worker(n: int) -> None:
        nonlocal done
        while True:
            leases = await ledger.claim(f"w{n}", pool, 1, 0.0)
            if not leases:
                return
            lease = leases[0]
            await ledger.renew(lease.step_id, lease.fence, pool)
            await ledger.report(
                Report(
                    step_id=lease.step_id,
                    fence=lease.fence,
                    payload_hash=lease.payload_hash,
                    output={"text": "ok"},
                    usage={"total_tokens": 1},
                ),
                pool,
            )
            done += 1

    async with anyio.create_task_group() as tg:
        for n in range(workers):
            tg.start_soon(worker, n)
    return done


def run(path: Path, *, batching: bool, tasks: int, workers: int = 64) -> LedgerRun:
    pool = "gc-on" if batching else "gc-off"
    seed.create_tasks(path, pool, tasks, approve=True)
    cls: Any = SqliteLedger if batching else OneRulePerBatch

    async def main() -> LedgerRun:
        async with cls.open(path, synchronous="FULL") as ledger:
            b0, r0 = ledger.counters.batches, ledger.counters.batched_rules
            start = time.perf_counter()
            steps = await _drive(ledger, pool, workers)
            seconds = time.perf_counter() - start
            return LedgerRun(
                steps=steps,
                seconds=seconds,
                batches=ledger.counters.batches - b0,
                rules=ledger.counters.batched_rules - r0,
            )

    return anyio.run(main)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for on in (False, True):
            r = run(Path(d) / "gc.db", batching=on, tasks=2000)
            print(f"batching={on}: {r.steps_per_s:.0f} steps/s, {r.rules_per_batch:.1f} rules")
