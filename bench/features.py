"""What each round-3 feature costs in committed steps/s (issue 28: each at most 5 %), the
feature off and on in alternating windows of one run, so both arms see the same machine.

- **Log shipping** has a runner setting (`ship_logs`, `TETHER_SHIP_LOGS`): runners at 64 on the
  run's supervisor, end to end, both arms at the runners' default log level (`info`), so the
  lines a step logs are there to ship (the bench's other measurements run them at `warning`).
- **Token-bound leases** have no switch: each window starts the supervisor anew on the same
  ledger, the off arm as `python -m bench.variants no-token-binding` (`held_step` without its
  token comparison: the explorer's `lease-takeover` plant), the on arm as `tether-supervisor`;
  runners at 64, end to end. The off arm still reads the held attempt's token beside its fence
  and usage (one query, which the result rule needs for the usage anyway): what the binding
  adds today is that column and a comparison in each rule about a lease.
- **Rendering checks** run only when an `http` or `git.push` effect step falls due; the bench's
  chat steps render nothing, so they are not in the end-to-end figures. Measured with the
  ledger in process (as `bench.groupcommit`), 64 workers claim -> result on tasks of a chat
  step and an `http` effect step whose URL, a header and the body take the chat step's output:
  each result commits the chat step and renders the effect's request in the same transaction.
  Off is `bench.variants`' `no-render-checks` (URL and headers filled as plain text). The
  ledger alone is a part of a step's cost end to end, so this share is an upper bound.

After one window not counted (a warm-up), windows go off, on, on, off, off, on, ... (each pair
in the other order, to cancel drift). An end-to-end window is read as `bench.ab` reads one:
after the runners' start-up, the steps committed in the window and the CPU of the
supervisor, the runners and the stand-in meanwhile; in process, the bench process's CPU. The
cost judged is 1 - (CPU per step off / on), the steps/s the cores allow, since the load is
CPU-bound and on shared cores a window's steps/s moves with others' load by more than 5 %;
each arm's median steps/s and their difference are kept beside it (`wall_cost`).

`python -m bench.features [--quick | --smoke] [--pairs N] [--only NAME]` takes it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from bench import ab, cpu, machine, seed, variants
from bench.procs import children
from bench.report import feature_rows, say
from bench.stack import Stack
from tether.supervisor.ledger import Report, SqliteLedger, StepSpec, TaskSpec

CONCURRENCY = 64


@dataclasses.dataclass(frozen=True)
class Reading:
    """One window: committed steps/s, and the CPU a committed step cost the processes that
    did the work (supervisor, runners and stand-in; the bench process, in process)."""

    steps_per_s: float
    cpu_ms: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Feature:
    name: str
    where: str  # how the windows are taken, as the table says
    variable: str = ""  # a runner setting: its environment variable, off and on
    off: str = ""
    on: str = ""
    variant: str = ""  # a `bench.variants` name: the supervisor without the check
    in_process: bool = False  # the ledger in process (`render_window`)


FEATURES = (
    Feature(
        name="log shipping",
        where="runners at log level info, TETHER_SHIP_LOGS false / true",
        variable="TETHER_SHIP_LOGS",
        off="false",
        on="true",
    ),
    Feature(
        name="token-bound leases",
        where="supervisor restarted each window, bench.variants no-token-binding / as shipped",
        variant="no-token-binding",
    ),
    Feature(
        name="rendering checks",
        where=(
            "ledger in process, chat step + http effect rendered per result,"
            " bench.variants no-render-checks / as shipped"
        ),
        variant="no-render-checks",
        in_process=True,
    ),
)


def window(
    stack: Stack, feature: Feature, on: bool, *, seconds: float, rate: float, label: str
) -> Reading:
    """Runners at 64 with the feature `on` or off, as `bench.ab` reads a window: after the
    runners' start-up, the steps committed in `seconds` and the CPU of the supervisor, the
    runners and the stand-in meanwhile."""
    if feature.variant:
        stack.stop_supervisor()
        off = [sys.executable, "-m", "bench.variants", feature.variant]
        stack.supervisor_program = None if on else off
        try:
            stack.start_supervisor()
        finally:
            stack.supervisor_program = None
    saved = stack.runner_env
    if feature.variable:
        stack.runner_env = {**saved, feature.variable: feature.on if on else feature.off}
    try:
        tasks = cpu.tasks_for(seconds, rate)
        taken = ab.window(stack, seconds=seconds, tasks=tasks, label=label)
    finally:
        stack.runner_env = saved
    cpu_s = taken.supervisor_s + taken.runners_s + taken.model_s
    return Reading(steps_per_s=taken.steps_per_s, cpu_ms=taken.ms(cpu_s))


def effect_task(key: str, pool: str) -> TaskSpec:
    """A chat step, then an `http` effect whose URL, a header and body take its output."""
    chat = {"messages": [{"role": "user", "content": f"no-op {key}"}]}
    deploy = {
        "method": "POST",
        "url": "https://deploy.bench.example/api/{{ steps.build.output.v }}/hook"
        "?tag={{ steps.build.output.tag }}",
        "headers": {"X-Release": "r-{{ steps.build.output.v }}", "Content-Type": "text/plain"},
        "body": {"version": "{{ steps.build.output.v }}", "key": key},
    }
    return TaskSpec(
        tenant=seed.TENANT,
        idempotency_key=key,
        steps=(
            StepSpec(name="build", kind="chat", payload=chat),
            StepSpec(name="deploy", kind="http", payload=deploy),
        ),
        pool=pool,
    )


OUTPUT = {"v": "1.2.3", "tag": "release candidate/7"}


def render_window(path: Path, on: bool, *, tasks: int, label: str) -> Reading:
    """The ledger in process: `CONCURRENCY` workers claim -> result over `tasks` queued tasks
    of `effect_task`; committed steps/s, every result rendering its task's effect."""
    pool = f"render{label}"
    seed.create_tasks(path, pool, tasks, approve=True, make=effect_task)

    async def drive() -> Reading:
        async with SqliteLedger.open(path, synchronous="FULL") as ledger:
            done = 0

            async def worker(n: int) -> None:
                nonlocal done
                while leases := await ledger.claim(f"w{n}", pool, 1, 0.0):
                    lease = leases[0]
                    report = Report(
                        step_id=lease.step_id,
                        fence=lease.fence,
                        payload_hash=lease.payload_hash,
                        output=OUTPUT,
                        usage={"total_tokens": 1},
                    )
                    await ledger.report(report, pool)
                    done += 1

            start, cpu0 = time.perf_counter(), time.process_time()
            async with anyio.create_task_group() as tg:
                for n in range(CONCURRENCY):
                    tg.start_soon(worker, n)
            wall, used = time.perf_counter() - start, time.process_time() - cpu0
            return Reading(done / wall, 1000 * used / done if done else 0.0)

    if on:
        return anyio.run(drive)
    with variants.without("no-render-checks"):
        return anyio.run(drive)


