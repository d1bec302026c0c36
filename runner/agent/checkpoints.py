"""An agent step's per-turn checkpoints and the resume from one (docs/design.md, Checkpoints).

After each completed turn that called tools, `Checkpointer` uploads the transcript (the
canonical JSON of the messages the next model request holds) and, when the worktree has
changes under the allowed paths, a bundle `start_sha..wip` of a wip commit of them, then
records the checkpoint under the attempt's fence. `resume_start` turns a lease's `ResumePoint`
back into those messages and that worktree; a resume point that cannot be read or applied is
logged and the attempt starts afresh, since checkpoints are a cache and never fail a step.

Nothing of it is on the turn's path: the loop asks the model again at once, and a checkpoint
goes through two lanes beside that call, each in turn order. The stage adds the changed files
(those the tools wrote that turn; every allowed path after a command ran, after a resume and
after a failed stage) to the attempt's private index and keeps its tree; the tools of the next
turn wait for it (`staged`), so it snapshots the worktree as the turn left it. The send then
makes the wip commit and its bundle, uploads them and the transcript and records the
checkpoint, so a turn's checkpoint is accepted before the next one is sent. The step's result
or release waits for the last one (`Checkpointer.running`), and each checkpoint is finished or
given up `CHECKPOINT_TIMEOUT_S` after its turn ended, even when the step is cancelled meanwhile
(SIGTERM). A checkpoint that fails is logged and the step goes on; one refused as stale
(`LeaseLost`) stops the step at once.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from tether.runner import tracing
from tether.runner.agent.workspace import Snapshot, Workspace
from tether.runner.errors import LeaseLost, RunnerError
from tether.runner.kinds.base import StepServices
from tether.wire import canonical_json
from tether.wire.payloads import ToolCall
from tether.wire.records import Checkpoint, ResumePoint

log = structlog.get_logger(__name__)

# A checkpoint is finished even when the step is cancelled meanwhile (SIGTERM, a lost lease,
# a spent budget), but not later than this after its turn ended; the previous one then
# stands. The checkpoints still on their way when the step stops all ended their turns before
# it, so on SIGTERM an agent step stops at once, then this (20 s at most) plus the shutdown
# release (runner.step.SHUTDOWN_RELEASE_S, 5 s) is 25 s, inside the unit's TimeoutStopSec=30
# (systemd/tether-runner.service) with 5 s left for the exit.
CHECKPOINT_TIMEOUT_S = 20.0

# The paths written since the last call, None when unknown (a command ran): `ToolBox.take_written`.
Written = Callable[[], Collection[str] | None]


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


@dataclasses.dataclass(kw_only=True)
class _Turn:
    """A completed turn's checkpoint on its way through the lanes."""

    turn: int
    messages: list[dict[str, Any]]
    usage: dict[str, int]
    written: Collection[str] | None  # the paths the tools wrote; None: any (a command ran)
    deadline: float  # anyio.current_time() by which it is recorded or given up
    staged: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    tree: str | None = None  # the private index's tree once staged; None: no repository


