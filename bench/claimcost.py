"""What one claim costs the writer as the queue grows: the claim rule alone, in process.

A claim runs inside the writer's transaction, so its cost is paid once per claim by every
batch. Here the `fencing.claim` rule (capacity 1) runs 50 times, each in its own batch with
`synchronous=OFF` (no fsync: the rule's own work only), against a pool of N queued one-step
tasks behind 5,000 finished ones, for a few N.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import seed
from tether.supervisor.ledger import LedgerConfig, Tx, fencing
from tether.supervisor.ledger.batch import Transactions
from tether.supervisor.ledger.schema import connect

REPEATS = 50


def ms_per_claim(directory: Path, queued: int) -> float:
    path = directory / f"claimcost-{queued}.db"
    seed.create_tasks(path, "done", 5000, approve=True)
    seed.cancel_pool(path, "done")
    seed.create_tasks(path, "work", queued, approve=True)
    db = connect(path, synchronous="OFF")
    try:
        transactions = Transactions(db=db, config=LedgerConfig(), clock=time.time)

        def claim(tx: Tx) -> object:
            return fencing.claim(tx, "claimcost", "work", 1)

        start = time.perf_counter()
        for _ in range(REPEATS):
            [outcome] = transactions.run([claim]).outcomes
            if outcome.error is not None:
                raise outcome.error
        return 1000 * (time.perf_counter() - start) / REPEATS
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def run(directory: Path, depths: tuple[int, ...]) -> dict[str, float]:
    return {str(n): ms_per_claim(directory, n) for n in depths}
