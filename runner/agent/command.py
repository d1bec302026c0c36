"""Running one command of an agent step (the `run` tool, a check, setup): under its limits
(`runner/agent/confine.py`), with a fixed environment that holds no secret, a timeout and an
output cap. Whatever it started is ended with it: when it exits, on timeout and on
cancellation (a lost lease cancels the step's scope), the reaper kills its whole process tree,
`setsid` children included, and its cgroup is emptied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
from anyio.abc import ByteReceiveStream

from tether.runner.agent.confine import Confiner
from tether.runner.agent.sandbox import Sandbox

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# After a timeout or cancellation the reaper gets SIGTERM and this long to kill the command's
# tree and exit; then its process group is killed outright.
REAPER_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommandOutcome:
    exit_code: int | None  # None: killed before it exited on its own
    timed_out: bool
    duration_s: float
    output: bytes  # stdout and stderr interleaved, at most the cap
    output_bytes: int  # everything it wrote, kept or not
    limit_hit: str | None = None  # `processes`, `memory`, `cpu`, `file_size`, when known


def command_env(home: Path) -> dict[str, str]:
    """The whole environment of a command: PATH (the runner's), HOME, LANG, and nothing else
    from the runner (no token, no model key, no proxy credentials)."""
    return {
        "PATH": os.environ.get("PATH", DEFAULT_PATH),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        # Bytecode caches would otherwise land in the worktree and in the candidate.
        "PYTHONDONTWRITEBYTECODE": "1",
    }


async def run_command(
    argv: Sequence[str],
    *,
    tree: Path,
    home: Path,
    sandbox: Sandbox,
    timeout_s: float,
    output_cap: int,
    confiner: Confiner,
    sink: Callable[[bytes], Awaitable[None]] | None = None,
    network: bool = False,
) -> CommandOutcome:
    """Run `argv` in `tree` under `sandbox`; see the module docstring. `sink`, when given, gets
    every chunk of the output as it comes (a check's full log); `network` lets the command
    reach the network (setup's)."""
    started = time.monotonic()
    kept = bytearray()
    total = 0

    async def drain(stream: ByteReceiveStream) -> None:
        nonlocal total
        async for chunk in stream:
            total += len(chunk)
            if len(kept) < output_cap:
                kept.extend(chunk[: output_cap - len(kept)])
            if sink is not None:
                await sink(chunk)

    wrapped = sandbox.wrap(argv, tree=tree, home=home, network=network)
    async with confiner.confine(wrapped) as confined:
        process = await anyio.open_process(
            confined.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=tree,
            env=command_env(home),
            start_new_session=True,
        )
        exited = False
        try:
            with anyio.move_on_after(timeout_s) as deadline:
                async with anyio.create_task_group() as group:
                    assert process.stdout is not None
                    group.start_soon(drain, process.stdout)
                    await process.wait()
                    exited = True
        finally:
            with anyio.CancelScope(shield=True):
                await _end(process)
        hit = confined.limit_hit(process.returncode)
    return CommandOutcome(
        exit_code=process.returncode if exited else None,
        timed_out=deadline.cancelled_caught,
        duration_s=round(time.monotonic() - started, 3),
        output=bytes(kept),
        output_bytes=total,
        limit_hit=hit,
    )


async def _end(process: anyio.abc.Process) -> None:
    """Make sure the reaper and everything under it are gone: SIGTERM lets it kill the
    command's tree; its process group is killed if it has not exited within the grace."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        with anyio.move_on_after(REAPER_GRACE_S):
            await process.wait()
    _kill_group(process.pid)
    await process.wait()
    await process.aclose()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
