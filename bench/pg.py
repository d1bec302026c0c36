"""The PostgreSQL section of `python -m bench` (issue 14, item 6): tether with its ledger on
PostgreSQL, with one and with three supervisors on one database, and, on the same server, the
peers a PostgreSQL user would pick instead (procrastinate, DBOS), ratios beside each figure.

Each configuration gets a fresh database on the server (`bench.pgdb.scratch`, dropped
afterwards) and its own stand-in model; the measurements are `bench.steps` and
`bench.overhead`, unchanged, on a `Stack` whose supervisors serve the database:

- committed steps/s at concurrency 64 and 256 (real runners, the stand-in at zero latency);
  at 64, the two configurations in alternating windows (1, 3, 3, 1: issue 28 compares three
  supervisors with one), each configuration's figure the median of its windows;
- claim->commit overhead p50/p99 with approvals one at a time at 100 steps/s (the SQLite
  section's lighter-load reading); the commit's own cost added to each span is one
  single-row commit on this server (`pgdb.commits_per_s`), as the SQLite figures add one fsync;
- with three supervisors, one is killed (SIGKILL) while runners at 64 work through a pool:
  tasks lost (not SUCCEEDED once every lease the dead one granted expired) and the longest
  pause between two commits after the kill, against one renew interval.

`python -m bench.pg [--quick | --smoke] [--no-peers]` takes this section alone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import overhead, peers_run, pg_roundtrips, seed, steps
from bench import pgdb as server
from bench.procs import Children, children
from bench.report import ROUND_TRIPS_TARGET, say
from bench.stack import Stack
from tether.supervisor.ledger import LedgerConfig
from tether.supervisor.ledger.pg_schema import connect

SUPERVISORS = (1, 3)
OVERHEAD_RATE = 100.0
SLOTS = 64  # the kill reading's runners


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    probe_s: float  # the server's single-row commit probe
    concurrencies: tuple[int, ...]
    steps_s: float
    overhead_s: float
    kill_s: float | None  # the kill reading's window before the kill and after it; None: skip
    peers_s: float | None  # each peer's window per concurrency; None: skip
    roundtrip_steps: int  # steps counted by `bench.pg_roundtrips`
    pairs: int  # windows at the first concurrency per configuration (`alternate`)


FULL = Plan(
    probe_s=3,
    concurrencies=(64, 256),
    steps_s=15,
    overhead_s=10,
    kill_s=6,
    peers_s=5,
    roundtrip_steps=2000,
    pairs=2,
)
QUICK = Plan(
    probe_s=1,
    concurrencies=(64, 256),
    steps_s=3,
    overhead_s=3,
    kill_s=3,
    peers_s=None,
    roundtrip_steps=500,
    pairs=2,
)
SMOKE = Plan(
    probe_s=0.2,
    concurrencies=(64,),
    steps_s=0.5,
    overhead_s=0.5,
    kill_s=None,
    peers_s=None,
    roundtrip_steps=100,
    pairs=1,
)


def measure(
    plan: Plan, workdir: Path, kids: Children, *, peers: bool, rate_hint: float = 300.0
) -> dict[str, Any]:
    """The section's figures; `{"skipped": reason}` when no server answers. `rate_hint`, a
    steps/s figure taken before, sizes the first run's queue (`steps.tasks_for`)."""
    url = server.server_url()
    why = server.unreachable(url)
    if why is not None:
        say(f"PostgreSQL section skipped: {why} (set BENCH_PG)")
        return {"skipped": why}
    r: dict[str, Any] = {"server": server.shown(url), "tether": {}, "peers": {}}
    r["synchronous_commit"] = server.synchronous_commit(url)
    with server.scratch(url, "probe") as probe:
        r["commits_per_s"] = server.commits_per_s(probe, plan.probe_s)
    say(
        f"PostgreSQL: {r['commits_per_s']:.0f} single-row commits/s"
        f" (synchronous_commit={r['synchronous_commit']})"
    )
    fsync_ms = 1000 / max(1.0, r["commits_per_s"])
    trips = pg_roundtrips.measure(url, steps=plan.roundtrip_steps, workers=SLOTS)
    r["round_trips"] = pg_roundtrips.figures(trips, SLOTS)
    per_step = f"{trips.per_step:.1f} round trips per committed step"
    say(f"PostgreSQL: {per_step} (target <= {ROUND_TRIPS_TARGET})")
    with contextlib.ExitStack() as databases:
        stacks = {}
        for count in SUPERVISORS:
            db = databases.enter_context(server.scratch(url, f"tether{count}"))
            folder = workdir / f"pg-{count}"
            folder.mkdir()
            stacks[count] = Stack(kids=kids, workdir=folder, db=folder / "unused.db", url=db)
            stacks[count].token(seed.TENANT, role="operator")  # creates and migrates it
        first = alternate(plan, stacks, rate_hint=rate_hint)
        for count, stack in stacks.items():
            r["tether"][str(count)] = tether(
                plan, stack, count, fsync_ms=fsync_ms, rate_hint=rate_hint, first=first[count]
            )
    if peers and plan.peers_s is not None:
        if peers_run.available():
            r["peers"] = peers_run.run_pg(kids, url, seconds=plan.peers_s)
            for name, p in r["peers"].items():
                say(f"peer {name}: {p['steps_per_s']:.0f}/s {p['by_concurrency']}")
        else:
            say(f"PostgreSQL peers skipped: no {peers_run.PEERS_PYTHON} (make bench builds it)")
    ratios(r)
    return r


