"""Cost of one agent checkpoint (issue 12, item 7; issue 17: a turn's checkpoint <= 50 ms for a
1 MB diff): what the turn waits for, and what is done beside the next model call.

A turn's checkpoint (runner/agent/checkpoints.py) is queued at the turn's end and the loop asks
the model again at once: that is the turn's path, and the target. Beside that model call run
the stage (the files the tools wrote that turn added to the attempt's private index and its
tree written), which the next turn's tools wait for, then the send (the wip commit, its
bundle, the transcript and bundle uploads, the record). So the stage costs the loop time only
when the model answers sooner than it takes.

`python -m bench.agent_checkpoint [--files N] [--diff-bytes B] [--rounds R]` builds an origin
of N small files, opens an attempt, and for each round times three turns with the runner's
`Checkpointer`, each part alone (the turn's path, the stage, the send until recorded): one
whose tools wrote files holding B bytes of new content under src/ (the target), one that
wrote nothing, and one after a command ran with B bytes changed again (the command may have
written anything, so every allowed path is added). `python -m bench` takes it with 10,000
files (1,000 quick, 100 smoke).

Wall time depends on what else the machine runs; the CPU time (this process and the git
processes it waited for) does not, so both are printed. Where a written turn's checkpoint time
goes is timed too (`breakdown_ms`, stage and send; `stage_parts` names the stage's): each git
command the workspace runs (by subcommand) and the uploads (hashing and storing in memory; over
HTTP see `bench.agent_upload`), by wrapping the workspace module's `git` for the measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import anyio

from bench.agent_workspace import make_origin
from tether.git import GitOutput, TreeGit
from tether.git import git as tether_git
from tether.logs import configure_logging
from tether.runner.agent import RepoCache
from tether.runner.agent.checkpoints import Checkpointer, Start
from tether.wire.records import Checkpoint

FILE_BYTES = 100_000
TARGET_MS = 50.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointCost:
    files: int
    diff_bytes: int
    rounds: int
    # A turn whose tools wrote the diff: what the turn waited for before its next model call
    # (the target) ...
    changed_median_ms: float
    changed_max_ms: float
    changed_cpu_median_ms: float  # this process and the git processes it waited for
    # ... the stage beside that call (the next turn's tools wait for it) ...
    stage_median_ms: float
    stage_max_ms: float
    stage_cpu_median_ms: float
    # ... and the send after it, until recorded.
    background_median_ms: float
    background_max_ms: float
    background_cpu_median_ms: float
    unchanged_stage_median_ms: float  # the stage of a turn whose tools wrote nothing
    after_command_stage_median_ms: float  # the stage after a command ran: every path added
    after_command_stage_cpu_median_ms: float
    breakdown_ms: dict[str, float]  # median per part of a written turn's stage and send
    stage_parts: tuple[str, ...]  # the parts of `breakdown_ms` in the stage
    git_process_ms: float  # median of `git --version` run the same way: a git process's floor


class Timings:
    """Seconds spent per part of the checkpoint being timed (`part` names the current one)."""

    def __init__(self) -> None:
        self.current: dict[str, float] | None = None

    def add(self, part: str, seconds: float) -> None:
        if self.current is not None:
            self.current[part] = self.current.get(part, 0.0) + seconds


@contextlib.contextmanager
def timed_git(timings: Timings) -> Iterator[None]:
    """Git on the worktree (`TreeGit`), timed by subcommand, while the block runs."""
    real = TreeGit.__call__

    async def git(self: TreeGit, *args: str, **kwargs: Any) -> GitOutput:
        started = time.perf_counter()
        try:
            return await real(self, *args, **kwargs)
        finally:
            words = [a for a in args if not a.startswith("-") and "=" not in a]
            timings.add(f"git {words[0] if words else '?'}", time.perf_counter() - started)

    TreeGit.__call__ = git  # type: ignore[method-assign]
    try:
        yield
    finally:
        TreeGit.__call__ = real  # type: ignore[method-assign]


class MemoryServices:
    """Uploads hashed and kept in memory; checkpoints counted."""

    def __init__(self, timings: Timings | None = None) -> None:
        self.store: dict[str, bytes] = {}
        self.checkpoints = 0
        self.timings = timings or Timings()

    async def upload(self, data: bytes | Path) -> str:
        started = time.perf_counter()
        if isinstance(data, Path):
            data = await anyio.Path(data).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        self.store[digest] = data
        self.timings.add("uploads (hash, store)", time.perf_counter() - started)
        return digest

    async def download(self, digest: str, into: Path) -> None:
        await anyio.Path(into).write_bytes(self.store[digest])

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        self.checkpoints += 1


TURN_REST = "the turn's path (Python)"
STAGE_REST = "rest of the stage (Python)"
SEND_REST = "rest of the send (Python, checkpoint record)"


@dataclasses.dataclass
class Reading:
    """One part of one checkpoint: wall and CPU seconds, and seconds by part."""

    wall_s: float
    cpu_s: float
    parts: dict[str, float]


async def timed(timings: Timings, rest: str, part: Callable[[], Awaitable[None]]) -> Reading:
    """Run `part` with `timings` collecting into a fresh dict; the untimed rest is `rest`."""
    parts: dict[str, float] = {}
    timings.current = parts
    cpu_before = _cpu_s()
    started = time.perf_counter()
    await part()
    wall = time.perf_counter() - started
    timings.current = None
    parts[rest] = max(0.0, wall - sum(parts.values()))
    return Reading(wall_s=wall, cpu_s=_cpu_s() - cpu_before, parts=parts)


async def measure(
    files: int, diff_bytes: int, rounds: int, folder: Path | None = None
) -> CheckpointCost:
    """Take the measurement in a temporary folder under `folder` (the system's when None)."""
    timings = Timings()
    turn: list[Reading] = []
    stage: list[Reading] = []
    send: list[Reading] = []
    unchanged: list[float] = []
    after_command: list[Reading] = []
    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-cp-", dir=folder) as scratch,
        timed_git(timings),
    ):
        origin = Path(scratch) / "origin"
        base = make_origin(origin, files)
        cache = RepoCache(Path(scratch) / "cache")
        messages = [{"role": "user", "content": "x" * 20_000}]
        async with cache.attempt(url=str(origin), base_sha=base, label="bench") as ws:
            services = MemoryServices(timings)
            wrote: list[Collection[str] | None] = [frozenset()]  # what the "tools" wrote

            def written() -> Collection[str] | None:
                paths, wrote[0] = wrote[0], frozenset()
                return paths

            save = Checkpointer(
                services=services,
                fence=1,
                step_id="bench-step",
                workspace=ws,
                paths=("src/",),
                start=Start(messages=messages),
                written=written,
            )
            count = 0

            async def checkpoint() -> tuple[Reading, Reading, Reading]:
                nonlocal count
                count += 1
                return (
                    await timed(timings, TURN_REST, lambda: save(count, messages, {})),
                    await timed(timings, STAGE_REST, save.staged),
                    await timed(timings, SEND_REST, save.settled),
                )

            async with save.running():
                for _ in range(rounds):
                    wrote[0] = _write_diff(ws.tree, diff_bytes)
                    readings = await checkpoint()
                    for kept, reading in zip((turn, stage, send), readings, strict=True):
                        kept.append(reading)
                    _, staged, _ = await checkpoint()  # the tools wrote nothing
                    unchanged.append(staged.wall_s)
                    _write_diff(ws.tree, diff_bytes)
                    wrote[0] = None  # a command ran
                    _, staged, _ = await checkpoint()
                    after_command.append(staged)
            assert services.checkpoints == 3 * rounds
    floor = []
    for _ in range(10):
        started = time.perf_counter()
        await tether_git("--version", cwd=Path.cwd())
        floor.append(time.perf_counter() - started)
    return CheckpointCost(
        files=files,
        diff_bytes=diff_bytes,
        rounds=rounds,
        changed_median_ms=_ms(statistics.median(r.wall_s for r in turn)),
        changed_max_ms=_ms(max(r.wall_s for r in turn)),
        changed_cpu_median_ms=_ms(statistics.median(r.cpu_s for r in turn)),
        stage_median_ms=_ms(statistics.median(r.wall_s for r in stage)),
        stage_max_ms=_ms(max(r.wall_s for r in stage)),
        stage_cpu_median_ms=_ms(statistics.median(r.cpu_s for r in stage)),
        background_median_ms=_ms(statistics.median(r.wall_s for r in send)),
        background_max_ms=_ms(max(r.wall_s for r in send)),
        background_cpu_median_ms=_ms(statistics.median(r.cpu_s for r in send)),
        unchanged_stage_median_ms=_ms(statistics.median(unchanged)),
        after_command_stage_median_ms=_ms(statistics.median(r.wall_s for r in after_command)),
        after_command_stage_cpu_median_ms=_ms(statistics.median(r.cpu_s for r in after_command)),
        breakdown_ms={**_medians(stage), **_medians(send)},
        stage_parts=tuple(_medians(stage)),
        git_process_ms=_ms(statistics.median(floor)),
    )


