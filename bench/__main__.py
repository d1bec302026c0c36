"""`python -m bench [--quick | --smoke]`: every measurement of issue 6, in one run, here.

Order: the disk's bound; group commit off/on (in process); then one supervisor on one ledger
file in a fresh work directory: 1,000 idle long-polls (first, on a fresh supervisor), runner
RSS, steps/s at 1/16/64/256, model calls alone (no tether), the supervisor alone, overhead at
half of the peak, renewals, steps under renewals; then the peers. Runner RSS includes the
reading with 10 `agent` steps in flight (issue 12); after it come the rest of the agent path
(issue 17): lease -> first model call with a warm mirror, a turn's checkpoint with a 1 MB diff,
a check's 10 MB artifact upload. `--smoke` windows are too short to mean anything: they only
prove the suite still runs (the test suite does this). After the steps/s: the supervisor's CPU
per committed step at 64 (issue 17), and at the end, before the peers, where that CPU goes
(`bench.cpu`). Then, on a supervisor of its own, a preemption notice -> another runner holding
the agent step, and the turns lost (`bench.preemption`, issue 27). Last, the PostgreSQL
section (`bench.pg`, issue 14): tether with one and three supervisors on a PostgreSQL
database, and procrastinate and DBOS on the same server; skipped with one line when no server
answers (`BENCH_PG` names it) or with `--no-pg`. Printed last, issue 28's targets in one table,
each from this run's figures (`report.issue28_table`); before the peers, what each round-3
feature costs (`bench.features`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import (
    agent_lease,
    agent_path,
    agent_rss,
    agent_upload,
    claimcost,
    cpu,
    disk,
    features,
    groupcommit,
    idle,
    machine,
    modelbound,
    overhead,
    peers_run,
    pg,
    preemption,
    profile_groups,
    renewals,
    report,
    runner_rss,
    seed,
    steps,
)
from bench.procs import children
from bench.report import say
from bench.stack import Stack
from tether.logs import configure_logging

CONCURRENCIES = (1, 16, 64, 256)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    disk_s: float
    gc_tasks: int
    idle_window_s: float
    steps_s: float
    bare_s: float
    overhead_s: float
    renew_s: float
    peers_s: float | None
    claim_depths: tuple[int, ...]
    agent_hold_s: float  # how long the stand-in holds each answer of the agent steps
    lease_files: int  # files in the repository of the lease -> first model call reading
    lease_runs: int  # warm leases timed
    checkpoint_files: int  # files in the repository of the checkpoint reading
    checkpoint_rounds: int
    upload_rounds: int  # 10 MB uploads timed
    cpu_s: float  # window of each supervisor CPU per step reading
    cpu_runs: int  # readings (the median is the figure)
    profile_s: float  # window of the profiled run
    preemption_rounds: int  # notices sent, one agent step each
    pg: pg.Plan  # the PostgreSQL section


FULL = Plan(
    disk_s=5,
    gc_tasks=2000,
    idle_window_s=25,
    steps_s=15,
    bare_s=10,
    overhead_s=20,
    renew_s=10,
    peers_s=5,
    claim_depths=(100, 1000, 10_000),
    agent_hold_s=2.0,
    lease_files=10_000,
    lease_runs=5,
    checkpoint_files=10_000,
    checkpoint_rounds=10,
    upload_rounds=5,
    cpu_s=8,
    cpu_runs=3,
    profile_s=5,
    preemption_rounds=5,
    pg=pg.FULL,
)
QUICK = Plan(
    disk_s=1.5,
    gc_tasks=600,
    idle_window_s=4,
    steps_s=3,
    bare_s=3,
    overhead_s=4,
    renew_s=3,
    peers_s=None,
    claim_depths=(100, 1000),
    agent_hold_s=1.0,
    lease_files=2_000,
    lease_runs=3,
    checkpoint_files=1_000,
    checkpoint_rounds=5,
    upload_rounds=3,
    cpu_s=3,
    cpu_runs=3,
    profile_s=3,
    preemption_rounds=2,
    pg=pg.QUICK,
)
SMOKE = Plan(
    disk_s=0.2,
    gc_tasks=100,
    idle_window_s=1,
    steps_s=0.5,
    bare_s=0.5,
    overhead_s=1,
    renew_s=0.5,
    peers_s=None,
    claim_depths=(100,),
    agent_hold_s=0.5,
    lease_files=200,
    lease_runs=2,
    checkpoint_files=100,
    checkpoint_rounds=2,
    upload_rounds=1,
    cpu_s=0.5,
    cpu_runs=1,
    profile_s=1,
    preemption_rounds=1,
    pg=pg.SMOKE,
)


def measure(plan: Plan, workdir: Path, peers: bool, postgres: bool = True) -> dict[str, Any]:
    mode = {id(QUICK): "quick", id(SMOKE): "smoke"}.get(id(plan), "full")
    r: dict[str, Any] = {"mode": mode, "peer_steps_per_s": {}}
    r["machine"] = machine.describe(workdir)
    say(f"work directory {workdir} ({r['machine']['ledger_filesystem']})")
    for busy in r["machine"]["busy_processes_at_start"]:
        say(f"warning: sharing the machine with {busy}")

    r["disk_commits_per_s"] = disk.commits_per_s(workdir, plan.disk_s)
    say(f"disk bound {r['disk_commits_per_s']:.0f} commits/s")

    gc: dict[str, Any] = {}
    for side, on in (("off", False), ("on", True)):
        run = groupcommit.run(workdir / f"gc-{side}.db", batching=on, tasks=plan.gc_tasks)
        gc[side] = {
            "steps_per_s": run.steps_per_s,
            "rules_per_batch": run.rules_per_batch,
            "steps": run.steps,
        }
        say(f"group commit {side}: {run.steps_per_s:.0f} steps/s")
    r["group_commit"] = gc

    r["claim_ms_by_queue_depth"] = claimcost.run(workdir, plan.claim_depths)
    say(f"claim rule cost by queue depth (ms): {r['claim_ms_by_queue_depth']}")

    db = workdir / "ledger.db"
    seed.create_tasks(db, "warm", 1, approve=False)  # create and migrate the file
    with children(workdir) as kids:
        stack = Stack(kids=kids, workdir=workdir, db=db)
        stack.token("idle")  # tokens are read from the file; create before serving
        stack.token(seed.TENANT, role="operator")
        for pool in (agent_lease.POOL, agent_lease.TMPFS_POOL, agent_upload.POOL):
            stack.token(pool)
        stack.start_supervisor()
        stack.start_model(latency_s=0.0)

        idle_run = idle.run(stack, window_s=plan.idle_window_s)
        r["idle_1000_cpu_pct"] = idle_run.cpu_pct
        r["idle_1000_rss_mb"] = idle_run.rss_mb
        r["idle_1000"] = dataclasses.asdict(idle_run)
        r["idle_1000_cpu_pct_while_10_approvals_per_s"] = idle_run.wake_cpu_pct
        r["idle_1000_ledger_rules_per_approval"] = idle_run.rules_per_approval
        say(
            f"idle: {idle_run.cpu_pct:.1f}% cpu, {idle_run.rss_mb:.0f} MB, "
            f"{idle_run.connections} connections"
        )

        rss = runner_rss.run(stack)
        r["runner_rss_idle_mb"] = rss.idle_mb
        r["runner_rss_idle_installed"] = rss.idle_installed
        r["runner_rss_idle_dev_venv_mb"] = rss.idle_dev_venv_mb
        r["runner_rss_100_mb"] = rss.in_flight_mb
        r["runner_rss_in_flight"] = rss.in_flight
        where = "as installed" if rss.idle_installed else "developers' venv"
        say(
            f"runner rss: idle {rss.idle_mb:.0f} MB ({where}; developers' venv "
            f"{rss.idle_dev_venv_mb:.0f} MB), in flight ({rss.in_flight}) "
            f"{rss.in_flight_mb:.0f} MB"
        )

        agents = agent_rss.run(stack, hold_s=plan.agent_hold_s)
        r["runner_rss_10_agents_mb"] = agents.in_flight_mb
        r["agent_rss"] = dataclasses.asdict(agents)
        say(
            f"runner rss, {agents.in_flight} agent steps in flight: {agents.in_flight_mb:.0f} MB "
            f"({agents.with_children_mb:.0f} MB with its commands; {agents.model_calls} model "
            f"calls, {agents.succeeded} steps succeeded)"
        )
        agent_path.measure(
            r,
            stack,
            lease_files=plan.lease_files,
            lease_runs=plan.lease_runs,
            checkpoint_files=plan.checkpoint_files,
            checkpoint_rounds=plan.checkpoint_rounds,
            upload_rounds=plan.upload_rounds,
            say=say,
        )

        r["steps_per_s"] = {}
        r["steps_detail"] = {}
        best = 100.0
        sup_rss = 0.0
        for c in CONCURRENCIES:
            at = steps.run(
                stack,
                concurrency=c,
                seconds=plan.steps_s,
                tasks=steps.tasks_for(best, plan.steps_s),
            )
            r["steps_per_s"][str(c)] = at.steps_per_s
            r["steps_detail"][str(c)] = dataclasses.asdict(at)
            best = max(best, at.steps_per_s)
            sup_rss = max(sup_rss, at.supervisor_rss_max_mb)
            sup_pct = at.supervisor_cpu_pct
            say(
                f"steps at {c}: {at.steps_per_s:.0f}/s ({at.steps} steps, "
                f"{at.processes} runners, supervisor {sup_pct:.0f}% cpu)"
            )
        cpu_runs = []
        for reading in range(plan.cpu_runs):
            taken = cpu.per_step(
                stack,
                seconds=plan.cpu_s,
                label=f"-cpu{reading}",
                tasks=cpu.tasks_for(plan.cpu_s, best),
            )
            cpu_runs.append(taken)
            say(cpu.describe(taken))
        cpu.record(r, cpu_runs)
        # At least 20 steps/s: a run too short or too starved to commit anything still takes
        # the overhead readings, at a rate the load processes can pace.
        peak = max(40.0, *r["steps_per_s"].values())

        r["model_calls_only_per_s"] = modelbound.run(stack, concurrency=64, seconds=plan.bare_s)
        say(f"model calls alone: {r['model_calls_only_per_s']:.0f}/s")

        bare = steps.supervisor_only(
            stack, seconds=plan.bare_s, tasks=steps.tasks_for(300, plan.bare_s)
        )
        r["supervisor_only_steps_per_s"] = bare
        say(f"supervisor only: {bare:.0f} steps/s")
        shared = steps.supervisor_only(
            stack,
            seconds=plan.bare_s,
            tasks=steps.tasks_for(1500, plan.bare_s),
            concurrency=4,
            mode="steps-shared",
        )
        r["supervisor_only_shared_steps_per_s"] = shared
        say(f"supervisor only, the runner's protocol: {shared:.0f} steps/s")

        fsync_ms = 1000 / r["disk_commits_per_s"]
        ov = overhead.run(stack, rate=peak / 2, seconds=plan.overhead_s, fsync_ms=fsync_ms)
        r["p50_overhead_ms"] = ov.p50_ms
        r["p99_overhead_ms"] = ov.p99_ms
        r["overhead_load_steps_per_s"] = ov.achieved_per_s
        r["overhead"] = dataclasses.asdict(ov)
        say(
            f"overhead at {ov.achieved_per_s:.0f}/s: p50 {ov.p50_ms:.1f} p99 {ov.p99_ms:.1f} ms"
            f" ({ov.machine_busy_pct:.0f}% of the cores busy)"
        )
        paced = overhead.paced(stack, rate=peak / 2, seconds=plan.overhead_s, fsync_ms=fsync_ms)
        r["overhead_paced"] = dataclasses.asdict(paced)
        say(
            f"overhead, queue drained at {paced.achieved_per_s:.0f}/s by a model holding each "
            f"answer ~{1000 * overhead.SLOTS / paced.offered_per_s:.0f} ms: p50 "
            f"{paced.p50_ms:.1f} p99 {paced.p99_ms:.1f} ms ({paced.machine_busy_pct:.0f}% busy)"
        )
        low = overhead.run(
            stack,
            rate=min(100.0, peak / 4),
            seconds=plan.overhead_s,
            fsync_ms=fsync_ms,
            pool="low-load",
        )
        r["overhead_low_load"] = dataclasses.asdict(low)
        say(f"overhead at {low.achieved_per_s:.0f}/s: p50 {low.p50_ms:.1f} p99 {low.p99_ms:.1f} ms")

        rm = renewals.max_rate(stack, seconds=plan.renew_s)
        r["renews_per_s"] = rm["renews_per_s"]
        r["renewals_max"] = rm
        say(f"renewals: {rm['renews_per_s']:.0f}/s")

        under = renewals.steps_while_renewing(
            stack, seconds=plan.steps_s, tasks=steps.tasks_for(best, plan.steps_s)
        )
        r["steps_per_s_while_1000_renew"] = under.steps.steps_per_s
        r["renewals_paced"] = under.renewals
        sup_rss = max(sup_rss, under.steps.supervisor_rss_max_mb)
        say(
            f"steps under 1,000 renewing leases: {under.steps.steps_per_s:.0f}/s; renewals "
            f"{under.renewals['renews_per_s']:.0f}/s, {under.renewals['late']} late"
        )
        r["supervisor_rss_mb"] = sup_rss

        r["supervisor_profile"] = cpu.profile(
            stack,
            seconds=plan.profile_s,
            tasks=cpu.tasks_for(plan.profile_s, best),
            ms_per_step=r["supervisor_cpu_per_step_ms"],
        )
        say(f"supervisor profiled ({r['supervisor_profile']['profiler']})")

        pairs = 1 if mode == "smoke" else 3  # each feature off and on, alternating (issue 28)
        r["features"] = features.measure(
            stack,
            seconds=min(plan.steps_s, 8.0),
            pairs=pairs,
            render_tasks=features.RENDER_TASKS[mode],
            rate=best,
        )

        stack.stop_supervisor()
        if peers and plan.peers_s is not None:
            if peers_run.available():
                found = peers_run.run_all(kids, workdir, seconds=plan.peers_s)
                r["peers"] = found
                r["peer_steps_per_s"] = {n: p["steps_per_s"] for n, p in found.items()}
                for n, p in found.items():
                    say(f"peer {n}: {p['steps_per_s']:.0f}/s {p['by_concurrency']}")
            else:
                say(f"peers skipped: no {peers_run.PEERS_PYTHON} (make bench builds it)")
    notice = preemption.measure(workdir, rounds=plan.preemption_rounds)
    r["preemption"] = dataclasses.asdict(notice)
    say(preemption.describe(notice))
    r["disk_commits_per_s_end"] = disk.commits_per_s(workdir, plan.disk_s)
    say(f"disk bound again at the end: {r['disk_commits_per_s_end']:.0f} commits/s")
    if postgres:
        with children(workdir) as kids:
            r["pg"] = pg.measure(plan.pg, workdir, kids, peers=peers, rate_hint=best)
    else:
        r["pg"] = {"skipped": "--no-pg"}
        say("PostgreSQL section skipped (--no-pg)")
    report.ratios(r)
    r["loadavg_at_end"] = os.getloadavg()
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="short windows, no peers (< 2 min)")
    speed.add_argument("--smoke", action="store_true", help="only prove the suite runs")
    p.add_argument("--no-peers", action="store_true", help="skip the peers (both sections)")
    p.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL section")
    p.add_argument("--dir", type=Path, help="put the ledger here (default: a temp directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    # The in-process ledger logs its decisions as the bench's supervisors do: warnings only.
    configure_logging(json_lines=True, level="warning")
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    base = args.dir
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-", dir=base))
    started = time.monotonic()
    try:
        results = measure(plan, workdir, peers=not args.no_peers, postgres=not args.no_pg)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results["wall_s"] = time.monotonic() - started
    print(f"\ntether benchmarks ({results['mode']}, {results['wall_s']:.0f} s)")
    m = results["machine"]
    print(
        f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu_model']};"
        f" ledger on {m['ledger_filesystem']};"
        f" Python {m['python']}, SQLite {m['sqlite']}"
    )
    busy = "; ".join(m["busy_processes_at_start"]) or "none"
    print(
        f"load average at start {m['loadavg_at_start'][0]:.2f}, at the end"
        f" {results['loadavg_at_end'][0]:.2f}; other busy processes at start: {busy}"
    )
    print(
        f"disk bound at the start {results['disk_commits_per_s']:,.0f} commits/s, at the end"
        f" {results['disk_commits_per_s_end']:,.0f} (ratios use the start)\n"
    )
    print(report.table(results))
    if "supervisor_profile" in results:
        print()
        print("\n".join(profile_groups.lines(results["supervisor_profile"])))
    print()
    print(report.pg_table(results["pg"]))
    print()
    print(report.issue28_table(results))
    print("\nmethod:")
    print(report.notes())
    out = os.environ.get("BENCH_JSON")
    if out:
        report.write_json(results, Path(out))
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
