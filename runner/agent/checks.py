"""A task's expected checks, run by the runner at the candidate before the worktree is removed
(docs/design.md, The agent kind): each in a clean checkout of the candidate, under the same
sandbox, environment and limits as the `run` tool, its full log uploaded. A check that leaves
the worktree past `worktree_max_mb` fails the step `worktree_too_large`.

A check's log is stdout and stderr interleaved. Past `log_max_bytes` its first and last halves
are kept with a line between saying how many bytes were left out; a check that outlived its
timeout is killed with its process group, reported with exit code 124 (as timeout(1) does) and
a last line saying so.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import structlog

from tether.runner import tracing
from tether.runner.agent.command import run_command
from tether.runner.agent.confine import Confiner, check_workspace_size
from tether.runner.agent.sandbox import Sandbox, private_tmp
from tether.runner.agent.workspace import Workspace
from tether.wire.records import CheckRun, CheckSpec

log = structlog.get_logger(__name__)

TIMED_OUT_EXIT_CODE = 124
UNPARSABLE_EXIT_CODE = 127  # the command line could not be split into words: nothing ran


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckLimits:
    timeout_s: float = 600.0
    log_max_bytes: int = 2 * 1024 * 1024


class CheckLog:
    """A check's log file: everything up to half the cap as it comes, then the last half of
    the cap kept in memory and written after a note of what was left out."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self._head_cap = cap - cap // 2
        self._tail_cap = cap // 2
        self._head = 0
        self._tail = bytearray()
        self._total = 0
        self._file: anyio.AsyncFile[bytes] | None = None

    async def __aenter__(self) -> CheckLog:
        self._file = await anyio.open_file(self.path, "wb")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._file is not None
        await self._file.aclose()

    async def write(self, chunk: bytes) -> None:
        assert self._file is not None
        self._total += len(chunk)
        if self._head < self._head_cap:
            part = chunk[: self._head_cap - self._head]
            await self._file.write(part)
            self._head += len(part)
            chunk = chunk[len(part) :]
        if chunk:
            self._tail.extend(chunk)
            del self._tail[: max(0, len(self._tail) - self._tail_cap)]

    async def finish(self, note: str | None = None) -> None:
        """Write the kept tail (after a note of what was left out) and `note`, if any."""
        assert self._file is not None
        left_out = self._total - self._head - len(self._tail)
        if left_out > 0:
            await self._file.write(f"\n[tether: {left_out} bytes of the log left out]\n".encode())
        await self._file.write(bytes(self._tail))
        if note:
            await self._file.write(f"\n[tether: {note}]\n".encode())


async def run_checks(
    workspace: Workspace,
    candidate: str,
    specs: Sequence[CheckSpec],
    *,
    sandbox: Sandbox,
    upload: Callable[[Path], Awaitable[str]],
    limits: CheckLimits,
    confiner: Confiner,
) -> dict[str, CheckRun]:
    """Run each check at `candidate` and upload its log; the runs by check name."""
    runs: dict[str, CheckRun] = {}
    with tracing.span("tether.checks", checks=len(specs)):
        for index, spec in enumerate(specs):
            with tracing.span("tether.check", check=spec.name) as span:
                runs[spec.name] = await _check(
                    workspace, candidate, index, spec, sandbox, upload, limits, confiner
                )
                span.set(exit_code=runs[spec.name].exit_code, duration_s=runs[spec.name].duration_s)
    return runs


async def _check(
    workspace: Workspace,
    candidate: str,
    index: int,
    spec: CheckSpec,
    sandbox: Sandbox,
    upload: Callable[[Path], Awaitable[str]],
    limits: CheckLimits,
    confiner: Confiner,
) -> CheckRun:
    # Each check starts from the candidate alone: neither what the tools wrote outside the
    # allowed paths nor what an earlier check left behind is there.
    await workspace.clean_checkout(candidate)
    home = workspace.io / f"check-{index}-home"
    await anyio.Path(home).mkdir()
    path = workspace.io / f"check-{index}.log"
    try:
        run = await _run_one(spec, workspace.tree, home, path, sandbox, limits, confiner)
        await check_workspace_size(
            (workspace.tree, home, private_tmp(home)),
            confiner.limits,
            after=f"check {spec.name!r}",
        )
    finally:
        for folder in (home, private_tmp(home)):
            await anyio.to_thread.run_sync(functools.partial(shutil.rmtree, folder, True))
    digest = await upload(path)
    log.info("check ran", check=spec.name, exit_code=run[0], duration_s=run[1], log=digest)
    return CheckRun(log=digest, exit_code=run[0], duration_s=run[1])


async def _run_one(
    spec: CheckSpec,
    tree: Path,
    home: Path,
    path: Path,
    sandbox: Sandbox,
    limits: CheckLimits,
    confiner: Confiner,
) -> tuple[int, float]:
    async with CheckLog(path, limits.log_max_bytes) as out:
        try:
            argv = shlex.split(spec.command)
        except ValueError as exc:
            argv = []
            why = f"{exc}"
        else:
            why = "the command is empty"
        if not argv:
            await out.finish(f"cannot run {spec.command!r}: {why}")
            return UNPARSABLE_EXIT_CODE, 0.0
        # A fresh HOME of its own: nothing the agent's commands put in theirs (a
        # usercustomize.py, a config file) reaches the check.
        outcome = await run_command(
            argv,
            tree=tree,
            home=home,
            sandbox=sandbox,
            timeout_s=limits.timeout_s,
            output_cap=0,
            confiner=confiner,
            sink=out.write,
        )
        if outcome.timed_out or outcome.exit_code is None:
            await out.finish(f"killed after the check timeout of {limits.timeout_s:g} s")
            return TIMED_OUT_EXIT_CODE, outcome.duration_s
        hit = outcome.limit_hit
        await out.finish(None if hit is None else f"the command ran into its {hit} limit")
        return outcome.exit_code, outcome.duration_s
