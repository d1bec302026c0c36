"""Committed steps/s end to end: real `tether-runner` processes, the real HTTP API, the stand-in
model at zero latency, at a given concurrency.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

from bench.procs import CpuMeter, JsonLines, tree_rss_mb
from bench.stack import Stack

STARTUP_S = 1.5
FIRST_STEP_S = 60.0  # the longest a run waits for its first committed step


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepsRun:
    concurrency: int
    processes: int
    steps: int
    succeeded: int
    seconds: float
    supervisor_rss_max_mb: float  # the largest supervisor's, with several
    supervisor_cpu_pct: float  # all supervisors together, with several
    runners_cpu_pct: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


def processes_for(concurrency: int, supervisors: int = 1) -> int:
    """Runner processes for a concurrency: one per 16 slots, at most one per core, as one would
    deploy runners on a box this size (more processes only share the same cores). Measured on
    this project's 2-core machine at 256 slots: two runners 689-703 steps/s, four 669, eight
    673; at 64: two 618-625, four 574-628, one 525-568 (one process is bound by its core).
    With several supervisors, at least one runner each (`Stack.start_runners` spreads them)."""
    per_core = max(1, min(os.cpu_count() or 1, math.ceil(concurrency / 16)))
    return max(per_core, min(supervisors, concurrency))


def tasks_for(rate: float, seconds: float) -> int:
    """About as many queued tasks as a run at `rate` can take. A claim costs more the deeper
    the queue (see `bench.claimcost`), so the queue is kept near what the window needs; a pool
    that drains early only shortens the window the rate is computed over."""
    return min(20_000, int(200 + 1.2 * rate * seconds))


def prepare(stack: Stack, *, concurrency: int, tasks: int, label: str = "") -> str:
    """Seed the run's pool and its runner token; answer the pool's name."""
    pool = f"steps-{concurrency}{label}"
    stack.ledger.create_tasks(pool, tasks, approve=True)
    stack.token(pool)
    return pool


def run(
    stack: Stack,
    *,
    concurrency: int,
    seconds: float,
    tasks: int,
    label: str = "",
    prepared: str | None = None,
) -> StepsRun:
    """Run real runners for `seconds` on a pool seeded with `tasks` (or on `prepared`).

    The pool holds more queued one-step tasks than the run can finish. The runners stop with
    SIGTERM (in-flight steps finish or are released). The rate is read from the ledger:
    committed steps divided by the time from the pool's first lease grant to its last commit,
    the count checked against SUCCEEDED tasks. Leftover tasks are then cancelled so they never
    sit in the queue during a later measurement.
    """
    pool = prepared or prepare(stack, concurrency=concurrency, tasks=tasks, label=label)
    runners = processes_for(concurrency, len(stack.supervisors))
    procs = stack.start_runners(pool, pool, concurrency, runners)
    rss = 0.0
    supervisors = stack.supervisors
    sup_cpu = [CpuMeter(p.pid) for p in supervisors]
    runner_cpu = [CpuMeter(p.pid) for p in procs]
    for meter in (*sup_cpu, *runner_cpu):
        meter.start()
    sup_pct = runners_pct = 0.0
    try:
        # Runners take about a second to start; the rate itself comes from ledger timestamps.
        # On a loaded machine they may take longer than that: the window stays open until a
        # first step has committed (at most FIRST_STEP_S), or a short one would hold none.
        started = time.monotonic()
        deadline = started + STARTUP_S + seconds
        while True:
            time.sleep(0.5)
            rss = max(rss, *(tree_rss_mb(p.pid) for p in supervisors))
            if stack.ledger.steps_in_state(pool, "queued") == 0:
                break
            now = time.monotonic()
            if now >= deadline and (
                now >= started + FIRST_STEP_S or stack.ledger.succeeded(pool) > 0
            ):
                break
        sup_pct = sum(m.stop() for m in sup_cpu)
        runners_pct = sum(m.stop() for m in runner_cpu)
    finally:
        stack.kids.stop_all(procs, grace_s=10)
    steps, window = stack.ledger.window(pool)
    done = stack.ledger.succeeded(pool)
    stack.ledger.cancel_pool(pool)
    return StepsRun(
        concurrency=concurrency,
        processes=len(procs),
        steps=steps,
        succeeded=done,
        seconds=window,
        supervisor_rss_max_mb=rss,
        supervisor_cpu_pct=sup_pct,
        runners_cpu_pct=runners_pct,
    )


def supervisor_only(
    stack: Stack, *, seconds: float, tasks: int, concurrency: int = 64, mode: str = "steps"
) -> float:
    """Steps/s with no runner and no model: one load process (`bench.load MODE`). `steps`
    loops claim -> renew -> result on 64 connections, one step at a time; `steps-shared` speaks
    the runner's protocol (claims of 16, the results of a claim in one request). What the
    supervisor itself can commit through HTTP."""
    pool = prepare(stack, concurrency=concurrency, tasks=tasks, label=f"-bare-{mode}")
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
            str(stack.token(pool)),
            "--seconds",
            str(seconds),
            "--concurrency",
            str(concurrency),
        ],
        stdout_pipe=True,
    )
    try:
        lines = JsonLines(proc)
        lines.next(30)
        lines.next(seconds + 30)
    finally:
        stack.kids.stop(proc)
    steps, window = stack.ledger.window(pool)
    stack.ledger.cancel_pool(pool)
    return steps / window if window > 0 else 0.0
