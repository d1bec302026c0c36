"""Time to give an agent attempt its fresh worktree from a warm mirror of a 10,000-file
repository (issue 17 wants lease -> first model call within 0.5 s with such a mirror).

`python -m bench.agent_workspace [--files N] [--rounds R]` builds an origin of N small files
in a temporary folder (under --dir: put it on the disk the runner's cache directory would use),
opens one attempt to warm the mirror (the cold figure includes the
fetch), then opens and removes R more attempts and prints the median and worst of each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import anyio

from tether.runner.agent import RepoCache


def make_origin(root: Path, files: int) -> str:
    """An origin repository of `files` small files in folders of 100; returns its head."""
    root.mkdir()
    for index in range(files):
        path = root / "src" / f"d{index // 100:03d}" / f"f{index:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {index}\n")
    env = {
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
        "PATH": "/usr/bin:/bin",
    }
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, check=True, text=True
    )
    return head.stdout.strip()


async def measure(files: int, rounds: int, folder: Path | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-ws-", dir=folder) as scratch:
        origin = Path(scratch) / "origin"
        base = make_origin(origin, files)
        cache = RepoCache(Path(scratch) / "cache")
        started = time.perf_counter()
        first = await cache.open(url=str(origin), base_sha=base, label="cold")
        cold = time.perf_counter() - started
        await first.remove()
        opens, removes = [], []
        for index in range(rounds):
            started = time.perf_counter()
            workspace = await cache.open(url=str(origin), base_sha=base, label=f"warm{index}")
            opens.append(time.perf_counter() - started)
            started = time.perf_counter()
            record = await workspace.remove()
            removes.append(time.perf_counter() - started)
            assert record.gone, record
    return {
        "cold_open_s": cold,
        "warm_open_median_s": statistics.median(opens),
        "warm_open_max_s": max(opens),
        "remove_median_s": statistics.median(removes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=None, help="where the cache goes")
    args = parser.parse_args()
    figures = anyio.run(measure, args.files, args.rounds, args.dir)
    where = args.dir or Path(tempfile.gettempdir())
    print(f"agent workspace, {args.files:,} files, {args.rounds} rounds, in {where}")
    for name, seconds in figures.items():
        print(f"  {name:<20} {seconds:7.3f} s")


if __name__ == "__main__":
    main()