def alternate(
    plan: Plan, stacks: dict[int, Stack], *, rate_hint: float
) -> dict[int, list[steps.StepsRun]]:
    """Steps/s at the first concurrency, each configuration in turn in alternating windows
    (1, 3, 3, 1, ...: each pair in the other order, to cancel drift), its supervisors and
    stand-in started for each window: three supervisors are read against one in the same
    minutes, the issue-28 target being three's steps/s over one's."""
    c = plan.concurrencies[0]
    found: dict[int, list[steps.StepsRun]] = {count: [] for count in stacks}
    order = list(stacks)
    for n in range(plan.pairs):
        for count in order if n % 2 == 0 else order[::-1]:
            stack = stacks[count]
            who = "1 supervisor" if count == 1 else f"{count} supervisors"
            tasks = steps.tasks_for(rate_hint, plan.steps_s)
            try:
                stack.start_supervisors(count)
                stack.start_model(latency_s=0.0)
                pool = steps.prepare(stack, concurrency=c, tasks=tasks, label=f"-pg{count}-{n}")
                analyze(stack)
                at = steps.run(
                    stack, concurrency=c, seconds=plan.steps_s, tasks=tasks, prepared=pool
                )
            finally:
                stop(stack)
            found[count].append(at)
            say(
                f"PostgreSQL, {who}, steps at {c} (window {n + 1} of {plan.pairs}):"
                f" {at.steps_per_s:.0f}/s ({at.steps} steps, {at.processes} runners,"
                f" supervisors {at.supervisor_cpu_pct:.0f}% cpu)"
            )
    return found


def stop(stack: Stack) -> None:
    """Stop the stack's supervisors and its stand-in."""
    stack.stop_supervisor()
    if stack.model is not None:
        stack.kids.stop(stack.model)
        stack.model = None