def rendered_effects(path: Path, label: str) -> tuple[int, int]:
    """(effects rendered due, effect steps failed) in the pools of `label`'s windows: every
    window's results must have rendered their effects, or the reading measured nothing."""
    from tether.supervisor.ledger.schema import connect
    from tether.supervisor.ledger.states import StepState

    db = connect(path, readonly=True)
    try:
        like = f"render{label}%"
        due = db.execute(
            "SELECT count(*) FROM outbox o JOIN tasks t ON t.id = o.task_id WHERE t.pool LIKE ?",
            (like,),
        ).fetchone()[0]
        failed = db.execute(
            "SELECT count(*) FROM steps s JOIN tasks t ON t.id = s.task_id"
            " WHERE t.pool LIKE ? AND s.kind = 'http' AND s.state = ?",
            (like, StepState.FAILED.value),
        ).fetchone()[0]
        return int(due), int(failed)
    finally:
        db.close()


def measure(
    stack: Stack,
    *,
    seconds: float,
    pairs: int,
    render_tasks: int,
    rate: float = 1000.0,
    features: tuple[Feature, ...] = FEATURES,
) -> dict[str, Any]:
    """Each feature's arms, alternated `pairs` times; the figures by feature name. The stack's
    runners log at `info` meanwhile. A feature of the supervisor's runs on a ledger file of its
    own (`_own_stack`), its supervisor stopped at the end; the stack's keeps serving. `rate`,
    steps/s measured before, sizes each window's queue; `features` narrows the list (`--only`)."""
    out: dict[str, Any] = {}
    level, stack.runner_log_level = stack.runner_log_level, "info"
    try:
        for feature in features:
            if feature.in_process:
                path = stack.workdir / "render.db"
                take = functools.partial(_render, path, render_tasks)
                out[feature.name] = _arms(feature, take, pairs=pairs)
                due, failed = rendered_effects(path, "")
                out[feature.name]["effects_rendered"] = due
                out[feature.name]["effects_failed"] = failed
            elif feature.variant:
                own = _own_stack(stack, feature)
                try:
                    take = functools.partial(_window, own, feature, seconds, rate)
                    out[feature.name] = _arms(feature, take, pairs=pairs)
                finally:
                    own.stop_supervisor()
            else:
                take = functools.partial(_window, stack, feature, seconds, rate)
                out[feature.name] = _arms(feature, take, pairs=pairs)
    finally:
        stack.runner_log_level = level
    return out


