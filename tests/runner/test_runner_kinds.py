"""Step kinds: the `chat` payload contract (tools included), earlier outputs, and the extendable
registry."""

from __future__ import annotations

from typing import Any

import pytest

from tether.runner.errors import StepRejected, StepUnsupported
from tether.runner.kinds.base import StepContext, StepKind, StepOutput, WindDown
from tether.runner.kinds.chat import chat_request, run_chat
from tether.runner.kinds.registry import ENTRY_POINT_GROUP, KindRegistry
from tether.runner.lease import EarlierOutput
from tether.runner.model_client import Completion
from tether.wire.payloads import CalledFunction, ToolCall

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "sum it up"}]


def test_chat_request_passes_parameters_and_defaults_the_model() -> None:
    body = chat_request({"messages": MSGS, "temperature": 0.2, "max_tokens": 50}, (), "default-m")
    assert body == {"model": "default-m", "messages": MSGS, "temperature": 0.2, "max_tokens": 50}
    assert chat_request({"messages": MSGS, "model": "other"}, (), "default-m")["model"] == "other"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ("not an object", "expected `object`"),
        ({"messages": []}, "length >= 1"),
        ({"messages": MSGS, "temprature": 1}, "temprature"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0]"),
        ({"messages": MSGS, "max_tokens": "many"}, "max_tokens"),
        ({"messages": MSGS, "max_tokens": True}, "max_tokens"),
        ({"messages": MSGS, "stop": ["a", 1]}, "stop"),
        ({"messages": MSGS, "model": ""}, "model"),
        ({"messages": MSGS, "use_outputs": "yes"}, "use_outputs"),
    ],
)
def test_a_bad_chat_payload_is_rejected_with_its_fault_named(payload: Any, words: str) -> None:
    with pytest.raises(StepRejected) as caught:
        chat_request(payload, (), "m")
    assert words in str(caught.value)


def test_earlier_outputs_go_after_the_system_messages_when_asked() -> None:
    outputs = (
        EarlierOutput(step_id="a", name="draft", output={"text": "first draft"}),
        EarlierOutput(step_id="b", name="facts", output={"n": 2}),
    )
    body = chat_request({"messages": MSGS, "use_outputs": True}, outputs, "m")
    assert [m["role"] for m in body["messages"]] == ["system", "user", "user"]
    context = body["messages"][1]["content"]
    assert "## draft\nfirst draft" in context
    assert '## facts\n{"n":2}' in context
    assert body["messages"][2] == MSGS[1]
    # Without use_outputs, earlier outputs stay out of the request.
    assert chat_request({"messages": MSGS}, outputs, "m")["messages"] == MSGS


async def test_run_chat_answers_text_finish_reason_model_and_usage() -> None:
    seen: list[dict[str, Any]] = []

    async def chat(body: dict[str, Any]) -> Completion:
        seen.append(body)
        return Completion(text="t", finish_reason="stop", model="m-1", usage={"total_tokens": 9})

    ctx = StepContext(
        step_id="s",
        task_id="t",
        name="n",
        attempt=1,
        payload={"messages": MSGS},
        outputs=(),
        default_model="m",
        chat=chat,
    )
    out = await run_chat(ctx)
    assert out.output == {
        "text": "t",
        "finish_reason": "stop",
        "model": "m-1",
        "usage": {"total_tokens": 9},
    }
    assert out.usage == {"total_tokens": 9}
    assert seen[0]["model"] == "m"


def test_an_unknown_kind_is_unsupported_here_and_names_the_known_ones() -> None:
    registry = KindRegistry.default(entry_points=False)
    with pytest.raises(StepUnsupported) as caught:
        registry.get("shell")
    assert caught.value.retryable
    assert "chat" in str(caught.value)


async def _echo(ctx: StepContext) -> StepOutput:
    return StepOutput(output={"echo": ctx.payload})


def test_a_deployment_adds_kinds_in_code_or_by_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = KindRegistry.default(entry_points=False)
    registry.register("echo", _echo)
    assert registry.get("echo") is _echo
    with pytest.raises(ValueError):
        registry.register("", _echo)

    class EntryPoint:
        name = "echo-ep"

        def load(self) -> Any:
            return _echo

    def entry_points(group: str) -> list[EntryPoint]:
        return [EntryPoint()] if group == ENTRY_POINT_GROUP else []

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    assert KindRegistry.default().names() == ["agent", "chat", "echo-ep", "verify"]


def test_a_kind_written_against_the_package_names_is_served() -> None:
    """A kind's author imports the interface from `tether.runner.kinds` (the names docs/ give);
    they are `base`'s own, so such a kind is one the registry serves."""
    from tether.runner import kinds

    assert kinds.StepContext is StepContext
    assert kinds.StepKind is StepKind
    assert kinds.StepOutput is StepOutput
    assert kinds.WindDown is WindDown
    assert KindRegistry([("echo", _echo)]).get("echo") is _echo


