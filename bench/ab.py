"""Two trees' code, measured in alternating windows of one run, and Huey between them
(issue 28): on a shared, noisy machine a ratio taken in one run means more than two runs'
absolute figures.

`python -m bench.ab --before DIR [--after DIR] [--runners] [--rounds N] [--seconds S]`: `DIR`
is a source tree of tether (`git archive <commit> | tar -x -C DIR`); its supervisor is started
with that tree first on `PYTHONPATH`, so it imports that code, while the runners, the stand-in
and the seeding are this checkout's; with `--runners` each arm's runners are started the same
way, on its tree's code. `--after` defaults to this checkout. Each round measures, in turn,
before, after and Huey at concurrency 64 (`bench.cpu.per_step`: the supervisor's CPU per
committed step and the steps committed in the window; Huey end to end, as `bench.peers_run`),
each supervisor on a ledger of its own that grows alike; the order of the two arms swaps every
round. Prints each window (with the runners' and the stand-in's CPU per step) and the medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import cpu, machine, peers_run, seed, steps
from bench.procs import Children, children, read_json_line
from bench.report import say
from bench.stack import Stack
from tether.logs import configure_logging


@dataclasses.dataclass(frozen=True)
class Window:
    """One window at 64: steps committed, and the CPU seconds of each process group."""

    steps: int
    seconds: float
    supervisor_s: float
    runners_s: float
    model_s: float

    def ms(self, cpu_s: float) -> float:
        return 1000 * cpu_s / self.steps if self.steps else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    def describe(self) -> str:
        return (
            f"{self.steps_per_s:.0f} steps/s; CPU per step: supervisor"
            f" {self.ms(self.supervisor_s):.3f} ms, runners {self.ms(self.runners_s):.3f},"
            f" stand-in {self.ms(self.model_s):.3f}"
        )


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
    return total


def window(stack: Stack, *, seconds: float, tasks: int, label: str) -> Window:
    """`bench.cpu.per_step`'s load and window, with the runners' and the stand-in's CPU."""
    assert stack.supervisor is not None
    assert stack.model is not None
    pool = steps.prepare(stack, concurrency=cpu.CONCURRENCY, tasks=tasks, label=label)
    procs = stack.start_runners(pool, pool, cpu.CONCURRENCY, steps.processes_for(cpu.CONCURRENCY))
    groups = [[stack.supervisor.pid], [p.pid for p in procs], [stack.model.pid]]
    try:
        time.sleep(steps.STARTUP_S + cpu.WARM_S)
        start, before = time.time(), [_cpu_s(g) for g in groups]
        time.sleep(seconds)
        end, after = time.time(), [_cpu_s(g) for g in groups]
    finally:
        stack.kids.stop_all(procs, grace_s=10)
    committed = cpu.committed_between(stack.db, pool, start, end)
    seed.cancel_pool(stack.db, pool)
    used = [b - a for a, b in zip(before, after, strict=True)]
    return Window(committed, end - start, *used)


def huey_window(kids: Children, workdir: Path, seconds: float) -> float:
    """Huey's end-to-end steps/s at 64 over `seconds` (`peers/huey_bench.py`, no drain)."""
    proc = kids.start(
        "peer-huey",
        [
            str(peers_run.PEERS_PYTHON),
            str(peers_run.SCRIPTS / "huey_bench.py"),
            "--seconds",
            str(seconds),
            "--concurrency",
            "64",
            "--workers",
            "4",
            "--drain",
            "0",
        ],
        env={"HUEY_BENCH_DB": str(workdir / "huey.db")},
        stdout_pipe=True,
    )
    found: dict[str, Any] = json.loads(read_json_line(proc, timeout_s=20 * seconds + 120))
    return float(found["steps_per_s"])


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, required=True, help="a source tree of tether")
    parser.add_argument("--after", type=Path, default=None, help="another (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="each window")
    parser.add_argument("--runners", action="store_true", help="the runners from each tree too")
    parser.add_argument("--no-huey", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="where the work folder goes")
    args = parser.parse_args()
    configure_logging(json_lines=True, level="warning")
    trees = {"before": args.before.resolve(), "after": args.after and args.after.resolve()}
    huey = not args.no_huey and peers_run.available()
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-ab-", dir=args.dir))
    found: dict[str, list[Window]] = {"before": [], "after": []}
    hueys: list[float] = []
    m = machine.describe(workdir)
    try:
        with children(workdir) as kids:
            stacks: dict[str, Stack] = {}
            for arm, tree in trees.items():
                db = workdir / f"ledger-{arm}.db"
                seed.create_tasks(db, "warm", 1, approve=False)
                env = {"PYTHONPATH": str(tree)} if tree is not None else {}
                stacks[arm] = Stack(
                    kids=kids,
                    workdir=workdir,
                    db=db,
                    supervisor_env=env,
                    runner_env=env if args.runners else {},
                )
            model = stacks["before"]
            model.start_model(latency_s=0.0)
            for stack in stacks.values():
                stack.model, stack.model_url = model.model, model.model_url
            tasks = cpu.tasks_for(args.seconds)
            for n in range(args.rounds):
                order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
                for arm in order:
                    stack = stacks[arm]
                    stack.start_supervisor()
                    try:
                        run = window(stack, seconds=args.seconds, tasks=tasks, label=f"-{arm}{n}")
                    finally:
                        stack.stop_supervisor()
                    found[arm].append(run)
                    say(f"round {n} {arm}: {run.describe()}")
                if huey:
                    hueys.append(huey_window(kids, workdir, args.seconds))
                    say(f"round {n} huey: {hueys[-1]:.0f} steps/s at 64")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"machine: {m['nproc']} cores; load average at start {m['loadavg_at_start'][0]:.2f}")
    for arm, runs in found.items():
        ms = statistics.median(r.ms(r.supervisor_s) for r in runs)
        rms = statistics.median(r.ms(r.runners_s) for r in runs)
        rate = statistics.median(r.steps_per_s for r in runs)
        ratio = f"; {rate / statistics.median(hueys):.2f}x Huey" if hueys else ""
        each = ", ".join(f"{r.ms(r.supervisor_s):.3f}" for r in runs)
        reach = ", ".join(f"{r.ms(r.runners_s):.3f}" for r in runs)
        rates = ", ".join(f"{r.steps_per_s:.0f}" for r in runs)
        print(
            f"{arm}: supervisor CPU/step {ms:.3f} ms ({each}); runners {rms:.3f} ms ({reach});"
            f" steps/s {rate:.0f} ({rates}){ratio}"
        )
    if hueys:
        print(
            f"huey: {statistics.median(hueys):.0f} steps/s ({', '.join(f'{h:.0f}' for h in hueys)})"
        )


if __name__ == "__main__":
    _main()