def _render(path: Path, tasks: int, on: bool, label: str) -> Reading:
    return render_window(path, on, tasks=tasks, label=label)


def _window(
    stack: Stack, feature: Feature, seconds: float, rate: float, on: bool, label: str
) -> Reading:
    return window(stack, feature, on, seconds=seconds, rate=rate, label=label)


def _own_stack(stack: Stack, feature: Feature) -> Stack:
    """A fresh ledger file for a feature whose windows restart the supervisor, beside the
    stack's and with its stand-in: a supervisor checks its file's integrity as it starts,
    which on the run's grown ledger takes longer than a window, and longer the later."""
    db = stack.workdir / f"{feature.variant}.db"
    seed.create_tasks(db, "warm", 1, approve=False)
    return Stack(
        kids=stack.kids,
        workdir=stack.workdir,
        db=db,
        model=stack.model,
        model_url=stack.model_url,
        runner_log_level=stack.runner_log_level,
        lease_ttl_s=stack.lease_ttl_s,
    )


def _arms(feature: Feature, take: Callable[[bool, str], Reading], *, pairs: int) -> dict[str, Any]:
    readings: dict[str, list[Reading]] = {"off": [], "on": []}
    slug = feature.name.replace(" ", "-")
    if pairs > 1:  # (a smoke run's one pair only proves the windows run)
        take(True, f"-{slug}-warm-up")  # not counted
    for n in range(pairs):
        order = (False, True) if n % 2 == 0 else (True, False)
        for on in order:
            arm = "on" if on else "off"
            readings[arm].append(take(on, f"-{slug}-{arm}-{n}"))
    rates = {arm: [r.steps_per_s for r in values] for arm, values in readings.items()}
    cpus = {arm: [r.cpu_ms for r in values] for arm, values in readings.items()}
    without, with_ = statistics.median(rates["off"]), statistics.median(rates["on"])
    wall_cost = 1 - with_ / without if without > 0 and with_ > 0 else None
    cpu_off, cpu_on = statistics.median(cpus["off"]), statistics.median(cpus["on"])
    # The figure judged: on these shared cores a window's steps/s moves with the other
    # sessions' load by more than 5 %, its CPU per step far less; the load is CPU-bound
    # (zero-latency stand-in), so the steps/s the cores allow go as 1 / CPU per step.
    cost = 1 - cpu_off / cpu_on if cpu_off > 0 and cpu_on > 0 else None
    shown = {arm: [round(r) for r in values] for arm, values in rates.items()}
    each = {arm: [round(c, 3) for c in values] for arm, values in cpus.items()}
    say(
        f"{feature.name}: off {without:.0f}/s, on {with_:.0f}/s; windows {shown};"
        f" CPU per step (ms) {each}"
    )
    return {
        **rates,
        "cpu_ms": cpus,
        "off_median": without,
        "on_median": with_,
        "wall_cost": wall_cost,
        "cpu_ms_off_median": cpu_off,
        "cpu_ms_on_median": cpu_on,
        "cost": cost,
        "where": feature.where,
        "in_process": feature.in_process,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.features", description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter windows")
    size.add_argument("--smoke", action="store_true", help="only prove it runs")
    p.add_argument("--pairs", type=int, default=None, help="off/on pairs (default 3; smoke 1)")
    p.add_argument(
        "--only",
        choices=[f.name for f in FEATURES],
        default=None,
        metavar="NAME",
        help="measure this feature alone (quoted: 'log shipping')",
    )
    args = p.parse_args(argv)
    features = tuple(f for f in FEATURES if args.only in (None, f.name))
    from tether.logs import configure_logging

    configure_logging(json_lines=True, level="warning")
    seconds = 0.5 if args.smoke else 3.0 if args.quick else 8.0
    render_tasks = RENDER_TASKS["smoke" if args.smoke else "quick" if args.quick else "full"]
    pairs = args.pairs or (1 if args.smoke else 3)
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-features-"))
    try:
        info = machine.describe(workdir)
        db = workdir / "ledger.db"
        seed.create_tasks(db, "warm", 1, approve=False)
        with children(workdir) as kids:
            stack = Stack(kids=kids, workdir=workdir, db=db)
            stack.start_supervisor()
            stack.start_model(latency_s=0.0)
            found = measure(
                stack, seconds=seconds, pairs=pairs, render_tasks=render_tasks, features=features
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"machine: {info['nproc']} cores; load average at start {info['loadavg_at_start'][0]:.2f}"
    )
    print("\n".join(feature_rows({"features": found})))
    return 0


# Tasks per in-process rendering window: about 5 s of the ledger alone here at full size.
RENDER_TASKS = {"full": 3000, "quick": 1000, "smoke": 100}


if __name__ == "__main__":
    raise SystemExit(main())
