"""Fakes for the agent tests: an in-memory `StepServices` (an artifact store keyed by sha256,
the checkpoints recorded in order, and a switch that refuses checkpoints as a fenced-out
attempt's: `LeaseLost`, as the supervisor's stale_fence reply makes the real one raise), a
scripted model that counts its calls, and the lease's repository part."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import anyio

from tether.runner.errors import LeaseLost, LostBecause
from tether.runner.model_client import Completion
from tether.wire.payloads import CalledFunction, ToolCall
from tether.wire.records import Checkpoint, CheckSpec, LeaseRepository, ResumePoint


class FakeServices:
    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.checkpoints: list[Checkpoint] = []
        self.stale = False  # refuse every checkpoint from now on
        self.downloads: list[str] = []
        self.checkpoint_delay_s = 0.0  # how long recording a checkpoint takes
        self.checkpoint_started = anyio.Event()

    async def upload(self, data: bytes | Path) -> str:
        if isinstance(data, Path):
            data = await anyio.Path(data).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        self.store[digest] = data
        return digest

    async def download(self, digest: str, into: Path) -> None:
        self.downloads.append(digest)
        try:
            data = self.store[digest]
        except KeyError:
            raise FileNotFoundError(f"no artifact {digest}") from None
        await anyio.Path(into).write_bytes(data)

    async def checkpoint(self, checkpoint: Checkpoint) -> None:
        self.checkpoint_started.set()
        await anyio.sleep(self.checkpoint_delay_s)
        if self.stale:
            raise LeaseLost(LostBecause.STALE_FENCE)
        self.checkpoints.append(checkpoint)

    def resume_point(self) -> ResumePoint:
        """The last recorded checkpoint as the next lease would carry it."""
        cp = self.checkpoints[-1]
        return ResumePoint(
            turn=cp.turn,
            fence=cp.fence,
            transcript=cp.transcript,
            bundle=cp.bundle,
            sha=cp.sha,
            usage=cp.step_usage,
        )


def lease_repository(
    url: str,
    base: str,
    *,
    start: str | None = None,
    start_bundle: str | None = None,
    allowed_paths: tuple[str, ...] = ("src/",),
    checks: dict[str, str] | None = None,
    setup: tuple[str, ...] = (),
) -> LeaseRepository:
    return LeaseRepository(
        name="app",
        url=url,
        base_sha=base,
        start_sha=start or base,
        start_bundle=start_bundle,
        allowed_paths=allowed_paths,
        checks=tuple(CheckSpec(name=n, command=c) for n, c in (checks or {}).items()),
        setup=setup,
    )


USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def call(name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    return name, arguments


class ScriptedChat:
    """A `ChatModel` that plays `turns` in order (a list of tool calls, a final text, or an
    exception to raise, e.g. the `LeaseLost` of a lease lost during the call), each costing
    `USAGE`, and keeps every request it got."""

    def __init__(self, *turns: list[tuple[str, dict[str, Any]]] | str | BaseException) -> None:
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, body: dict[str, Any]) -> Completion:
        self.requests.append(copy.deepcopy(body))
        turn = self.turns[len(self.requests) - 1]
        if isinstance(turn, BaseException):
            raise turn
        if isinstance(turn, str):
            return Completion(text=turn, finish_reason="stop", model="scripted", usage=USAGE)
        n = len(self.requests)
        calls = tuple(
            ToolCall(
                id=f"call-{n}-{i}",
                type="function",
                function=CalledFunction(name=name, arguments=json.dumps(args)),
            )
            for i, (name, args) in enumerate(turn)
        )
        return Completion(
            text="", finish_reason="tool_calls", model="scripted", usage=USAGE, tool_calls=calls
        )

    def tool_results(self, request: int) -> list[Any]:
        """The tool results the model was given in request `request` (0-based), parsed,
        since its last own message."""
        messages = self.requests[request]["messages"]
        results: list[Any] = []
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            results.insert(0, json.loads(message["content"]))
        return results
