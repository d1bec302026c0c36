"""The supervisor's cost of 1,000 runners idle in long-poll: CPU (% of one core) and RSS.

One load process (`bench.load idle`) holds 1,000 claim requests open at once, each with
`wait_s` 25, on a pool that has no work, and re-issues each as it is answered (every 25 s).
Once all 1,000 are sent and the supervisor holds 1,000 established connections, its CPU is
measured over a window (a full 25 s re-issue cycle in the full run) and its RSS at the end.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import psutil

from bench.procs import CpuMeter, JsonLines, tree_rss_mb
from bench.stack import Stack

POLLERS = 1000
WAIT_S = 25.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Idle:
    pollers: int
    connections: int
    cpu_pct: float
    rss_mb: float
    rss_before_mb: float
    window_s: float


def established(pid: int) -> int:
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED)


def run(stack: Stack, *, window_s: float, settle_s: float = 3.0) -> Idle:
    assert stack.supervisor is not None
    pid = stack.supervisor.pid
    token = stack.token("idle")
    before = tree_rss_mb(pid)
    proc = stack.kids.start(
        "load-idle",
        [sys.executable, "-m", "bench.load", "idle", "--url", stack.supervisor_url,
         "--token-file", str(token), "--pollers", str(POLLERS), "--wait", str(WAIT_S),
         "--seconds", str(settle_s + window_s + 5)],
        stdout_pipe=True,
    )  # fmt: skip
    try:
        JsonLines(proc).next(60)
        deadline = time.monotonic() + settle_s + 10
        time.sleep(settle_s)
        while established(pid) < POLLERS and time.monotonic() < deadline:
            time.sleep(0.2)
        connections = established(pid)
        meter = CpuMeter(pid)
        meter.start()
        time.sleep(window_s)
        cpu = meter.stop()
        rss = tree_rss_mb(pid)
    finally:
        stack.kids.stop(proc)
    return Idle(
        pollers=POLLERS, connections=connections, cpu_pct=cpu, rss_mb=rss,
        rss_before_mb=before, window_s=window_s,
    )  # fmt: skip
