"""What a step kind is: an async function `(StepContext) -> StepOutput`, the context it is
given (its lease's fields, the model, the supervisor's services, a wind-down request) and the
output it returns. The kinds themselves (`chat`, the agent's) and the registry that holds them
build on this module; it imports none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from tether.runner.errors import StepFailure
from tether.runner.lease import EarlierOutput
from tether.runner.model_client import Completion
from tether.wire.records import Checkpoint, CheckRun, LeaseRepository, ResumePoint


class ChatModel(Protocol):
    """The model, as one step sees it: key and deadline already bound."""

    async def __call__(self, body: dict[str, Any]) -> Completion: ...


class StepServices(Protocol):
    """What the supervisor does for a step beyond its lease: the artifact store (the runner's
    pool may read what its runners uploaded) and the step's checkpoints, under its fence."""

    async def upload(self, data: bytes | Path) -> str:
        """Store `data` (bytes, or a file's contents) in the artifact store; its sha256."""
        ...

    async def download(self, digest: str, into: Path) -> None:
        """Write the artifact `digest` to the file `into`, its sha256 checked."""
        ...

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Record a checkpoint of this attempt; `LeaseLost` when its fence is not current."""
        ...


class WindDown:
    """A request that the step stop at its next save point, where the work done so far is
    recorded (for the agent kind: as soon as its model call or tool call in flight returns,
    with that turn checkpointed), and end with the failure that asked (`Preempted`). A kind
    without save points ignores it; the runner then stops it at its own deadline."""

    def __init__(self) -> None:
        self._failure: StepFailure | None = None

    def request(self, failure: StepFailure) -> None:
        if self._failure is None:
            self._failure = failure

    @property
    def requested(self) -> bool:
        return self._failure is not None

    def check(self) -> None:
        """Raise the requested failure, if any: call it at a save point."""
        if self._failure is not None:
            raise self._failure


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepContext:
    step_id: str
    task_id: str
    name: str
    attempt: int
    payload: Any
    outputs: tuple[EarlierOutput, ...]
    default_model: str
    chat: ChatModel
    fence: int = 0
    repository: LeaseRepository | None = None  # what the approval bound (a repository task)
    resume: ResumePoint | None = None  # the step's last accepted checkpoint, to go on from
    services: StepServices | None = None  # None where no supervisor is behind the step (tests)
    wind_down: WindDown = dataclasses.field(default_factory=WindDown)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepOutput:
    output: Any
    usage: dict[str, int] = dataclasses.field(default_factory=dict)
    candidate_sha: str | None = None
    artifacts: dict[str, str] = dataclasses.field(default_factory=dict)
    bundle: str | None = None  # digest of the candidate's bundle, uploaded
    checks: dict[str, CheckRun] = dataclasses.field(default_factory=dict)


StepKind = Callable[[StepContext], Awaitable[StepOutput]]
