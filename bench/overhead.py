"""Claim->commit overhead at half of peak load, model time excluded.

Load: an operator load process approves one-step tasks over HTTP at half the peak steps/s
measured earlier (open loop: a fixed arrival rate, not a closed loop that slows down with the
system), while real runners with 64 slots long-poll for them; the stand-in model answers at
once. Overhead per step, from the ledger's own timestamps on the supervisor's clock:
`effects.created_at - attempts.granted_at` of the committing attempt. That span holds the
grant's fsync and answer, the model call to a zero-latency stand-in (its HTTP round trip,
~2 ms, is not subtracted: conservative), and the result request up to the moment its batch
runs. (A step this short sends no renew: its result acknowledges the lease.) It does not
hold the commit's own fsync, so one fsync (1/disk bound) is added to every figure reported.
"""

from __future__ import annotations

import dataclasses
import time

from bench import seed, steps
from bench.load import pct
from bench.stack import Stack


@dataclasses.dataclass(frozen=True, kw_only=True)
class Overhead:
    offered_per_s: float
    achieved_per_s: float
    steps: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    fsync_ms: float


def run(
    stack: Stack, *, rate: float, seconds: float, fsync_ms: float, pool: str = "half-peak"
) -> Overhead:
    count = int(rate * seconds) + 10
    tasks = seed.create_tasks(stack.db, pool, count, approve=False)
    stack.token(pool)
    runners = stack.start_runners(pool, pool, 64, steps.processes_for(64))
    try:
        time.sleep(steps.STARTUP_S)
        stack.approve_at(f"{pool}-approvals", tasks, rate=rate, seconds=seconds, concurrency=32)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (
            seed.steps_in_state(stack.db, pool, "queued")
            + seed.steps_in_state(stack.db, pool, "leased")
        ):
            time.sleep(0.2)
    finally:
        stack.kids.stop_all(runners, grace_s=10)
    rows = seed.step_rows(stack.db, pool)
    seed.cancel_pool(stack.db, pool)
    spans = [1000 * (c - g) + fsync_ms for g, c in rows]
    window = (max(c for _, c in rows) - min(g for g, _ in rows)) if rows else 0.0
    return Overhead(
        offered_per_s=rate,
        achieved_per_s=len(rows) / window if window > 0 else 0.0,
        steps=len(rows),
        p50_ms=pct(spans, 0.5),
        p99_ms=pct(spans, 0.99),
        max_ms=max(spans, default=0.0),
        fsync_ms=fsync_ms,
    )
