"""The runner's RSS: idle (long-polling a pool with no work) and with 100 steps in flight.

Idle: one `tether-runner` with concurrency 100 on an empty pool, measured after it has
settled, twice: as a borrowed server installs it (`make bench-runner-venv`: the wheel and its
base dependencies only, in bench/.runner-venv), which the target holds, and from the
developers' venv. They differ because httpx imports its command line (click, rich, pygments)
and structlog imports rich whenever those are installed, as the developers' tools install
them: about 7 MB at import alone.

In flight: the same runner on a pool of 100 queued tasks, served by a second stand-in model
that replies after 5 s, measured (highest of a few samples) while all 100 leases are held,
i.e. while 100 model calls are waiting.
"""

from __future__ import annotations

import dataclasses
import time

from bench import seed
from bench.procs import ROOT, tree_rss_mb
from bench.stack import Stack

IN_FLIGHT = 100
MODEL_LATENCY_S = 5.0
INSTALLED = ROOT / "bench" / ".runner-venv" / "bin" / "tether-runner"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerRss:
    idle_mb: float  # as installed when bench/.runner-venv exists, else the developers' venv
    idle_installed: bool
    idle_dev_venv_mb: float
    in_flight_mb: float
    in_flight: int


def idle_rss_mb(stack: Stack, settle_s: float, program: str | None = None) -> float:
    stack.token("rss-idle")
    [idle] = stack.start_runners("rss-idle", "rss-idle", IN_FLIGHT, 1, program=program)
    try:
        time.sleep(settle_s)
        return tree_rss_mb(idle.pid)
    finally:
        stack.kids.stop(idle)


def run(stack: Stack, *, settle_s: float = 3.0) -> RunnerRss:
    dev_mb = idle_rss_mb(stack, settle_s)
    installed = INSTALLED.exists()
    idle_mb = idle_rss_mb(stack, settle_s, str(INSTALLED)) if installed else dev_mb

    pool = "rss-busy"
    seed.create_tasks(stack.db, pool, IN_FLIGHT, approve=True)
    stack.token(pool)
    slow = Stack(
        kids=stack.kids, workdir=stack.workdir, db=stack.db, supervisor_url=stack.supervisor_url
    )
    slow.start_model(latency_s=MODEL_LATENCY_S)
    [busy] = slow.start_runners(pool, pool, IN_FLIGHT, 1)
    try:
        deadline = time.monotonic() + MODEL_LATENCY_S - 0.5 + settle_s
        leased = 0
        while time.monotonic() < deadline:
            leased = seed.steps_in_state(stack.db, pool, "leased")
            if leased >= IN_FLIGHT:
                break
            time.sleep(0.1)
        busy_mb = 0.0
        for _ in range(5):
            busy_mb = max(busy_mb, tree_rss_mb(busy.pid))
            time.sleep(0.3)
    finally:
        stack.kids.stop(busy, grace_s=10)
        if slow.model is not None:
            stack.kids.stop(slow.model)
        seed.cancel_pool(stack.db, pool)
    return RunnerRss(
        idle_mb=idle_mb,
        idle_installed=installed,
        idle_dev_venv_mb=dev_mb,
        in_flight_mb=busy_mb,
        in_flight=leased,
    )
