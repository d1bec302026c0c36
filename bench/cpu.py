"""The supervisor's CPU per committed step at concurrency 64 (issue 17), and where it goes.

`per_step`: real runners at 64 slots against the bench's supervisor, the stand-in model at
zero latency; once they run, the supervisor process's CPU (user + system, psutil) is read
before and after a window and divided by the steps committed in it (effects whose commit
time, on the supervisor's clock, falls in the window). `profile`: the same load for a shorter
window on a supervisor started under `bench.profiled` (cProfile on every thread's CPU clock),
summarized by `bench.profile_groups`; the bench's supervisor is then started again.

`python -m bench.cpu [--quick | --smoke] [--repeat N]` takes both alone on a fresh supervisor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench import machine, profile_groups, profiled, report, seed, spy, steps
from bench.procs import children
from bench.report import say
from bench.stack import Stack
from tether.logs import configure_logging

CONCURRENCY = 64
TARGET_MS = 0.5
WARM_S = 1.0  # after the runners' start-up: connections open, first claims answered
MARK_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CpuPerStep:
    concurrency: int
    runners: int
    steps: int
    cpu_s: float
    window_s: float

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.cpu_s / self.steps if self.steps else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.window_s if self.window_s > 0 else 0.0

    def asdict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "ms_per_step": self.ms_per_step,
            "steps_per_s": self.steps_per_s,
            "cores": self.cpu_s / self.window_s,
        }


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def committed_between(db: Path, pool: str, start: float, end: float) -> int:
    """Steps of `pool` whose commit time (the supervisor's clock) is within [start, end)."""
    return sum(1 for _, committed in seed.step_rows(db, pool) if start <= committed < end)


def per_step(
    stack: Stack,
    *,
    seconds: float,
    tasks: int,
    label: str = "-cpu",
    mark: Callable[[], None] | None = None,
) -> CpuPerStep:
    """The supervisor's CPU seconds / committed steps over `seconds` at concurrency 64;
    `mark` is called as the window starts and as it ends."""
    assert stack.supervisor is not None
    pool = steps.prepare(stack, concurrency=CONCURRENCY, tasks=tasks, label=label)
    runners = steps.processes_for(CONCURRENCY)
    procs = stack.start_runners(pool, pool, CONCURRENCY, runners)
    supervisor = psutil.Process(stack.supervisor.pid)
    try:
        time.sleep(steps.STARTUP_S + WARM_S)
        if mark is not None:
            mark()
        start, cpu0 = time.time(), _cpu_s(supervisor)
        time.sleep(seconds)
        end, cpu1 = time.time(), _cpu_s(supervisor)
        if mark is not None:
            mark()
    finally:
        stack.kids.stop_all(procs, grace_s=10)
    committed = committed_between(stack.db, pool, start, end)
    seed.cancel_pool(stack.db, pool)
    return CpuPerStep(
        concurrency=CONCURRENCY,
        runners=runners,
        steps=committed,
        cpu_s=cpu1 - cpu0,
        window_s=end - start,
    )


def profile(stack: Stack, *, seconds: float, tasks: int, ms_per_step: float) -> dict[str, Any]:
    """`per_step`'s load, profiled: sampled by py-spy when it is installed (`bench.spy`), else
    on a supervisor started for it under cProfile (`bench.profiled`, then the bench's own
    supervisor is started again). The summary of where the CPU went (`bench.profile_groups`),
    its shares also given as parts of `ms_per_step`, the CPU per step measured unprofiled (a
    profiler adds its own cost, cProfile's several times the supervisor's)."""
    program = spy.find()
    if program is None:
        return _profile_under_cprofile(stack, seconds=seconds, tasks=tasks, ms_per_step=ms_per_step)
    out = stack.workdir / "supervisor.spy"
    sampling: list[subprocess.Popen[bytes]] = []

    def mark() -> None:
        if not sampling:
            assert stack.supervisor is not None
            sampling.append(spy.start(program, stack.supervisor.pid, seconds, out))

    taken = per_step(stack, seconds=seconds, tasks=tasks, label="-profiled", mark=mark)
    samples = spy.finish(sampling[0], out, timeout_s=seconds + 60)
    # py-spy reads the process without stopping it: the window's own CPU per step is the
    # measure here, whatever `ms_per_step` says.
    return profile_groups.from_samples(
        samples, rate_hz=spy.RATE_HZ, ms_per_step=taken.ms_per_step, steps=taken.steps
    )


def _profile_under_cprofile(
    stack: Stack, *, seconds: float, tasks: int, ms_per_step: float
) -> dict[str, Any]:
    out = stack.workdir / "supervisor.prof"
    stack.stop_supervisor()
    stack.start_supervisor(profile=out)
    marks: list[Path] = []

    def mark() -> None:
        assert stack.supervisor is not None
        marks.append(Path(f"{out}.{len(marks) + 1}"))
        stack.supervisor.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + MARK_TIMEOUT_S
        while not marks[-1].exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the profiled supervisor wrote no {marks[-1].name}")
            time.sleep(0.02)

    try:
        taken = per_step(stack, seconds=seconds, tasks=tasks, label="-profiled", mark=mark)
    finally:
        stack.stop_supervisor()
        stack.start_supervisor()
    return profile_groups.from_pstats(
        profiled.delta(*marks), ms_per_step=ms_per_step, steps=taken.steps
    )


def record(r: dict[str, Any], runs: list[CpuPerStep]) -> None:
    """The median of `runs` (by ms per step) and all of them, into the results."""
    ms = [run.ms_per_step for run in runs]
    middle = sorted(runs, key=lambda run: run.ms_per_step)[len(runs) // 2]
    r["supervisor_cpu_per_step_ms"] = statistics.median(ms)
    r["supervisor_cpu"] = {
        **middle.asdict(),
        "runs": [run.asdict() for run in runs],
        "target_ms": TARGET_MS,
    }


def describe(run: CpuPerStep) -> str:
    return (
        f"supervisor CPU per step at {run.concurrency}: {run.ms_per_step:.3f} ms"
        f" ({run.steps} steps in {run.window_s:.1f} s, {run.steps_per_s:.0f}/s,"
        f" {run.cpu_s / run.window_s:.2f} cores)"
    )


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter windows")
    size.add_argument("--smoke", action="store_true", help="only prove it runs")
    parser.add_argument("--repeat", type=int, default=3, help="CPU readings (median reported)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled run")
    parser.add_argument("--dir", type=Path, default=None, help="where the work folder goes")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    seconds, profile_s = (0.5, 0.5) if args.smoke else (3.0, 3.0) if args.quick else (10.0, 5.0)
    configure_logging(json_lines=True, level="warning")
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-cpu-", dir=args.dir))
    r: dict[str, Any] = {"machine": machine.describe(workdir)}
    try:
        db = workdir / "ledger.db"
        seed.create_tasks(db, "warm", 1, approve=False)
        with children(workdir) as kids:
            stack = Stack(kids=kids, workdir=workdir, db=db)
            stack.start_supervisor()
            stack.start_model(latency_s=0.0)
            runs = []
            for n in range(args.repeat):
                run = per_step(stack, seconds=seconds, tasks=tasks_for(seconds), label=f"-cpu{n}")
                say(describe(run))
                runs.append(run)
            record(r, runs)
            if not args.no_profile:
                r["supervisor_profile"] = profile(
                    stack,
                    seconds=profile_s,
                    tasks=tasks_for(profile_s),
                    ms_per_step=r["supervisor_cpu_per_step_ms"],
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    m = r["machine"]
    print(
        f"machine: {m['nproc']} cores, {m['cpu_model']};"
        f" load average at start {m['loadavg_at_start'][0]:.2f}"
    )
    print("\n".join(report.cpu_rows(r)))
    if "supervisor_profile" in r:
        print("\n".join(profile_groups.lines(r["supervisor_profile"])))
    if args.json:
        args.json.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def tasks_for(seconds: float, rate: float = 1000.0) -> int:
    """Enough queued tasks for the window and its warm-up at `rate` steps/s, and a fifth more.
    (A pool that drains early leaves the supervisor idle for the rest of the window: its CPU
    per step then reads a little high.)"""
    return min(20_000, int(200 + 1.2 * rate * (seconds + steps.STARTUP_S + WARM_S)))


if __name__ == "__main__":
    _main()
