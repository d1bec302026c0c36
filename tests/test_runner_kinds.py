"""Step kinds: the `chat` payload contract, earlier outputs, and the extendable registry."""

from __future__ import annotations

from typing import Any

import pytest

from runner.errors import StepRejected, StepUnsupported
from runner.kinds import (
    ENTRY_POINT_GROUP,
    KindRegistry,
    StepContext,
    StepOutput,
    chat_request,
    run_chat,
)
from runner.lease import EarlierOutput
from runner.model_client import Completion

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
        step_id="s", task_id="t", name="n", attempt=1, payload={"messages": MSGS},
        outputs=(), default_model="m", chat=chat,
    )  # fmt: skip
    out = await run_chat(ctx)
    assert out.output == {
        "text": "t", "finish_reason": "stop", "model": "m-1", "usage": {"total_tokens": 9},
    }  # fmt: skip
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
    assert KindRegistry.default().names() == ["chat", "echo-ep"]
