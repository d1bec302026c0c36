"""Cost of one agent checkpoint (issue 12, item 7): the wip commit of the worktree's changes,
its bundle and the transcript, uploaded to an in-memory store, and the checkpoint recorded.

`python -m bench.agent_checkpoint [--files N] [--diff-bytes B] [--rounds R]` builds an origin
of N small files, opens an attempt, and for each round rewrites files holding B bytes of new
content under src/ and times one checkpoint (a changed tree: snapshot, bundle, uploads), then
one more without changes (the bundle is not made again). Target: <= 50 ms for a 1 MB diff.
`python -m bench` takes it with 10,000 files (1,000 quick, 100 smoke).

Wall time depends on what else the machine runs; the CPU time (this process and the git
processes it waited for) does not, so both are printed. Where a changed checkpoint's time goes
is timed too (`breakdown_ms`): each git command the workspace runs (by subcommand), and the
uploads (hashing and storing in memory; over HTTP see `bench.agent_upload`), by wrapping the
workspace module's `git` for the measurement's duration.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

from bench.agent_workspace import make_origin
from runner.agent import RepoCache
from runner.agent import workspace as workspace_module
from runner.agent.checkpoints import Checkpointer, Start
from tether.git import GitOutput
from tether.git import git as tether_git
from tether.logs import configure_logging
from tether.messages import Checkpoint

FILE_BYTES = 100_000
TARGET_MS = 50.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointCost:
    files: int
    diff_bytes: int
    rounds: int
    changed_median_ms: float
    changed_max_ms: float
    changed_cpu_median_ms: float  # this process and the git processes it waited for
    unchanged_median_ms: float
    breakdown_ms: dict[str, float]  # median per changed checkpoint, by part (see the docstring)
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
    """The workspace module's `git`, timed by subcommand, while the block runs."""
    real = workspace_module.git  # type: ignore[attr-defined]

    async def git(*args: str, **kwargs: Any) -> GitOutput:
        started = time.perf_counter()
        try:
            return await real(*args, **kwargs)
        finally:
            words = [a for a in args if not a.startswith("-") and "=" not in a]
            timings.add(f"git {words[0] if words else '?'}", time.perf_counter() - started)

    workspace_module.git = git  # type: ignore[attr-defined]
    try:
        yield
    finally:
        workspace_module.git = real  # type: ignore[attr-defined]


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


async def measure(
    files: int, diff_bytes: int, rounds: int, folder: Path | None = None
) -> CheckpointCost:
    """Take the measurement in a temporary folder under `folder` (the system's when None)."""
    timings = Timings()
    parts: list[dict[str, float]] = []
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
            save = Checkpointer(
                services=services, fence=1, step_id="bench-step", workspace=ws,
                paths=("src/",), start=Start(messages=messages),
            )  # fmt: skip
            changed, same, cpu = [], [], []
            for turn in range(1, 2 * rounds + 1, 2):
                for index in range(max(1, diff_bytes // FILE_BYTES)):
                    path = ws.tree / "src" / "big" / f"f{index}.txt"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(os.urandom(FILE_BYTES // 2).hex().encode())
                cpu_before = _cpu_s()
                timings.current = {}
                started = time.perf_counter()
                await save(turn, messages, {"total_tokens": turn})
                changed.append(time.perf_counter() - started)
                cpu.append(_cpu_s() - cpu_before)
                timings.current["rest (Python, checkpoint record)"] = changed[-1] - sum(
                    timings.current.values()
                )
                parts.append(timings.current)
                timings.current = None
                started = time.perf_counter()
                await save(turn + 1, messages, {"total_tokens": turn + 1})
                same.append(time.perf_counter() - started)
            assert services.checkpoints == 2 * rounds
    floor = []
    for _ in range(10):
        started = time.perf_counter()
        await tether_git("--version", cwd=Path.cwd())
        floor.append(time.perf_counter() - started)
    names = sorted({name for part in parts for name in part})
    medians = {n: 1000 * statistics.median(p.get(n, 0.0) for p in parts) for n in names}
    return CheckpointCost(
        files=files, diff_bytes=diff_bytes, rounds=rounds,
        changed_median_ms=1000 * statistics.median(changed),
        changed_max_ms=1000 * max(changed),
        changed_cpu_median_ms=1000 * statistics.median(cpu),
        unchanged_median_ms=1000 * statistics.median(same),
        breakdown_ms={n: ms for n, ms in medians.items() if ms > 0},  # the first round's alone: 0
        git_process_ms=1000 * statistics.median(floor),
    )  # fmt: skip


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
    for name, value in dataclasses.asdict(cost).items():
        if isinstance(value, float):
            print(f"  {name:<22} {value:8.1f} ms")
    print("  a changed checkpoint, median by part:")
    for name, ms in cost.breakdown_ms.items():
        print(f"    {name:<34} {ms:6.1f} ms")


if __name__ == "__main__":
    main()
