"""What a round-3 feature costs in committed steps/s (issue 28: each at most 5 %), the feature
off and on in alternating windows of one run on one stack, so both arms see the same machine.

A feature is measured here where the runner has a switch for it: log shipping
(`ship_logs`, `TETHER_SHIP_LOGS`). Both arms run the runners at their default log level
(`info`), so the lines a step logs are there to ship; the bench's other measurements run them
at `warning`. After one window not counted (the supervisor warming up), windows go off, on,
on, off, off, on, ... (each pair in the other order, to cancel drift); the figure is the
median of each arm and the cost 1 - on / off. Token-bound leases and the rendering checks
have no switch: they are always on, so they are in every steps/s figure and cannot be taken
away in the same run.

`python -m bench.features [--quick | --smoke] [--pairs N]` takes it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import machine, seed, steps
from bench.procs import children
from bench.report import feature_rows, say
from bench.stack import Stack

CONCURRENCY = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class Switch:
    name: str
    variable: str  # the runner's environment setting
    off: str
    on: str


SWITCHES = (Switch(name="log shipping", variable="TETHER_SHIP_LOGS", off="false", on="true"),)


def window(stack: Stack, switch: Switch, on: bool, *, seconds: float, label: str) -> float:
    """Committed steps/s of runners at `CONCURRENCY` with the feature `on` or off."""
    tasks = steps.tasks_for(1000.0, seconds)
    pool = steps.prepare(stack, concurrency=CONCURRENCY, tasks=tasks, label=label)
    env = {switch.variable: switch.on if on else switch.off}
    procs = stack.start_runners(pool, pool, CONCURRENCY, steps.processes_for(CONCURRENCY), env)
    try:
        deadline = time.monotonic() + steps.STARTUP_S + seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if stack.ledger.steps_in_state(pool, "queued") == 0:
                break
    finally:
        stack.kids.stop_all(procs, grace_s=10)
    done, span = stack.ledger.window(pool)
    stack.ledger.cancel_pool(pool)
    return done / span if span > 0 else 0.0


def measure(stack: Stack, *, seconds: float, pairs: int) -> dict[str, Any]:
    """Each switch's arms, alternated `pairs` times; the figures by feature name. The stack's
    runners log at `info` meanwhile."""
    out: dict[str, Any] = {}
    level, stack.runner_log_level = stack.runner_log_level, "info"
    try:
        for switch in SWITCHES:
            out[switch.name] = _arms(stack, switch, seconds=seconds, pairs=pairs)
    finally:
        stack.runner_log_level = level
    return out


def _arms(stack: Stack, switch: Switch, *, seconds: float, pairs: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"off": [], "on": []}
    window(stack, switch, True, seconds=seconds, label="-feature-warm-up")  # not counted
    for n in range(pairs):
        order = (False, True) if n % 2 == 0 else (True, False)
        for on in order:
            arm = "on" if on else "off"
            label = f"-feature-{switch.variable.lower()}-{arm}-{n}"
            rates[arm].append(window(stack, switch, on, seconds=seconds, label=label))
    without, with_ = statistics.median(rates["off"]), statistics.median(rates["on"])
    cost = 1 - with_ / without if without > 0 and with_ > 0 else None
    shown = {arm: [round(r) for r in values] for arm, values in rates.items()}
    say(f"{switch.name}: off {without:.0f}/s, on {with_:.0f}/s; windows {shown}")
    return {**rates, "off_median": without, "on_median": with_, "cost": cost}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.features", description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter windows")
    size.add_argument("--smoke", action="store_true", help="only prove it runs")
    p.add_argument("--pairs", type=int, default=None, help="off/on pairs (default 3; smoke 1)")
    args = p.parse_args(argv)
    from tether.logs import configure_logging

    configure_logging(json_lines=True, level="warning")
    seconds = 0.5 if args.smoke else 3.0 if args.quick else 8.0
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
            found = measure(stack, seconds=seconds, pairs=pairs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"machine: {info['nproc']} cores; load average at start {info['loadavg_at_start'][0]:.2f}"
    )
    print("\n".join(feature_rows({"features": found})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
