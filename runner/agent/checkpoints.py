"""An agent step's per-turn checkpoints and the resume from one (docs/design.md, Checkpoints).

After each completed turn that called tools, `Checkpointer` uploads the transcript (the
canonical JSON of the messages the next model request holds) and, when the worktree has
changes under the allowed paths, a bundle `start_sha..wip` of a wip commit of them, then
records the checkpoint under the attempt's fence. `resume_start` turns a lease's `ResumePoint`
back into those messages and that worktree; a resume point that cannot be read or applied is
logged and the attempt starts afresh, since checkpoints are a cache and never fail a step.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from runner import tracing
from runner.agent.workspace import Snapshot, Workspace
from runner.errors import LeaseLost, RunnerError
from runner.kinds import StepServices
from tether.messages import Checkpoint, ResumePoint
from tether.wire import canonical_json

log = structlog.get_logger(__name__)

# A checkpoint is finished even when the step is cancelled meanwhile (SIGTERM, a lost lease,
# a spent budget), but not waited for longer than this; the previous one then stands. On
# SIGTERM an agent step stops at once, then this (20 s at most) plus the shutdown release
# (runner.step.SHUTDOWN_RELEASE_S, 5 s) is 25 s, inside the unit's TimeoutStopSec=30
# (systemd/tether-runner.service) with 5 s left for the exit.
CHECKPOINT_TIMEOUT_S = 20.0


class Scratch(Protocol):
    """What checkpoints need of a workspace without a repository: a folder for their files."""

    @property
    def io(self) -> Path: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wip:
    """The worktree's changes as last stored: the snapshot and its bundle's digest."""

    snapshot: Snapshot
    bundle: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Start:
    """Where an attempt's loop starts: the messages so far, the turns already done and what
    they spent (for the step's `max_turns` and budget), and the resume point it goes on from.

    A resume point that could not be used (`skipped`) still counts its turns and tokens: they
    were spent, and numbering on from them keeps the step's checkpoints from going back."""

    messages: list[dict[str, Any]]
    turn: int = 0
    usage: dict[str, int] = dataclasses.field(default_factory=dict)
    resumed_from: ResumePoint | None = None
    skipped: str | None = None  # why the lease's resume point was not used
    wip: Wip | None = None


class Checkpointer:
    """Checkpoints one attempt's completed turns (see the module docstring)."""

    def __init__(
        self,
        *,
        services: StepServices,
        fence: int,
        step_id: str,
        workspace: Workspace | Scratch,
        paths: Sequence[str] | None,
        start: Start,
    ) -> None:
        self._services = services
        self._fence = fence
        self._step_id = step_id
        self._workspace = workspace
        self._paths = paths  # None: no repository, or nothing may be written
        self._before = start.usage
        self._wip = start.wip

    async def __call__(
        self, turn: int, messages: list[dict[str, Any]], usage: dict[str, int]
    ) -> None:
        """Checkpoint `turn` (`usage`: this attempt's running total); see the module docstring.
        `LeaseLost` when the supervisor refuses it as stale."""
        with tracing.span("tether.checkpoint", turn=turn, fence=self._fence) as span:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CHECKPOINT_TIMEOUT_S) as scope:
                try:
                    await self._save(turn, messages, usage)
                    span.set(outcome="saved")
                except LeaseLost:
                    raise
                except (RunnerError, OSError) as exc:
                    log.warning("checkpoint failed", turn=turn, error=str(exc))
                    span.set(outcome="failed", error=type(exc).__name__)
            if scope.cancelled_caught:
                log.warning("checkpoint timed out", turn=turn, timeout_s=CHECKPOINT_TIMEOUT_S)
                span.set(outcome="timed_out")

    async def _save(self, turn: int, messages: list[dict[str, Any]], usage: dict[str, int]) -> None:
        transcript = await self._services.upload(canonical_json(messages))
        wip = await self._store_wip(turn)
        step_usage = {k: self._before.get(k, 0) + usage.get(k, 0) for k in {*self._before, *usage}}
        await self._services.checkpoint(
            Checkpoint(
                fence=self._fence,
                turn=turn,
                transcript=transcript,
                bundle=None if wip is None else wip.bundle,
                sha=None if wip is None else wip.snapshot.sha,
                usage=dict(usage),
                step_usage=step_usage,
            )
        )
        log.info("checkpoint", turn=turn, transcript=transcript, wip=wip and wip.snapshot.sha)

    async def _store_wip(self, turn: int) -> Wip | None:
        space = self._workspace
        if self._paths is None or not isinstance(space, Workspace):
            return None
        previous = None if self._wip is None else self._wip.snapshot
        snap = await space.snapshot(
            step_id=self._step_id, paths=self._paths, message=f"tether wip {self._step_id}",
            previous=previous,
        )  # fmt: skip
        if snap is None:
            return None
        if self._wip is not None and snap is previous:
            return self._wip  # nothing changed since the last checkpoint: its bundle stands
        path = space.io / f"wip-{turn}.bundle"
        await space.write_bundle(path, snap.sha, fast=True)
        try:
            self._wip = Wip(snapshot=snap, bundle=await self._services.upload(path))
        finally:
            await anyio.Path(path).unlink(missing_ok=True)
        return self._wip


async def resume_start(
    resume: ResumePoint,
    *,
    services: StepServices,
    workspace: Workspace | Scratch,
    fresh: list[dict[str, Any]],
) -> Start:
    """The start of an attempt that resumes from `resume`: its messages, and its wip applied
    to the worktree. When that cannot be done, the fresh start (`fresh` messages, a clean
    worktree) with `skipped` saying why (see `Start`)."""
    try:
        messages = await _read_transcript(resume, services, workspace.io)
        wip = await _apply_wip(resume, services, workspace)
    except LeaseLost:
        raise
    except Exception as exc:  # a cache problem never fails the step
        why = str(exc) or type(exc).__name__
        log.warning("resume point not used", turn=resume.turn, fence=resume.fence, why=why)
        if isinstance(workspace, Workspace):
            await workspace.clean_checkout(workspace.start_sha)
        return Start(messages=list(fresh), turn=resume.turn, usage=dict(resume.usage), skipped=why)
    log.info("resuming", turn=resume.turn, fence=resume.fence, wip=resume.sha)
    return Start(
        messages=messages,
        turn=resume.turn,
        usage=dict(resume.usage),
        resumed_from=resume,
        wip=wip,
    )


async def _read_transcript(
    resume: ResumePoint, services: StepServices, io: Path
) -> list[dict[str, Any]]:
    path = io / "resume-transcript.json"
    await services.download(resume.transcript, path)
    messages = json.loads(await anyio.Path(path).read_bytes())
    if not (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise ValueError("the checkpoint's transcript is not a list of messages")
    return messages


async def _apply_wip(
    resume: ResumePoint, services: StepServices, workspace: Workspace | Scratch
) -> Wip | None:
    if resume.bundle is None:
        return None
    if resume.sha is None or not isinstance(workspace, Workspace):
        raise ValueError("the checkpoint's bundle has no commit, or no repository to apply it to")
    path = workspace.io / "resume.bundle"
    await services.download(resume.bundle, path)
    await workspace.import_bundle(path, resume.sha)
    await workspace.apply(resume.sha)
    tree = await workspace.tree_of(resume.sha)
    return Wip(snapshot=Snapshot(sha=resume.sha, tree=tree), bundle=resume.bundle)
