"""Renewals: the sustained rate, and committed steps/s while 1,000 other leases renew.

Both use one load process (`bench.load`) that first claims its leases over HTTP from a pool of
its own and acknowledges them. `max_rate`: 64 connections renew 1,000 leases round robin as
fast as the supervisor replies. `steps_while_renewing`: 200 connections renew each of 1,000
leases once a second (five times a real runner's cadence at the default TTL) while real
runners run steps at concurrency 64, measured exactly as `bench.steps` does.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from bench import seed, steps
from bench.procs import JsonLines
from bench.stack import Stack

LEASES = 1000
# Each connection renews 5 leases a second, so a renewal may take up to 200 ms on time.
PACED_CONNECTIONS = 200


def _start_load(stack: Stack, mode: str, pool: str, seconds: float, concurrency: int) -> JsonLines:
    seed.create_tasks(stack.db, pool, LEASES, approve=True)
    token = stack.token(pool)
    proc = stack.kids.start(
        f"load-{mode}",
        [
            sys.executable,
            "-m",
            "bench.load",
            mode,
            "--url",
            stack.supervisor_url,
            "--token-file",
            str(token),
            "--leases",
            str(LEASES),
            "--seconds",
            str(seconds),
            "--concurrency",
            str(concurrency),
            "--period",
            "1",
        ],
        stdout_pipe=True,
    )
    lines = JsonLines(proc)
    lines.next(60)  # every lease claimed and acknowledged
    return lines


def max_rate(stack: Stack, *, seconds: float) -> dict[str, Any]:
    pool = "renew-max"
    lines = _start_load(stack, "renew-max", pool, seconds, 64)
    try:
        return lines.next(seconds + 30)
    finally:
        stack.kids.stop(lines.proc)
        seed.cancel_pool(stack.db, pool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnderRenewals:
    steps: steps.StepsRun
    renewals: dict[str, Any]


def steps_while_renewing(stack: Stack, *, seconds: float, tasks: int) -> UnderRenewals:
    pool = "renew-bg"
    budget = steps.STARTUP_S + seconds + 12
    prepared = steps.prepare(stack, concurrency=64, tasks=tasks, label="-renewing")
    lines = _start_load(stack, "renew-paced", pool, budget, PACED_CONNECTIONS)
    try:
        run = steps.run(stack, concurrency=64, seconds=seconds, tasks=0, prepared=prepared)
        renewals = lines.next(budget + 30)
    finally:
        stack.kids.stop(lines.proc)
        seed.cancel_pool(stack.db, pool)
    return UnderRenewals(steps=run, renewals=renewals)