def _write_diff(tree: Path, diff_bytes: int) -> frozenset[str]:
    """Rewrite files under src/big/ with `diff_bytes` of new content; their paths."""
    paths = set()
    for index in range(max(1, diff_bytes // FILE_BYTES)):
        path = tree / "src" / "big" / f"f{index}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(FILE_BYTES // 2).hex().encode())
        paths.add(path.relative_to(tree).as_posix())
    return frozenset(paths)


def _medians(readings: list[Reading]) -> dict[str, float]:
    """Median milliseconds per part over `readings`, the parts that took any time."""
    names = sorted({name for r in readings for name in r.parts})
    medians = {n: _ms(statistics.median(r.parts.get(n, 0.0) for r in readings)) for n in names}
    return {n: ms for n, ms in medians.items() if ms > 0}


def _ms(seconds: float) -> float:
    return 1000 * seconds


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=1_000)
    parser.add_argument("--diff-bytes", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=None, help="where the repository goes")
    args = parser.parse_args()
    configure_logging(json_lines=False, level="warning")
    cost = anyio.run(measure, args.files, args.diff_bytes, args.rounds, args.dir)
    print(f"agent checkpoint, {args.files:,} files, a {args.diff_bytes:,}-byte diff")
    print(
        f"  the turn's path (target <= {TARGET_MS:g} ms): median {cost.changed_median_ms:.2f} ms,"
        f" max {cost.changed_max_ms:.2f} ms, CPU {cost.changed_cpu_median_ms:.2f} ms"
    )
    print(
        f"  beside the next model call, the stage (the next turn's tools wait for it): median"
        f" {cost.stage_median_ms:.1f} ms, max {cost.stage_max_ms:.1f} ms, CPU"
        f" {cost.stage_cpu_median_ms:.1f} ms"
    )
    print(
        f"  then the send, until recorded: median {cost.background_median_ms:.1f} ms,"
        f" max {cost.background_max_ms:.1f} ms, CPU {cost.background_cpu_median_ms:.1f} ms"
    )
    print(f"  the stage when the tools wrote nothing: {cost.unchanged_stage_median_ms:.1f} ms")
    print(
        f"  the stage after a command ran: {cost.after_command_stage_median_ms:.1f} ms"
        f" (CPU {cost.after_command_stage_cpu_median_ms:.1f} ms)"
    )
    print(f"  a git process's floor: {cost.git_process_ms:.1f} ms")
    print("  a written turn's checkpoint, median by part:")
    for name, ms in cost.breakdown_ms.items():
        where = "stage" if name in cost.stage_parts else "send"
        print(f"    {where:<6} {name:<44} {ms:6.1f} ms")


if __name__ == "__main__":
    main()
