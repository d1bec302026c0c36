"""Step kinds: what a step of a given `kind` does with its payload. `chat`, `agent` (a tool
loop in a workspace: runner/agent/loop.py) and `verify` (a task's checks re-run at another
runner's candidate: runner/agent/verify.py) are built in.

A kind is an async function `(StepContext) -> StepOutput`. A deployment adds its own with
`KindRegistry.register`, or, without touching the runner's code, through the entry-point
group `tether.runner.kinds` (`name = "package.module:function"`), loaded at start.

The `chat` payload is `tether.wire.payloads.ChatPayload`, the record the supervisor also checks
plans with at submit; a payload that is not one (a typo in a key, a bad role, a wrong type) is
refused here too, before any model call. Besides `messages`, `model`, `temperature`, `top_p`,
`max_tokens`, `seed`, `stop` and `use_outputs` it takes OpenAI's function calling:

- `tools`: `[{"type": "function", "function": {"name", "description"?, "parameters"?,
  "strict"?}}]`, names unique and of `[A-Za-z0-9_-]{1,64}`, `parameters` a JSON Schema object;
- `tool_choice`: "none", "auto", "required" or `{"type": "function", "function": {"name"}}`
  naming a declared tool (and only with `tools`);
- `assistant` messages with `tool_calls` (`[{"id", "type": "function", "function": {"name",
  "arguments"}}]`, `content` then optional) and `tool` messages (`tool_call_id`, `content`)
  answering each of those calls before the next other message.

With `use_outputs: true` the outputs of the task's earlier steps go to the model as one
`user` message placed after the payload's leading `system` messages: one section per step,
`## <step name>` followed by its `text` (a chat output) or its canonical JSON.

The `chat` output: `{"text", "finish_reason", "model", "usage"}`, plus `tool_calls` (as in
an `assistant` message, `arguments` the model's JSON text unparsed) when the model called
tools, `text` then often "", and `extra` when the provider's message held other keys (a
`refusal`, `reasoning_content`, a tool call's other keys), kept as sent, so nothing it sent is
lost; null or empty ones are left out. Outside the message only the first choice's
`finish_reason`, `model` and `usage` are read; the answer's `id`, `created`,
`system_fingerprint`, `logprobs` and further choices are dropped: tether asks for one choice
and they say nothing about its content. `usage` (the provider's token counts) also goes with
the result, for the tenant's budget.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from tether.runner.errors import StepFailure, StepRejected, StepUnsupported
from tether.runner.lease import EarlierOutput
from tether.runner.model_client import Completion
from tether.wire import canonical_json
from tether.wire.payloads import ChatPayload, plain, read_payload
from tether.wire.records import Checkpoint, CheckRun, LeaseRepository, ResumePoint

if TYPE_CHECKING:
    from tether.runner.agent.confine import CommandLimits

ENTRY_POINT_GROUP = "tether.runner.kinds"


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


class KindRegistry:
    """Kinds by name. `default()` holds `chat`, `agent`, `verify` and whatever entry points
    add."""

    def __init__(self, kinds: Iterable[tuple[str, StepKind]] = ()) -> None:
        self._kinds: dict[str, StepKind] = {}
        for name, kind in kinds:
            self.register(name, kind)

    def register(self, name: str, kind: StepKind) -> None:
        if not name or not name.isprintable():
            raise ValueError(f"step kind name {name!r} is not usable")
        self._kinds[name] = kind

    def get(self, name: str) -> StepKind:
        try:
            return self._kinds[name]
        except KeyError:
            known = ", ".join(sorted(self._kinds)) or "none"
            raise StepUnsupported(
                f"this runner has no step kind {name!r} (it knows: {known})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._kinds)

    @classmethod
    def default(
        cls,
        *,
        entry_points: bool = True,
        commands_without_sandbox: bool = False,
        command_limits: CommandLimits | None = None,
        sandbox_read_only: Iterable[Path] = (),
    ) -> KindRegistry:
        """`commands_without_sandbox`, `command_limits` and `sandbox_read_only` are the
        runner's settings, for the agent kind."""
        # Imported here: runner.agent.loop builds on this module's StepContext and StepOutput.
        from tether.runner.agent.loop import AgentKind
        from tether.runner.agent.verify import VerifyKind

        agent = AgentKind(
            commands_without_sandbox=commands_without_sandbox,
            command_limits=command_limits,
            sandbox_read_only=tuple(sandbox_read_only),
        )
        registry = cls([("chat", run_chat), ("agent", agent), ("verify", VerifyKind(agent))])
        if entry_points:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                registry.register(ep.name, ep.load())
        return registry


def chat_request(
    payload: Any, outputs: tuple[EarlierOutput, ...], default_model: str
) -> dict[str, Any]:
    """The provider request for a `chat` payload; `StepRejected` names what is wrong."""
    try:
        chat = read_payload(payload, ChatPayload)
    except ValueError as exc:
        raise StepRejected(f"chat payload: {exc}") from None
    model = default_model if chat.model is msgspec.UNSET else chat.model
    messages = [m.request() for m in chat.messages]
    if chat.use_outputs and outputs:
        lead = 0
        while lead < len(messages) and messages[lead]["role"] == "system":
            lead += 1
        messages.insert(lead, {"role": "user", "content": earlier_outputs_text(outputs)})
    return {"model": model, **chat.model_parameters(), "messages": messages}


def earlier_outputs_text(outputs: tuple[EarlierOutput, ...]) -> str:
    sections = ["Outputs of the earlier steps of this task:"]
    for earlier in outputs:
        out = earlier.output
        if isinstance(out, dict) and isinstance(out.get("text"), str):
            text = out["text"]
        else:
            text = canonical_json(out).decode("utf-8")
        sections.append(f"## {earlier.name}\n{text}")
    return "\n\n".join(sections)


async def run_chat(ctx: StepContext) -> StepOutput:
    """The built-in `chat` kind: one completion for the payload's messages."""
    completion = await ctx.chat(chat_request(ctx.payload, ctx.outputs, ctx.default_model))
    output: dict[str, Any] = {
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "model": completion.model,
        "usage": completion.usage,
    }
    if completion.tool_calls:
        output["tool_calls"] = plain(completion.tool_calls)
    if completion.extra:
        output["extra"] = completion.extra
    return StepOutput(output=output, usage=completion.usage)
