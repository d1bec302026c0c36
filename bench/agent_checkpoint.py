"""Cost of one agent checkpoint (issue 12, item 7): the wip commit of the worktree's changes,
its bundle and the transcript, uploaded to an in-memory store, and the checkpoint recorded.

`python -m bench.agent_checkpoint [--files N] [--diff-bytes B] [--rounds R]` builds an origin
of N small files, opens an attempt, and for each round rewrites files holding B bytes of new
content under src/ and times one checkpoint (a changed tree: snapshot, bundle, uploads), then
one more without changes (the bundle is not made again). Target: <= 50 ms for a 1 MB diff.

Wall time depends on what else the machine runs; the CPU time (this process and the git
processes it waited for) does not, so both are printed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from bench.agent_workspace import make_origin
from runner.agent import RepoCache
from runner.agent.checkpoints import Checkpointer, Start
from tether.messages import Checkpoint

FILE_BYTES = 100_000


class MemoryServices:
    """Uploads hashed and kept in memory; checkpoints counted."""

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.checkpoints = 0

    async def upload(self, data: bytes | Path) -> str:
        if isinstance(data, Path):
            data = await anyio.Path(data).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        self.store[digest] = data
        return digest

    async def download(self, digest: str, into: Path) -> None:
        await anyio.Path(into).write_bytes(self.store[digest])

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        self.checkpoints += 1


async def measure(files: int, diff_bytes: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-cp-") as scratch:
        origin = Path(scratch) / "origin"
        base = make_origin(origin, files)
        cache = RepoCache(Path(scratch) / "cache")
        messages = [{"role": "user", "content": "x" * 20_000}]
        async with cache.attempt(url=str(origin), base_sha=base, label="bench") as ws:
            services = MemoryServices()
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
                started = time.perf_counter()
                await save(turn, messages, {"total_tokens": turn})
                changed.append(time.perf_counter() - started)
                cpu.append(_cpu_s() - cpu_before)
                started = time.perf_counter()
                await save(turn + 1, messages, {"total_tokens": turn + 1})
                same.append(time.perf_counter() - started)
            assert services.checkpoints == 2 * rounds
    return {
        "changed_median_ms": 1000 * statistics.median(changed),
        "changed_max_ms": 1000 * max(changed),
        "changed_cpu_median_ms": 1000 * statistics.median(cpu),
        "unchanged_median_ms": 1000 * statistics.median(same),
    }


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=1_000)
    parser.add_argument("--diff-bytes", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    figures = anyio.run(measure, args.files, args.diff_bytes, args.rounds)
    print(f"agent checkpoint, {args.files:,} files, a {args.diff_bytes:,}-byte diff")
    for name, ms in figures.items():
        print(f"  {name:<22} {ms:8.1f} ms")


if __name__ == "__main__":
    main()
