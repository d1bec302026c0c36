"""What the limits on agent commands cost (issue 22): the wall time of one `true` run as the
`run` tool runs it, bare (the reaper bypassed: the command as the sandbox wraps it) and
confined (the reaper, its rlimits and, where the host offers one, a cgroup made and removed),
without and with bubblewrap; and the worktree measurement after each command on a tree of
`FILES` files. `python -m bench.agent_confine`: prints figures, never passes or fails.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from tether.runner.agent.command import command_env, run_command
from tether.runner.agent.confine import Confiner, folder_bytes, host_cgroups
from tether.runner.agent.sandbox import Bubblewrap, NoSandbox, Sandbox, detect_sandbox

RUNS = 30
FILES = 5_000


async def bare(sandbox: Sandbox, tree: Path) -> float:
    started = time.perf_counter()
    process = await anyio.open_process(
        sandbox.wrap(["true"], tree=tree, home=tree),
        stdin=subprocess.DEVNULL,
        cwd=tree,
        env=command_env(tree),
        start_new_session=True,
    )
    await process.wait()
    await process.aclose()
    return time.perf_counter() - started


async def confined(sandbox: Sandbox, tree: Path, confiner: Confiner) -> float:
    started = time.perf_counter()
    await run_command(
        ["true"],
        tree=tree,
        home=tree,
        sandbox=sandbox,
        timeout_s=30,
        output_cap=1000,
        confiner=confiner,
    )
    return time.perf_counter() - started


def ms(samples: list[float]) -> str:
    p90 = sorted(samples)[int(len(samples) * 0.9)]
    return f"median {statistics.median(samples) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms"


async def main() -> None:
    found = await detect_sandbox([Path(sys.prefix), Path(sys.base_prefix)])
    sandboxes: list[Sandbox] = [NoSandbox()]
    if isinstance(found, Bubblewrap):
        sandboxes.append(found)
    cgroups = host_cgroups()
    print(f"cgroups: {'none' if cgroups is None else f'v{cgroups.version} {cgroups.controllers}'}")
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch)
        for sandbox in sandboxes:
            kinds = {
                "bare": None,
                "confined, no cgroup": Confiner(cgroups=lambda: None),
                "confined, cgroup": Confiner(),
            }
            for name, confiner in kinds.items():
                samples = []
                for _ in range(RUNS):
                    if confiner is None:
                        samples.append(await bare(sandbox, tree))
                    else:
                        samples.append(await confined(sandbox, tree, confiner))
                print(f"{sandbox.name:5} {name:20} {ms(samples)}")
        for n in range(FILES):
            (tree / f"f{n}").write_bytes(b"x" * 100)
        samples = []
        for _ in range(10):
            started = time.perf_counter()
            folder_bytes([tree])
            samples.append(time.perf_counter() - started)
        print(f"worktree measure, {FILES} files: {ms(samples)}")


if __name__ == "__main__":
    anyio.run(main)
