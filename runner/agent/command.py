"""Running one allowed command for the `run` tool: in its own process group, with a fixed
environment that holds no secret, a timeout and an output cap; the whole group is killed on
timeout, on cancellation (a lost lease cancels the step's scope) and when the command ends,
so nothing it started outlives it (a child that leaves the group with setsid escapes this,
unless the sandbox's PID namespace holds it: see `runner/agent/sandbox.py`).
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

from tether.runner.agent.sandbox import Sandbox

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommandOutcome:
    exit_code: int | None  # None: killed before it exited on its own
    timed_out: bool
    duration_s: float
    output: bytes  # stdout and stderr interleaved, at most the cap
    output_bytes: int  # everything it wrote, kept or not


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
    sink: Callable[[bytes], Awaitable[None]] | None = None,
) -> CommandOutcome:
    """Run `argv` in `tree` under `sandbox`; see the module docstring. `sink`, when given, gets
    every chunk of the output as it comes (a check's full log)."""
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

    process = await anyio.open_process(
        sandbox.wrap(argv, tree=tree, home=home),
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
                # Whatever it left running in its group goes too, which also ends the output.
                _kill_group(process.pid)
    finally:
        _kill_group(process.pid)
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()
    return CommandOutcome(
        exit_code=process.returncode if exited else None,
        timed_out=deadline.cancelled_caught,
        duration_s=round(time.monotonic() - started, 3),
        output=bytes(kept),
        output_bytes=total,
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