def tether(
    plan: Plan,
    stack: Stack,
    count: int,
    *,
    fsync_ms: float,
    rate_hint: float,
    first: list[steps.StepsRun],
) -> dict[str, Any]:
    """One configuration: `count` supervisors on the stack's (fresh) database; `first`, its
    windows at the first concurrency (`alternate`), the median of which is its figure."""
    out: dict[str, Any] = {"steps_per_s": {}, "steps_detail": {}}
    who = "1 supervisor" if count == 1 else f"{count} supervisors"
    c = plan.concurrencies[0]
    at = sorted(first, key=lambda run: run.steps_per_s)[(len(first) - 1) // 2]
    out["steps_per_s"][str(c)] = statistics.median(run.steps_per_s for run in first)
    out["steps_detail"][str(c)] = dataclasses.asdict(at)
    out["windows"] = {str(c): [run.steps_per_s for run in first]}
    try:
        stack.start_supervisors(count)
        stack.start_model(latency_s=0.0)
        best = max(rate_hint, out["steps_per_s"][str(c)])
        for c in plan.concurrencies[1:]:
            tasks = steps.tasks_for(best, plan.steps_s)
            pool = steps.prepare(stack, concurrency=c, tasks=tasks, label=f"-pg{count}")
            analyze(stack)
            at = steps.run(stack, concurrency=c, seconds=plan.steps_s, tasks=tasks, prepared=pool)
            out["steps_per_s"][str(c)] = at.steps_per_s
            out["steps_detail"][str(c)] = dataclasses.asdict(at)
            best = max(best, at.steps_per_s)
            say(
                f"PostgreSQL, {who}, steps at {c}: {at.steps_per_s:.0f}/s"
                f" ({at.steps} steps, {at.processes} runners, supervisors"
                f" {at.supervisor_cpu_pct:.0f}% cpu)"
            )
        ov = overhead.run(
            stack,
            rate=OVERHEAD_RATE,
            seconds=plan.overhead_s,
            fsync_ms=fsync_ms,
            pool=f"pg{count}-overhead",
        )
        out["overhead"] = dataclasses.asdict(ov)
        say(
            f"PostgreSQL, {who}, overhead at {ov.achieved_per_s:.0f}/s:"
            f" p50 {ov.p50_ms:.1f} p99 {ov.p99_ms:.1f} ms"
        )
        if count > 1 and plan.kill_s is not None:
            out["kill"] = kill_one(stack, seconds=plan.kill_s, rate=best)
            k = out["kill"]
            say(
                f"PostgreSQL, {who}, one killed: {k['lost']} of {k['tasks']} tasks"
                f" lost, longest pause after the kill {k['longest_pause_s']:.2f} s"
                f" (renew interval {k['renew_every_s']:.0f} s)"
            )
    finally:
        stop(stack)
    return out


def analyze(stack: Stack) -> None:
    """Statistics for the queue just seeded, as autovacuum keeps them on a database in use
    (here it may not have run yet): planned on a fresh table's, the claim query sorts the whole
    queue at every claim (32 ms a claim at 4,000 queued, 0.03 ms once analyzed)."""
    with connect(stack.url) as db:
        db.execute("ANALYZE")


def kill_one(stack: Stack, *, seconds: float, rate: float) -> dict[str, Any]:
    """SIGKILL the second supervisor `seconds` into a run of runners at 64 slots over a pool
    sized for about twice `seconds`, then let the runners finish the pool through the others.

    Waits for every task to end, up to the lease TTL and 15 s more after the kill: a claim
    the dead supervisor committed but never answered holds its step until that lease expires
    (the reaper then queues it again). Lost: tasks not SUCCEEDED at the end.
    """
    pool = "pg-kill"
    tasks = int(rate * 2 * seconds) + SLOTS
    stack.ledger.create_tasks(pool, tasks, approve=True)
    analyze(stack)
    stack.token(pool)
    runners = stack.start_runners(
        pool, pool, SLOTS, steps.processes_for(SLOTS, len(stack.supervisors))
    )
    victim = stack.others[0]
    try:
        time.sleep(steps.STARTUP_S + seconds)
        killed_at = time.time()
        victim.kill()
        victim.wait(5)
        deadline = time.monotonic() + stack.lease_ttl_s + 15
        while time.monotonic() < deadline and stack.ledger.succeeded(pool) < tasks:
            time.sleep(0.25)
        finished_at = time.time()
    finally:
        stack.kids.stop_all(runners, grace_s=10)
    done = stack.ledger.succeeded(pool)
    commits = sorted(c for _, c in stack.ledger.step_rows(pool))
    after = [killed_at, *(c for c in commits if c >= killed_at)]
    pauses = [b - a for a, b in itertools.pairwise(after)]
    stack.ledger.cancel_pool(pool)
    return {
        "tasks": tasks,
        "succeeded": done,
        "lost": tasks - done,
        "committed_after_kill": len(after) - 1,
        "longest_pause_s": max(pauses, default=finished_at - killed_at),
        "renew_every_s": LedgerConfig(lease_ttl_s=stack.lease_ttl_s).renew_every_s,
        "seconds_to_finish": finished_at - killed_at,
    }


def ratios(r: dict[str, Any]) -> None:
    """tether's steps/s (each supervisor count, each concurrency) over each peer's best."""
    peers = {name: p["steps_per_s"] for name, p in r.get("peers", {}).items()}
    r["peer_steps_per_s"] = peers
    r["ratio_to_peer"] = {
        count: {
            c: {name: (v / rate if rate else None) for name, rate in peers.items()}
            for c, v in figures["steps_per_s"].items()
        }
        for count, figures in r.get("tether", {}).items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pg", description=__doc__.splitlines()[0])
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true")
    speed.add_argument("--smoke", action="store_true")
    p.add_argument("--no-peers", action="store_true", help="skip procrastinate and DBOS")
    args = p.parse_args(argv)
    from bench import report
    from tether.logs import configure_logging

    configure_logging(json_lines=True, level="warning")
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-pg-"))
    try:
        with children(workdir) as kids:
            found = measure(plan, workdir, kids, peers=not args.no_peers)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report.pg_table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
