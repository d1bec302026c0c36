"""An agent step told to wind down by a preemption notice (issue 27): it stops at its next save
point, the turn it is in checkpointed as it stands (a model answer that arrives after the
notice is kept, with the results of the tool calls that ran), and the attempt that resumes
runs the calls left before it asks the model again, so no turn is asked for twice."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.agent_services import USAGE, FakeServices, ScriptedChat, call
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.agent.checkpoints import unanswered_calls
from tether.runner.errors import Preempted
from tether.runner.kinds.base import StepContext, WindDown
from tether.runner.model_client import Completion
from tether.wire.records import ResumePoint

ASK = [{"role": "user", "content": "Write two notes."}]


def py(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


def context(
    chat: Any,
    services: FakeServices,
    *,
    fence: int,
    wind_down: WindDown,
    resume: ResumePoint | None = None,
    payload: dict[str, Any] | None = None,
) -> StepContext:
    return StepContext(
        step_id="step-1",
        task_id="task-1",
        name="notes",
        attempt=fence,
        fence=fence,
        payload=payload or {"messages": ASK, "allowed_commands": []},
        outputs=(),
        default_model="m",
        chat=chat,
        resume=resume,
        services=services,
        wind_down=wind_down,
    )


class HeldChat(ScriptedChat):
    """A `ScriptedChat` whose request number `held` (0-based) is answered only once `release`
    is set; `asked` is set when that request arrives."""

    def __init__(self, *turns: Any, held: int) -> None:
        super().__init__(*turns)
        self.held = held
        self.asked = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, body: dict[str, Any]) -> Completion:
        if len(self.requests) == self.held:
            self.asked.set()
            await self.release.wait()
        return await super().__call__(body)


def agent(tmp_path: Path) -> AgentKind:
    return AgentKind(
        cache_dir=tmp_path / "cache", sandbox=NoSandbox(), commands_without_sandbox=True
    )


async def test_an_answer_that_arrives_after_the_notice_is_checkpointed_and_not_asked_again(
    tmp_path: Path,
) -> None:
    services = FakeServices()
    wind_down = WindDown()
    first = HeldChat(
        [call("write_file", path="a.txt", content="A\n")],
        [call("write_file", path="b.txt", content="B\n"), call("list_files", path=".")],
        held=1,
    )
    kind = agent(tmp_path)
    stopped: list[BaseException] = []

    async def attempt() -> None:
        with pytest.raises(Preempted) as raised:
            await kind(context(first, services, fence=1, wind_down=wind_down))
        stopped.append(raised.value)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt)
            await first.asked.wait()  # turn 2's model call is in flight
            wind_down.request(Preempted("aws reclaims the server (terminate)"))
            first.release.set()  # its answer arrives inside the notice's window
    assert len(stopped) == 1

    # Turn 1 was checkpointed whole; turn 2 as it stood: the answer, none of its calls run.
    assert [(c.fence, c.turn) for c in services.checkpoints] == [(1, 1), (1, 2)]
    last = services.checkpoints[-1]
    assert last.step_usage["total_tokens"] == 2 * USAGE["total_tokens"]
    transcript = json.loads(services.store[last.transcript])
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert [c.function.name for c in unanswered_calls(transcript)] == ["write_file", "list_files"]

    second = ScriptedChat("done")
    resume = services.resume_point()
    done = await kind(context(second, services, fence=2, wind_down=WindDown(), resume=resume))
    # The resumed attempt ran turn 2's calls, then asked for turn 3 only: nothing asked twice.
    assert len(second.requests) == 1
    asked = second.requests[0]["messages"]
    assert [m["role"] for m in asked] == ["user", "assistant", "tool", "assistant", "tool", "tool"]
    listed = json.loads(asked[-1]["content"])
    assert sorted(listed["entries"]) == ["b.txt"]  # a scratch step: its tree starts empty
    assert (done.output["turns"], done.output["finish"]) == (3, "answered")
    assert done.output["resumed_from"] == {"turn": 2, "fence": 1}
    assert done.output["tool_calls"] == 2  # this attempt's: turn 2's two calls
    # Turn 2, now whole, was checkpointed again under the new fence.
    assert [(c.fence, c.turn) for c in services.checkpoints[2:]] == [(2, 2)]


async def test_a_notice_during_a_tool_call_checkpoints_the_calls_that_ran(tmp_path: Path) -> None:
    services = FakeServices()
    wind_down = WindDown()
    running, go = tmp_path / "running", tmp_path / "go"
    waiter = py(
        f"import os, time; open({str(running)!r}, 'w').close()\n"
        f"for _ in range(600):\n    if os.path.exists({str(go)!r}): break\n    time.sleep(0.05)"
    )
    payload = {"messages": ASK, "allowed_commands": [waiter]}
    first = ScriptedChat(
        [
            call("write_file", path="a.txt", content="A\n"),
            call("run", command=waiter),
            call("write_file", path="b.txt", content="B\n"),
        ],
    )
    kind = agent(tmp_path)

    async def attempt() -> None:
        with pytest.raises(Preempted):
            await kind(context(first, services, fence=1, wind_down=wind_down, payload=payload))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt)
            while not await anyio.Path(running).exists():  # noqa: ASYNC110 (another process)
                await anyio.sleep(0.02)
            wind_down.request(Preempted("gcp reclaims the server (preempt)"))
            await anyio.Path(go).touch()  # the command in flight returns
    [checkpoint] = services.checkpoints
    assert (checkpoint.fence, checkpoint.turn) == (1, 1)
    transcript = json.loads(services.store[checkpoint.transcript])
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "tool"]
    assert [c.function.name for c in unanswered_calls(transcript)] == ["write_file"]

    second = ScriptedChat([call("list_files", path=".")], "done")
    resume = services.resume_point()
    resumed = context(
        second, services, fence=2, wind_down=WindDown(), resume=resume, payload=payload
    )
    await kind(resumed)
    assert len(second.requests) == 2  # turns 2 and 3; turn 1 was never asked for again
    assert second.requests[0]["messages"][-1]["tool_call_id"] == "call-1-2"  # b.txt, written


async def test_a_notice_between_turns_asks_the_model_nothing_more(tmp_path: Path) -> None:
    services = FakeServices()
    wind_down = WindDown()
    wind_down.request(Preempted("file notice"))
    chat = ScriptedChat("never asked")
    with pytest.raises(Preempted):
        await agent(tmp_path)(context(chat, services, fence=1, wind_down=wind_down))
    assert chat.requests == []
    assert services.checkpoints == []


def test_only_the_calls_no_tool_message_answers_are_left() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}
        for i in range(3)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    assert [c.id for c in unanswered_calls(messages)] == ["c0", "c2"]
    answers = [{"role": "tool", "tool_call_id": f"c{i}", "content": "{}"} for i in range(3)]
    assert unanswered_calls([*messages[:2], *answers]) == []
    assert unanswered_calls([{"role": "user", "content": "go"}]) == []
    broken = [{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}]
    with pytest.raises(ValueError, match="tool calls"):
        unanswered_calls(broken)