class Checkpointer:
    """Checkpoints one attempt's completed turns (see the module docstring): call it after
    each turn, inside `running()`, and make each tool call wait for `staged()`."""

    def __init__(
        self,
        *,
        services: StepServices,
        fence: int,
        step_id: str,
        workspace: Workspace | Scratch,
        paths: Sequence[str] | None,
        start: Start,
        written: Written | None = None,
    ) -> None:
        self._services = services
        self._fence = fence
        self._step_id = step_id
        self._workspace = workspace
        self._paths = paths  # None: no repository, or nothing may be written
        self._written = written  # None: every turn adds all of `paths`
        self._before = start.usage
        self._wip = start.wip  # as last recorded, in the sender
        self._tree: str | None = None  # the private index's tree as last staged
        # The next stage adds all of `paths`: the private index does not hold the resumed
        # changes yet, or a failed stage left out some of a turn's.
        self._everything = start.wip is not None
        self._queue: MemoryObjectSendStream[_Turn] | None = None
        self._last: _Turn | None = None  # the last turn queued
        self._body: anyio.CancelScope | None = None
        self._fatal: Exception | None = None  # ends the step: a refusal as stale, a bug
        self._in_flight = 0
        self._settled = anyio.Event()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Checkpointer]:
        """Stage and send the checkpoints of the turns the block completes; on the way out
        (whatever ends the block) wait for those still on their way. A checkpoint refused as
        stale cancels the block and raises its `LeaseLost` here."""
        to_stage, staging = anyio.create_memory_object_stream[_Turn](math.inf)
        to_send, sending = anyio.create_memory_object_stream[_Turn](math.inf)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._stager, staging, to_send)
            tg.start_soon(self._sender, sending)
            self._queue = to_stage
            try:
                with anyio.CancelScope() as self._body:
                    try:
                        yield self
                    except Exception as exc:  # raised below: a task group would wrap it
                        failure = exc
            finally:
                self._queue = None
                to_stage.close()  # the lanes end after the checkpoints already queued
        if self._fatal is not None:
            raise self._fatal
        if failure is not None:
            raise failure

    async def __call__(
        self, turn: int, messages: list[dict[str, Any]], usage: dict[str, int]
    ) -> None:
        """Queue the checkpoint of `turn` (`usage`: this attempt's running total) with the
        paths its tools wrote. `LeaseLost` when an earlier one was refused as stale."""
        if self._fatal is not None:
            raise self._fatal
        if self._queue is None:
            raise RuntimeError("a checkpoint outside Checkpointer.running()")
        item = _Turn(
            turn=turn,
            messages=list(messages),
            usage=dict(usage),
            written=None if self._written is None else self._written(),
            deadline=anyio.current_time() + CHECKPOINT_TIMEOUT_S,
        )
        self._in_flight += 1
        if self._settled.is_set():
            self._settled = anyio.Event()
        self._last = item
        self._queue.send_nowait(item)  # not awaited: nothing can cancel it half done

    async def staged(self) -> None:
        """Wait until the last queued turn's changes are staged (given up, or failed): the
        worktree may change again."""
        if self._last is not None:
            await self._last.staged.wait()

    async def settled(self) -> None:
        """Wait until every checkpoint queued so far was recorded or given up."""
        if self._in_flight:
            await self._settled.wait()

    async def _stager(
        self, receive: MemoryObjectReceiveStream[_Turn], send: MemoryObjectSendStream[_Turn]
    ) -> None:
        """Stage the queued turns in order and pass them on to the sender; shielded, each
        bounded by its deadline, so a cancelled step still checkpoints its turns."""
        with anyio.CancelScope(shield=True):
            async with receive, send:
                async for item in receive:
                    staged = False
                    try:
                        if self._fatal is None:
                            staged = await self._stage_turn(item)
                    finally:
                        item.staged.set()
                        if staged:
                            send.send_nowait(item)
                        else:
                            self._sent_one()

    async def _stage_turn(self, item: _Turn) -> bool:
        """Stage `item`'s changes; False when that failed or timed out (logged)."""
        with anyio.move_on_at(item.deadline) as scope:
            try:
                item.tree = await self._stage(item.written)
            except (RunnerError, OSError) as exc:
                log.warning("checkpoint failed", turn=item.turn, error=str(exc))
            except Exception as exc:  # a bug: the step fails, as it would on its path
                self._stop(exc)
            else:
                return True
        if scope.cancelled_caught:
            log.warning("checkpoint timed out", turn=item.turn, timeout_s=CHECKPOINT_TIMEOUT_S)
        self._everything = True
        return False

    async def _stage(self, written: Collection[str] | None) -> str | None:
        """The private index's tree with a turn's changes (see the module docstring)."""
        space = self._workspace
        if self._paths is None or not isinstance(space, Workspace):
            return None
        if written is None or self._everything:
            self._everything = True  # until this stage is done
            self._tree = await space.stage(self._paths)
            self._everything = False
        elif written:
            self._tree = await space.stage(sorted(written))
        return self._tree  # None: nothing was ever written, the start point's tree

    async def _sender(self, receive: MemoryObjectReceiveStream[_Turn]) -> None:
        """Send the staged checkpoints in order until the stager is done; shielded, each
        bounded by its deadline."""
        with anyio.CancelScope(shield=True):
            async with receive:
                async for item in receive:
                    try:
                        if self._fatal is None:
                            await self._send(item)
                    finally:
                        self._sent_one()

    def _sent_one(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._settled.set()

    async def _send(self, item: _Turn) -> None:
        with tracing.span("tether.checkpoint", turn=item.turn, fence=self._fence) as span:
            with anyio.move_on_at(item.deadline) as scope:
                try:
                    await self._save(item)
                    span.set(outcome="saved")
                except (RunnerError, OSError) as exc:
                    if isinstance(exc, LeaseLost):
                        self._stop(exc)
                        span.set(outcome="lost")
                        return
                    log.warning("checkpoint failed", turn=item.turn, error=str(exc))
                    span.set(outcome="failed", error=type(exc).__name__)
                except Exception as exc:  # a bug: the step fails, as it would on its path
                    self._stop(exc)
                    span.set(outcome="failed", error=type(exc).__name__)
            if scope.cancelled_caught:
                log.warning("checkpoint timed out", turn=item.turn, timeout_s=CHECKPOINT_TIMEOUT_S)
                span.set(outcome="timed_out")

    def _stop(self, exc: Exception) -> None:
        """End the step with `exc`: no later checkpoint is sent, the block is cancelled."""
        self._fatal = exc
        if self._body is not None:
            self._body.cancel()

    async def _save(self, item: _Turn) -> None:
        transcript = await self._services.upload(canonical_json(item.messages))
        wip = await self._store_wip(item)
        usage = item.usage
        step_usage = {k: self._before.get(k, 0) + usage.get(k, 0) for k in {*self._before, *usage}}
        await self._services.checkpoint(
            Checkpoint(
                fence=self._fence,
                turn=item.turn,
                transcript=transcript,
                bundle=None if wip is None else wip.bundle,
                sha=None if wip is None else wip.snapshot.sha,
                usage=dict(usage),
                step_usage=step_usage,
            )
        )
        log.info("checkpoint", turn=item.turn, transcript=transcript, wip=wip and wip.snapshot.sha)

    async def _store_wip(self, item: _Turn) -> Wip | None:
        space = self._workspace
        if item.tree is None or not isinstance(space, Workspace):
            return None
        previous = None if self._wip is None else self._wip.snapshot
        snap = await space.commit_tree(
            item.tree,
            step_id=self._step_id,
            message=f"tether wip {self._step_id}",
            previous=previous,
        )
        if snap is None:
            return None
        if self._wip is not None and snap is previous:
            return self._wip  # nothing changed since the last checkpoint: its bundle stands
        path = space.io / f"wip-{item.turn}.bundle"
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
        if isinstance(workspace, Workspace):
            await workspace.ready()  # a failed checkout fails the step, as without a resume
        why = str(exc) or type(exc).__name__
        log.warning("resume point not used", turn=resume.turn, from_fence=resume.fence, why=why)
        if isinstance(workspace, Workspace):
            await workspace.clean_checkout(workspace.start_sha)
        return Start(messages=list(fresh), turn=resume.turn, usage=dict(resume.usage), skipped=why)
    log.info("resuming", turn=resume.turn, from_fence=resume.fence, wip=resume.sha)
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
    unanswered_calls(messages)  # a turn checkpointed mid-way: its calls left must be readable
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


def unanswered_calls(messages: Sequence[dict[str, Any]]) -> list[ToolCall]:
    """The tool calls of the last `assistant` message that no `tool` message after it
    answers, when only `tool` messages follow it: what a turn checkpointed mid-way has left
    to run. `ValueError` when such a call is not a tool call."""
    last = len(messages) - 1
    while last >= 0 and messages[last].get("role") == "tool":
        last -= 1
    if last < 0 or messages[last].get("role") != "assistant":
        return []
    answered = {m.get("tool_call_id") for m in messages[last + 1 :]}
    try:
        made = msgspec.convert(messages[last].get("tool_calls") or [], list[ToolCall])
    except msgspec.ValidationError as exc:
        raise ValueError(f"the last assistant message's tool calls: {exc}") from None
    return [call for call in made if call.id not in answered]
