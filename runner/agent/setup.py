"""A step's setup (docs/design.md, Setup): the repository's setup commands (`repo add --setup`)
and then the payload's, run one after another in the worktree at the start point, before the
first model call and before anything of a checkpoint is applied, so before the model has
written anything. Each runs in the sandbox like a check, under the same limits, environment
(no token, key or credential) and timeout, but with the network, which fetching a toolchain
needs (`uv sync`, `npm ci`). The model's `run`, the checks and a verifier then see what setup
made: what it left untracked in the tree (a `.venv/`) is kept by the checks' clean checkouts
and never committed.

Their output, one log, is uploaded as an artifact. A command that fails (or outlives its
timeout, or cannot be split into words) ends setup and fails the step `setup_failed`, naming
the command and the log's digest.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from tether.runner import tracing
from tether.runner.agent.checks import CheckLimits, CheckLog
from tether.runner.agent.command import run_command
from tether.runner.agent.confine import Confiner, check_workspace_size
from tether.runner.agent.errors import SetupFailed
from tether.runner.agent.sandbox import Sandbox, private_tmp
from tether.runner.agent.workspace import Workspace

log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SetupRun:
    """What setup did, for the step's output."""

    commands: tuple[str, ...]
    log: str  # the digest of its output
    duration_s: float
    kept: tuple[str, ...]  # what it left untracked in the tree

    def as_dict(self) -> dict[str, Any]:
        return {
            "commands": list(self.commands),
            "log": self.log,
            "duration_s": self.duration_s,
            "kept": list(self.kept),
        }


async def run_setup(
    workspace: Workspace,
    commands: Sequence[str],
    *,
    sandbox: Sandbox,
    confiner: Confiner,
    upload: Callable[[Path], Awaitable[str]],
    limits: CheckLimits,
) -> SetupRun:
    """Run `commands` in the worktree, upload their log, and mark what they made as kept;
    `SetupFailed` when one fails."""
    await workspace.ready()
    started = time.monotonic()
    path = workspace.io / "setup.log"
    failure: str | None = None
    with tracing.span("tether.setup", commands=len(commands)):
        async with CheckLog(path, limits.log_max_bytes) as out:
            for command in commands:
                await out.write(f"$ {command}\n".encode())
                failure = await _run_one(command, workspace, sandbox, confiner, limits, out)
                if failure is not None:
                    await out.finish(failure)
                    break
            else:
                await out.finish()
    digest = await upload(path)
    duration_s = round(time.monotonic() - started, 3)
    if failure is not None:
        log.warning("setup failed", failure=failure, log=digest)
        raise SetupFailed(f"setup_failed: {failure} (log {digest})")
    await check_workspace_size(
        (workspace.tree, workspace.home, private_tmp(workspace.home)),
        confiner.limits,
        after="setup",
    )
    workspace.kept = await workspace.untracked()
    log.info("setup ran", commands=len(commands), duration_s=duration_s, log=digest)
    return SetupRun(
        commands=tuple(commands), log=digest, duration_s=duration_s, kept=workspace.kept
    )


async def _run_one(
    command: str,
    workspace: Workspace,
    sandbox: Sandbox,
    confiner: Confiner,
    limits: CheckLimits,
    out: CheckLog,
) -> str | None:
    """Run one setup command into `out`; what went wrong, or None."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return f"cannot run `{command}`: {exc}"
    if not argv:
        return "a setup command is empty"
    outcome = await run_command(
        argv,
        tree=workspace.tree,
        home=workspace.home,
        sandbox=sandbox,
        timeout_s=limits.timeout_s,
        output_cap=0,
        confiner=confiner,
        sink=out.write,
        network=True,
    )
    if outcome.timed_out or outcome.exit_code is None:
        return f"`{command}` was killed after the timeout of {limits.timeout_s:g} s"
    if outcome.exit_code != 0:
        hit = "" if outcome.limit_hit is None else f" (its {outcome.limit_hit} limit)"
        return f"`{command}` exited {outcome.exit_code}{hit}"
    return None
