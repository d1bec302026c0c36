"""GenAI spans (issue 27): with tracing on, an agent step's model calls are `chat <model>`
CLIENT spans and its tool calls `execute_tool <name>` spans carrying OpenTelemetry's GenAI
attributes, under every model API, and no attribute holds the prompt, the answer or a tool's
text, unless the runner's `trace_content` setting asks for them (shown, so the check can
fail)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_services import FakeServices
from tests.runner.test_model_apis import bound, client, context, standin
from tether import tracing
from tether.runner import tracing as runner_tracing
from tether.runner.agent import AgentKind, NoSandbox

sdk_export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
trace_api = pytest.importorskip("opentelemetry.trace")

PROMPT = "the launch code is 7H1S-1S-PR0MPT"
FILE_TEXT = "7H1S-1S-F1LE-C0NTENT"
ANSWER = "done; 7H1S-1S-ANSW3R"
SECRETS = (PROMPT, "7H1S", FILE_TEXT, ANSWER)
CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}
PROVIDERS = {"chat": "openai", "responses": "openai", "anthropic": "anthropic"}

SCENARIO = {
    "turns": [
        {
            "name": "write",
            "assistant_turns": 0,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "a.txt", "content": FILE_TEXT}},
                {"name": "made_up", "arguments": {"x": PROMPT}},
            ],
        },
        {
            "name": "read",
            "assistant_turns": 1,
            "tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}],
        },
        {"name": "answer", "assistant_turns": 2, "text": ANSWER},
    ]
}


@pytest.fixture
def exported() -> Iterator[Any]:
    exporter = in_memory.InMemorySpanExporter()
    tracing.install(sdk_export.SimpleSpanProcessor(exporter))
    yield exporter
    tracing.uninstall()
    runner_tracing.record_content(False)


async def run_agent(tmp_path: Path, api: str) -> None:
    kind = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox(why="no commands"))
    payload = {
        "messages": [{"role": "user", "content": PROMPT}],
        "allowed_commands": [],
        "max_turns": 5,
    }
    with tracing.get("test").span("tether.step", task_id="t1"):
        done = await kind(
            context(bound(client(standin(SCENARIO), api)), payload, services=FakeServices())
        )
    assert done.output["text"] == ANSWER


def named(exported: Any) -> dict[str, list[Any]]:
    spans: dict[str, list[Any]] = {}
    for span in exported.get_finished_spans():
        spans.setdefault(span.name, []).append(span)
    return spans


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
async def test_model_and_tool_calls_are_genai_spans_without_the_conversations_text(
    api: str, tmp_path: Path, exported: Any
) -> None:
    await run_agent(tmp_path, api)
    spans = named(exported)
    models = spans["chat m"]
    assert len(models) == 3
    for span in models:
        attributes = span.attributes
        assert span.kind == trace_api.SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == PROVIDERS[api]
        assert attributes["gen_ai.request.model"] == "m"
        assert attributes["gen_ai.response.model"] == "m"
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert (attributes["server.address"], attributes["server.port"]) == ("standin", 80)
        assert attributes["tether.status_code"] == 200
    assert [s.attributes["gen_ai.response.finish_reasons"] for s in models] == [
        ("tool_calls",),
        ("tool_calls",),
        ("stop",),
    ]
    if api == "anthropic":  # the request's max_tokens, the runner's default here
        assert models[0].attributes["gen_ai.request.max_tokens"] == 8192
    tools = [
        *spans["execute_tool write_file"],
        *spans["execute_tool read_file"],
        *spans["execute_tool unknown"],
    ]
    assert len(tools) == 3
    for span in tools:
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.type"] == "function"
        assert span.attributes["gen_ai.tool.call.id"]
        assert span.name == f"execute_tool {span.attributes['gen_ai.tool.name']}"
    (unknown,) = spans["execute_tool unknown"]
    assert unknown.attributes["error.type"] == "unknown_tool"
    for spans_of_name in spans.values():
        for span in spans_of_name:
            for key, value in span.attributes.items():
                for secret in (*SECRETS, "made_up"):
                    assert secret not in str(value), (span.name, key)
            assert not set(span.attributes) & CONTENT_KEYS, span.name


async def test_trace_content_puts_the_conversation_into_the_spans(
    tmp_path: Path, exported: Any
) -> None:
    """The counterpart that shows the check above can fail: with `trace_content` the same run
    records the prompt, the answer and the tools' arguments and results."""
    runner_tracing.record_content(True)
    await run_agent(tmp_path, "anthropic")
    spans = named(exported)
    first, *_, last = spans["chat m"]
    assert PROMPT in first.attributes["gen_ai.input.messages"]
    assert ANSWER in last.attributes["gen_ai.output.messages"]
    (write,) = spans["execute_tool write_file"]
    assert FILE_TEXT in write.attributes["gen_ai.tool.call.arguments"]
    (read,) = spans["execute_tool read_file"]
    assert FILE_TEXT in read.attributes["gen_ai.tool.call.result"]