# -- tool calls (issue 12, item 1) ---------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read one file.",
            "strict": True,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "list_files"}},
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
}
TOOL_TURNS = [
    {"role": "user", "content": "read a.py"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
]


def test_tools_choice_and_tool_turns_go_to_the_model_as_they_were_written() -> None:
    payload = {"messages": TOOL_TURNS, "tools": TOOLS, "tool_choice": "required"}
    body = chat_request(payload, (), "m")
    assert body == {"model": "m", "messages": TOOL_TURNS, "tools": TOOLS, "tool_choice": "required"}
    named = {"type": "function", "function": {"name": "list_files"}}
    body = chat_request({"messages": MSGS, "tools": TOOLS, "tool_choice": named}, (), "m")
    assert body["tool_choice"] == named
    # An assistant message may carry text beside its calls, or leave `content` out.
    without = [TOOL_TURNS[0], {"role": "assistant", "tool_calls": [CALL]}, TOOL_TURNS[2]]
    assert chat_request({"messages": without}, (), "m")["messages"][1] == without[1]


def _with(index: int, **changes: Any) -> list[dict[str, Any]]:
    messages = [dict(m) for m in TOOL_TURNS]
    messages[index].update(changes)
    return messages


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"messages": MSGS, "tools": []}, "`payload.tools`"),
        (
            {"messages": MSGS, "tools": [{"type": "fn", "function": {"name": "x"}}]},
            "`payload.tools[0].type`",
        ),
        (
            {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "read file"}}]},
            "`payload.tools[0].function.name`",
        ),
        (
            {"messages": MSGS, "tools": [{"type": "function", "function": {"nam": "x"}}]},
            "did you mean `name`",
        ),
        (
            {
                "messages": MSGS,
                "tools": [
                    {"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}}
                ],
            },
            "JSON Schema of type `object`",
        ),
        (
            {
                "messages": MSGS,
                "tools": [{"type": "function", "function": {"name": "x", "parameters": "{}"}}],
            },
            "`payload.tools[0].function.parameters`",
        ),
        ({"messages": MSGS, "tools": [TOOLS[0], TOOLS[0]]}, "declared twice"),
        ({"messages": MSGS, "tool_choice": "auto"}, "`payload.tool_choice`: needs `tools`"),
        (
            {"messages": MSGS, "tools": TOOLS, "tool_choice": "always"},
            "`payload.tool_choice`: invalid enum value 'always'",
        ),
        (
            {
                "messages": MSGS,
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "write_file"}},
            },
            "`payload.tool_choice.function.name`: 'write_file' is not a declared tool",
        ),
        ({"messages": _with(1, tool_calls=[])}, "`payload.messages[1].tool_calls`"),
        (
            {"messages": _with(1, tool_calls=[{**CALL, "function": {"name": "read_file"}}])},
            "`payload.messages[1].tool_calls[0].function`",
        ),
        ({"messages": _with(1, tool_calls=[CALL, CALL])}, "ids of `tool_calls` must differ"),
        ({"messages": _with(0, tool_calls=[CALL])}, "only an `assistant` message"),
        ({"messages": _with(1, tool_calls=None)}, "`payload.messages[1].tool_calls`"),
        ({"messages": [TOOL_TURNS[0], {"role": "assistant"}]}, "`content` (a string) or"),
        (
            {"messages": _with(2, tool_call_id="call_9")},
            "`payload.messages[2].tool_call_id`: 'call_9' answers no open call",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "needs `tool_call_id`"),
        ({"messages": _with(0, tool_call_id="call_1")}, "only a `tool` message"),
        ({"messages": TOOL_TURNS[:2]}, "of the last message are not answered"),
        ({"messages": [*TOOL_TURNS[:2], MSGS[1]]}, "`payload.messages[2]`: tool calls"),
    ],
)
def test_a_bad_tool_shape_is_rejected_with_its_field_named(payload: Any, words: str) -> None:
    with pytest.raises(StepRejected) as caught:
        chat_request(payload, (), "m")
    assert words in str(caught.value)


async def test_run_chat_keeps_the_models_tool_calls_and_the_providers_other_keys() -> None:
    function = CalledFunction(name="read_file", arguments='{"path": "a.py"}')
    call = ToolCall(id="c1", type="function", function=function)

    async def chat(body: dict[str, Any]) -> Completion:
        return Completion(
            text="",
            finish_reason="tool_calls",
            model="m-1",
            usage={"total_tokens": 9},
            tool_calls=(call,),
            extra={"reasoning_content": "look first"},
        )

    ctx = StepContext(
        step_id="s",
        task_id="t",
        name="n",
        attempt=1,
        payload={"messages": MSGS, "tools": TOOLS},
        outputs=(),
        default_model="m",
        chat=chat,
    )
    out = await run_chat(ctx)
    assert out.output == {
        "text": "",
        "finish_reason": "tool_calls",
        "model": "m-1",
        "usage": {"total_tokens": 9},
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
            }
        ],
        "extra": {"reasoning_content": "look first"},
    }
