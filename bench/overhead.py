"""Claim->commit overhead at half of peak load, model time excluded: two readings.

Overhead per step comes from the ledger's own timestamps on the supervisor's clock:
`effects.created_at - attempts.granted_at` of the committing attempt, less the time the model
held the reply. That span holds the grant's fsync and reply, the model call's HTTP round trip
(to a stand-in on the same cores: not subtracted, conservative) and the result request up to
its batch, but not the commit's own fsync: one fsync (1/disk bound) is added to every figure.
"""

from __future__ import annotations

import dataclasses
import time

from bench import steps
from bench.load import pct
from bench.procs import MachineBusy
from bench.stack import Stack
from examples.standin_model import latency_for

SLOTS = 64
SPREAD = 0.9
PACED_RATE_MIN = 64.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Overhead:
    offered_per_s: float
    achieved_per_s: float
    steps: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    fsync_ms: float
    machine_busy_pct: float


def _summary(
    spans: list[float], *, rate: float, achieved: float, fsync_ms: float, busy: float
) -> Overhead:
    spans = [s + fsync_ms for s in spans]
    return Overhead(
        offered_per_s=rate,
        achieved_per_s=achieved,
        steps=len(spans),
        p50_ms=pct(spans, 0.5),
        p99_ms=pct(spans, 0.99),
        max_ms=max(spans, default=0.0),
        fsync_ms=fsync_ms,
        machine_busy_pct=busy,
    )


def _drain(stack: Stack, pool: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(
        stack.ledger.steps_in_state(pool, state) for state in ("queued", "leased")
    ):
        time.sleep(0.2)


def run(
    stack: Stack, *, rate: float, seconds: float, fsync_ms: float, pool: str = "half-peak"
) -> Overhead:
    """Approvals arriving one at a time at `rate`; the stand-in replies at once.

    The reading in the headline figure. An operator load process approves one-step tasks over
    HTTP at `rate` (open loop: a fixed arrival rate, not a closed loop that slows down with the
    system) while runners with 64 slots long-poll for them. Every step also costs an approval,
    and a claim and a result request of its own, which the peak (a queue drained) does not pay.
    """
    count = int(rate * seconds) + 10
    tasks = stack.ledger.create_tasks(pool, count, approve=False)
    stack.token(pool)
    runners = stack.start_runners(
        pool, pool, SLOTS, steps.processes_for(SLOTS, len(stack.supervisors))
    )
    busy = MachineBusy()
    try:
        time.sleep(steps.STARTUP_S)
        busy.start()
        stack.approve_at(f"{pool}-approvals", tasks, rate=rate, seconds=seconds, concurrency=32)
        busy_pct = busy.stop()
        _drain(stack, pool)
    finally:
        stack.kids.stop_all(runners, grace_s=10)
    rows = stack.ledger.step_rows(pool)
    stack.ledger.cancel_pool(pool)
    window = (max(c for _, c in rows) - min(g for g, _ in rows)) if rows else 0.0
    return _summary(
        [1000 * (c - g) for g, c in rows],
        rate=rate,
        fsync_ms=fsync_ms,
        busy=busy_pct,
        achieved=len(rows) / window if window > 0 else 0.0,
    )


def paced(
    stack: Stack, *, rate: float, seconds: float, fsync_ms: float, pool: str = "paced"
) -> Overhead:
    """A queue of approved tasks drained by 64 slots whose model replies take about
    64/`rate` s each; each step's own hold is subtracted.

    The peak's own work at half its rate. Holds spread evenly over +-90 % by a hash of the
    request (`examples.standin_model.latency_for`), so that replies do not arrive in waves; each
    step's hold is computed from its own messages.

    Counted: the steps granted within a window of `seconds` that opens once the slots have
    cycled twice (the fill, all 64 at once, is over) and closes while the runners still work,
    so that every counted step finishes under the same load (none in the shutdown's tail).
    The rate is at least `PACED_RATE_MIN`, so that no hold exceeds 1.9 s and a step still
    sends no renew (the first goes half a renew interval, 2.5 s here, after the grant).
    """
    rate = max(rate, PACED_RATE_MIN)
    hold = SLOTS / rate
    longest = hold * (1 + SPREAD)
    warm = steps.STARTUP_S + 2 * longest
    tasks = int(rate * (warm + seconds + longest)) + SLOTS + 10
    stack.ledger.create_tasks(pool, tasks, approve=True)
    stack.token(pool)
    stack.set_model_latency(hold, spread=SPREAD)
    busy = MachineBusy()
    try:
        runners = stack.start_runners(
            pool, pool, SLOTS, steps.processes_for(SLOTS, len(stack.supervisors))
        )
        try:
            time.sleep(warm)
            opened = time.time()  # the ledger stamps with the supervisor's clock, this one
            busy.start()
            time.sleep(seconds)
            closed = time.time()
            busy_pct = busy.stop()
            time.sleep(longest + 1.0)  # the counted steps finish before the runners stop
        finally:
            stack.kids.stop_all(runners, grace_s=10)
    finally:
        stack.set_model_latency(0.0)
    rows = stack.ledger.step_rows_with_messages(pool)
    stack.ledger.cancel_pool(pool)
    counted = [(g, c, m) for g, c, m in rows if opened <= g < closed]
    committed = sum(1 for _, c, _ in rows if opened <= c < closed)
    return _summary(
        [1000 * (c - g - latency_for(m, hold, SPREAD)) for g, c, m in counted],
        rate=rate,
        achieved=committed / (closed - opened),
        fsync_ms=fsync_ms,
        busy=busy_pct,
    )
