"""The supervisor's cost of 1,000 runners idle in long-poll: CPU (% of one core) and RSS.

Then, with the 1,000 polls still open, the cost of queued work in *another* pool while they
wait.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time

import httpx
import psutil

from bench import seed
from bench.procs import CpuMeter, JsonLines, tree_rss_mb
from bench.stack import Stack

POLLERS = 1000
WAIT_S = 25.0
WAKE_RATE = 10.0
WAKE_S = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Idle:
    pollers: int
    connections: int
    cpu_pct: float
    rss_mb: float
    rss_before_mb: float
    window_s: float
    wake_cpu_pct: float
    rules_per_approval: float


def established(pid: int) -> int:
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED)


def run(stack: Stack, *, window_s: float, settle_s: float = 3.0) -> Idle:
    """Measure the idle supervisor, then the same supervisor while another pool gets work.

    One load process (`bench.load idle`) holds 1,000 claim requests open at once, each with
    `wait_s` 25, on a pool that has no work, and re-issues each as it returns (every 25 s).
    Once all are sent and the supervisor holds 1,000 established connections, its CPU is
    measured over `window_s` (a full 25 s re-issue cycle in the full run) and its RSS at the
    end. Then an operator load approves tasks of another pool at 10 per second for 5 s: the
    supervisor's CPU over that, and the ledger rules it ran per approval (from `/metrics`).
    """
    assert stack.supervisor is not None
    pid = stack.supervisor.pid
    token = stack.token("idle")
    wake_tasks = seed.create_tasks(stack.db, "wake", int(WAKE_RATE * WAKE_S), approve=False)
    before = tree_rss_mb(pid)
    proc = stack.kids.start(
        "load-idle",
        [
            sys.executable,
            "-m",
            "bench.load",
            "idle",
            "--url",
            stack.supervisor_url,
            "--token-file",
            str(token),
            "--pollers",
            str(POLLERS),
            "--wait",
            str(WAIT_S),
            "--seconds",
            str(settle_s + window_s + WAKE_S + 20),
        ],
        stdout_pipe=True,
    )
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
        rules0 = _rules(stack)
        meter.start()
        fed = stack.approve_at(
            "wake-load", wake_tasks, rate=WAKE_RATE, seconds=WAKE_S, concurrency=4
        )
        approved = int(fed["approved"])
        wake_cpu = meter.stop()
        per_approval = (_rules(stack) - rules0) / max(1, approved)
    finally:
        stack.kids.stop(proc)
        seed.cancel_pool(stack.db, "wake")
    return Idle(
        pollers=POLLERS,
        connections=connections,
        cpu_pct=cpu,
        rss_mb=rss,
        rss_before_mb=before,
        window_s=window_s,
        wake_cpu_pct=wake_cpu,
        rules_per_approval=per_approval,
    )


def _rules(stack: Stack) -> int:
    """The rules the supervisor ran so far, from `/metrics` (read with a `metrics` token)."""
    secret = stack.token("scraper", "metrics").read_text().strip()
    answer = httpx.get(
        f"{stack.supervisor_url}/metrics", headers={"Authorization": f"Bearer {secret}"}, timeout=10
    )
    text = answer.text
    found = re.search(r"^tether_write_rules_total (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else 0
