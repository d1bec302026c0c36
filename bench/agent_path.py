"""Issue 17's agent figures after the runner's RSS with agent steps: lease -> first model call
with a warm mirror (the runner's cache in the work folder, and on tmpfs when there is one), a
turn's checkpoint with a 1 MB diff, a check's 10 MB artifact upload.

`python -m bench` takes them in its run; `python -m bench.agent_path` takes them alone at full
size (with the agent RSS reading) on a fresh supervisor and prints their rows of the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from bench import agent_checkpoint, agent_lease, agent_rss, agent_upload, machine, report, seed
from bench.procs import children
from bench.report import say
from bench.stack import Stack
from tether.logs import configure_logging

POOLS = (agent_lease.POOL, agent_lease.TMPFS_POOL, agent_upload.POOL)  # tokens before serving


def measure(
    r: dict[str, Any],
    stack: Stack,
    *,
    lease_files: int,
    lease_runs: int,
    checkpoint_files: int,
    checkpoint_rounds: int,
    upload_rounds: int,
    say: Callable[[str], None],
) -> None:
    """Take the figures on `stack`'s supervisor (started after `POOLS`' tokens) into `r`."""
    lease = agent_lease.run(stack, files=lease_files, runs=lease_runs)
    r["agent_lease"] = dataclasses.asdict(lease)
    r["agent_lease_first_call_p50_s"] = lease.p50_s
    r["agent_lease_first_call_max_s"] = lease.max_s
    say(
        f"lease -> first model call, {lease.files:,} files, warm mirror: p50 {lease.p50_s:.2f} s,"
        f" max {lease.max_s:.2f} s (cold {lease.cold_s:.2f} s)"
    )
    if agent_lease.TMPFS.is_dir():
        tmpfs = agent_lease.run(
            stack,
            files=lease_files,
            runs=lease_runs,
            pool=agent_lease.TMPFS_POOL,
            cache_root=agent_lease.TMPFS,
        )
        r["agent_lease_tmpfs"] = dataclasses.asdict(tmpfs)
        say(f"same, the runner's cache on tmpfs: p50 {tmpfs.p50_s:.2f} s, max {tmpfs.max_s:.2f} s")
    cost = anyio.run(
        agent_checkpoint.measure, checkpoint_files, 1_000_000, checkpoint_rounds, stack.workdir
    )
    r["agent_checkpoint"] = dataclasses.asdict(cost)
    r["agent_checkpoint_1mb_ms"] = cost.changed_median_ms
    parts = ", ".join(f"{name} {ms:.0f}" for name, ms in cost.breakdown_ms.items())
    say(
        f"checkpoint, 1 MB diff, {cost.files:,} files: {cost.changed_median_ms:.0f} ms"
        f" ({cost.changed_cpu_median_ms:.0f} ms CPU; ms by part: {parts})"
    )
    upload = agent_upload.run(stack, rounds=upload_rounds)
    r["agent_upload"] = dataclasses.asdict(upload)
    r["agent_upload_10mb_s"] = upload.median_s
    say(f"10 MB artifact upload: {upload.median_s:.2f} s, {upload.mb_per_s:.0f} MB/s")


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=None, help="where the work folder goes")
    args = parser.parse_args()
    configure_logging(json_lines=True, level="warning")
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-agent-", dir=args.dir))
    r: dict[str, Any] = {"machine": machine.describe(workdir)}
    try:
        db = workdir / "ledger.db"
        seed.create_tasks(db, "warm", 1, approve=False)
        with children(workdir) as kids:
            stack = Stack(kids=kids, workdir=workdir, db=db)
            for pool in (*POOLS, "agent-rss"):
                stack.token(pool)
            stack.start_supervisor()
            agents = agent_rss.run(stack, hold_s=2.0)
            r["runner_rss_10_agents_mb"] = agents.in_flight_mb
            r["agent_rss"] = dataclasses.asdict(agents)
            say(f"runner rss, 10 agent steps in flight: {agents.in_flight_mb:.0f} MB")
            measure(
                r,
                stack,
                lease_files=10_000,
                lease_runs=5,
                checkpoint_files=10_000,
                checkpoint_rounds=10,
                upload_rounds=5,
                say=say,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    m = r["machine"]
    print(
        f"machine: {m['nproc']} cores, {m['cpu_model']}; work folder on {m['ledger_filesystem']};"
        f" load average at start {m['loadavg_at_start'][0]:.2f}"
    )
    print("| measurement | value | ratio to disk / naive ceiling | target | met |")
    print("|---|---|---|---|---|")
    print("\n".join(report.agent_rows(r)))


if __name__ == "__main__":
    _main()
