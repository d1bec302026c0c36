"""The model APIs people use (issue 27): Chat Completions, OpenAI Responses and Anthropic
Messages, each running a `chat` step and an agent tool loop against the stand-in's strict fake
of that API (`examples/standin_apis.py`), the same retry rules for each, an answer that is not
the API's refused by name, one neutral transcript that a checkpoint resumes under the same API,
and every API's usage counted by the tenant's budget. The fakes are shown to catch a client
that leaves the documented shape (a planted bug per rule)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from examples.standin_model import Knobs, create_app, read_scenario
from tests.agent_services import FakeServices
from tests.api_tasks import submitted
from tests.conftest import ApiHarness
from tests.runner.test_chat_tools import run_steps
from tests.runner.test_runner_fakes import (
    FakeModel,
    VirtualClock,
    json_response,
    make_lease,
    make_rig,
)
from tether.clocks import LoopClock
from tether.runner.agent import AgentKind, NoSandbox
from tether.runner.errors import (
    OperatorProblem,
    StepRejected,
    StepUnsupported,
    TransientFailure,
)
from tether.runner.kinds.base import StepContext
from tether.runner.kinds.chat import run_chat
from tether.runner.models import MODEL_APIS, Completion, ModelClient, WireApi, wire_api
from tether.runner.models.anthropic import ANTHROPIC_VERSION, AnthropicMessages
from tether.runner.models.responses import Responses
from tether.runner.settings import RunnerSettings
from tether.settings import SettingsError, load_settings

KEY = "sk-model-key-4f1c"

AGENT_SCENARIO = {
    "turns": [
        {
            "name": "look",
            "assistant_turns": 0,
            "tool_calls": [
                {"name": "list_files", "arguments": {"path": "."}},
                {"name": "write_file", "arguments": {"path": "notes.txt", "content": "hi\n"}},
            ],
        },
        {
            "name": "check",
            "assistant_turns": 1,
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
        },
        {"name": "answer", "assistant_turns": 2, "text": "notes.txt says hi"},
    ]
}


def standin(scenario: dict[str, Any] | None = None, **knobs: Any) -> Any:
    return create_app(
        Knobs(expected_key=KEY, **knobs), read_scenario(scenario) if scenario else None
    )


def client(app: Any, api: WireApi | str, clock: Any = None) -> ModelClient:
    return ModelClient(
        base_url="http://standin/v1",
        clock=clock or LoopClock(),
        transport=httpx.ASGITransport(app=app),
        api=wire_api(api) if isinstance(api, str) else api,
    )


def bound(model: ModelClient, key: str | None = KEY) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """The client as a step sees it (`StepContext.chat`): key and deadline bound."""

    async def chat(body: dict[str, Any]) -> Completion:
        return await model.chat(body, key=key, deadline=anyio.current_time() + 30)

    return chat


def context(chat: Any, payload: dict[str, Any], **extra: Any) -> StepContext:
    return StepContext(
        step_id="s1",
        task_id="t1",
        name="step",
        attempt=extra.pop("attempt", 1),
        payload=payload,
        outputs=(),
        default_model="m",
        chat=chat,
        **extra,
    )


@pytest.mark.parametrize("api", MODEL_APIS)
async def test_a_chat_step_runs_under_each_api(api: str) -> None:
    app = standin()
    payload = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello there"},
        ],
        "max_tokens": 50,
        "temperature": 0.2,
    }
    done = await run_chat(context(bound(client(app, api)), payload))
    assert done.output["text"].endswith("hello there")
    assert done.output["finish_reason"] == "stop"
    assert done.output["model"] == "m"
    usage = done.usage
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert [a["api"] for a in app.state.asked] == [api]
    assert dict(app.state.calls) == {"total": 1, "200": 1}


@pytest.mark.parametrize("api", MODEL_APIS)
async def test_an_agent_tool_loop_runs_under_each_api_with_one_neutral_transcript(
    api: str, tmp_path: Path
) -> None:
    app = standin(AGENT_SCENARIO)
    services = FakeServices()
    kind = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox(why="no commands"))
    payload = {"messages": [{"role": "user", "content": "write notes"}], "allowed_commands": []}
    done = await kind(context(bound(client(app, api)), payload, services=services))
    out = done.output
    assert (out["finish"], out["turns"], out["tool_calls"], out["tool_errors"]) == (
        "answered",
        3,
        3,
        0,
    )
    assert out["text"] == "notes.txt says hi"
    assert [a["turn_index"] for a in app.state.asked] == [0, 1, 2]
    assert {a["api"] for a in app.state.asked} == {api}
    # The transcript and the checkpoints hold the same neutral messages under every API.
    roles = [(e["role"], [c["name"] for c in e.get("tool_calls", [])]) for e in out["transcript"]]
    assert roles == [
        ("user", []),
        ("assistant", ["list_files", "write_file"]),
        ("tool", []),
        ("tool", []),
        ("assistant", ["read_file"]),
        ("tool", []),
        ("assistant", []),
    ]
    last = json.loads(services.store[services.checkpoints[-1].transcript])
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "tool", "assistant", "tool"]
    assert all(c["type"] == "function" for c in last[1]["tool_calls"])
    assert json.loads(last[-1]["content"])["content"] == "hi\n"
    assert done.usage["total_tokens"] == sum(
        e["usage"]["total_tokens"] for e in out["transcript"] if e.get("usage")
    )


class FailsAfter:
    """A bound model that answers `n` calls, then stays unavailable (a provider outage)."""

    def __init__(self, chat: Any, n: int) -> None:
        self.chat, self.left = chat, n

    async def __call__(self, body: dict[str, Any]) -> Completion:
        if self.left == 0:
            raise TransientFailure("the model stayed unavailable")
        self.left -= 1
        result: Completion = await self.chat(body)
        return result


@pytest.mark.parametrize("api", MODEL_APIS)
async def test_a_checkpointed_transcript_resumes_under_the_same_api(
    api: str, tmp_path: Path
) -> None:
    """Attempt 1 checkpoints its first turn and loses the model; attempt 2 resumes from that
    checkpoint, and the strict fake takes the resumed transcript as its API's request: no turn
    is asked again."""
    app = standin(AGENT_SCENARIO)
    services = FakeServices()
    kind = AgentKind(cache_dir=tmp_path / "cache", sandbox=NoSandbox(why="no commands"))
    payload = {"messages": [{"role": "user", "content": "write notes"}], "allowed_commands": []}
    model = client(app, api)
    with pytest.raises(TransientFailure):
        await kind(context(FailsAfter(bound(model), 1), payload, services=services))
    assert [c.turn for c in services.checkpoints] == [1]
    resumed = context(
        bound(model),
        payload,
        services=services,
        attempt=2,
        fence=2,
        resume=services.resume_point(),
    )
    done = await kind(resumed)
    assert done.output["resumed_from"] == {"turn": 1, "fence": 0}
    assert (done.output["finish"], done.output["turns"]) == ("answered", 3)
    assert [a["turn_index"] for a in app.state.asked] == [0, 1, 2]  # turn 0 asked once
    assert dict(app.state.calls) == {"total": 3, "200": 3}


# -- the fakes catch a client that leaves the documented shape --------------------------------

TOOL_ROUND = {
    "model": "m",
    "messages": [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": '{"path": "."}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "[]"},
    ],
}


def planted(base: type[WireApi], change: Callable[[dict[str, Any]], None]) -> WireApi:
    class Planted(base):  # type: ignore[misc, valid-type]
        def request(self, body: dict[str, Any]) -> dict[str, Any]:
            wire = super().request(body)
            change(wire)
            return wire

    made: WireApi = Planted()
    return made


class NoVersion(AnthropicMessages):
    def headers(self, key: str | None) -> dict[str, str]:
        return {"x-api-key": key or ""}


def _first(items: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(i for i in items if i.get("type") == kind)


def _tool_result(wire: dict[str, Any]) -> dict[str, Any]:
    return _first(wire["messages"][-1]["content"], "tool_result")


PLANTED: list[tuple[str, WireApi, str]] = [
    (
        "anthropic_without_max_tokens",
        planted(AnthropicMessages, lambda w: w.pop("max_tokens")),
        "max_tokens",
    ),
    ("anthropic_without_version", NoVersion(), "anthropic-version: header is required"),
    (
        "anthropic_tool_result_for_no_call",
        planted(AnthropicMessages, lambda w: _tool_result(w).update(tool_use_id="toolu_x")),
        "unexpected `tool_use_id`",
    ),
    (
        "anthropic_call_left_unanswered",
        planted(AnthropicMessages, lambda w: w["messages"].pop()),
        "`tool_use` ids were found without `tool_result` blocks",
    ),
    (
        "anthropic_empty_text_block",
        planted(
            AnthropicMessages,
            lambda w: w["messages"][0]["content"].append({"type": "text", "text": ""}),
        ),
        "text content blocks must be non-empty",
    ),
    (
        "anthropic_system_as_a_message",
        planted(
            AnthropicMessages, lambda w: w["messages"].insert(0, {"role": "system", "content": "x"})
        ),
        "$.messages[0].role",
    ),
    (
        "responses_with_messages",
        planted(Responses, lambda w: w.update(messages=w["input"])),
        "Unrecognized request argument supplied: messages",
    ),
    (
        "responses_output_for_no_call",
        planted(
            Responses, lambda w: _first(w["input"], "function_call_output").update(call_id="call_x")
        ),
        "No tool call found for function call output with call_id call_x",
    ),
    (
        "responses_call_left_unanswered",
        planted(Responses, lambda w: w["input"].pop()),
        "No tool output found for function call",
    ),
    (
        "responses_nested_tool",
        planted(
            Responses,
            lambda w: w.update(tools=[{"type": "function", "function": {"name": "list_files"}}]),
        ),
        "tools",
    ),
]


@pytest.mark.parametrize(("api", "said"), [c[1:] for c in PLANTED], ids=[c[0] for c in PLANTED])
async def test_the_fakes_refuse_a_request_outside_the_documented_shape(
    api: WireApi, said: str
) -> None:
    app = standin()
    body = dict(TOOL_ROUND, tools=[{"type": "function", "function": {"name": "list_files"}}])
    with pytest.raises(StepRejected) as refused:
        await bound(client(app, api))(body)
    assert said in str(refused.value)
    assert dict(app.state.calls) == {"total": 1, "400": 1}
    # The same request from the unplanted client is taken.
    honest = wire_api(api.name)
    answer = await bound(client(app, honest))(body)
    assert answer.text


# -- the same rules for every API -------------------------------------------------------------


@pytest.mark.parametrize("api", MODEL_APIS)
async def test_a_wrong_key_and_a_spent_quota_are_operator_problems_under_each_api(
    api: str,
) -> None:
    with pytest.raises(OperatorProblem) as wrong:
        await bound(client(standin(), api), key="sk-wrong")(TOOL_ROUND)
    assert wrong.value.about_key
    with pytest.raises(OperatorProblem) as spent:  # Anthropic's: a 400 saying the credit is low
        await bound(client(standin(quota_exhausted=True), api))(TOOL_ROUND)
    assert "quota exhausted" in spent.value.detail
    assert not spent.value.about_key


@pytest.mark.parametrize("api", MODEL_APIS)
async def test_retry_after_is_honoured_and_overload_retried_under_each_api(api: str) -> None:
    app = standin(fail_429=1, retry_after_s=7, fail_500=1)  # Anthropic's 500 here is a 529
    clock = VirtualClock()
    model = client(app, api, clock)
    answer = await model.chat(TOOL_ROUND, key=KEY, deadline=clock.now() + 600)
    assert answer.text
    assert clock.sleeps[0] == 7.0
    assert len(clock.sleeps) == 2
    overloaded = "529" if api == "anthropic" else "500"  # Anthropic's overload is a 529
    assert dict(app.state.calls) == {"total": 3, "429": 1, overloaded: 1, "200": 1}


@pytest.mark.parametrize(
    ("api", "body", "said"),
    [
        ("responses", {"seed": 7}, "`seed`"),
        ("responses", {"stop": ["END"]}, "`stop`"),
        ("responses", {"response_format": {"type": "json_object"}}, "['response_format']"),
        ("anthropic", {"seed": 7}, "`seed`"),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
            "messages[1]",
        ),
        (
            "anthropic",
            {"tools": [{"type": "function", "function": {"name": "ls", "strict": True}}]},
            "strict",
        ),
    ],
)
async def test_a_request_the_api_cannot_carry_goes_to_another_runner_before_any_call(
    api: str, body: dict[str, Any], said: str
) -> None:
    app = standin()
    with pytest.raises(StepUnsupported) as refused:
        await bound(client(app, api))({**TOOL_ROUND, **body})
    assert said in str(refused.value)
    assert "model_api 'chat'" in str(refused.value)
    assert app.state.calls["total"] == 0


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    (
        "responses",
        {"object": "response", "output": [{"type": "function_call", "name": "ls"}]},
        "output[0] is not a function call",
    ),
    (
        "responses",
        {"object": "response", "status": "failed", "output": [], "error": {"code": "server_error"}},
        "the response failed (server_error)",
    ),
    ("responses", {"output": "text"}, "not an OpenAI response"),
    (
        "anthropic",
        {
            "type": "message",
            "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": "not an object"}],
        },
        "content[0] is a tool_use whose input is not an object",
    ),
    (
        "anthropic",
        {"type": "message", "content": [{"type": "tool_use", "name": "ls", "input": {}}]},
        "content[0] is not a function call",
    ),
    ("anthropic", {"content": "hello"}, "not an Anthropic message"),
    ("chat", {"choices": []}, "not a chat completion"),
]


@pytest.mark.parametrize(
    ("api", "answer", "said"), MALFORMED, ids=[f"{c[0]}-{i}" for i, c in enumerate(MALFORMED)]
)
async def test_a_malformed_answer_is_retried_then_refused_by_name(
    api: str, answer: dict[str, Any], said: str
) -> None:
    fake, clock = FakeModel(), VirtualClock()
    fake.default = json_response(200, answer)
    model = ModelClient(
        base_url="http://m/v1", clock=clock, transport=fake.transport, api=wire_api(api)
    )
    with pytest.raises(TransientFailure) as refused:
        await model.chat(TOOL_ROUND, key=KEY, deadline=clock.now() + 30)
    assert said in refused.value.detail
    assert "gave up after" in refused.value.detail
    assert len(fake.requests) > 1  # retried: a proxy's hiccup may pass


ANSWERS = {
    "chat": {
        "model": "m",
        "choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
    },
    "responses": {"object": "response", "status": "completed", "output": []},
    "anthropic": {"type": "message", "content": [{"type": "text", "text": "x"}]},
}


@pytest.mark.parametrize("api", MODEL_APIS)
@pytest.mark.parametrize("shape", MODEL_APIS)
async def test_an_answer_in_another_apis_shape_is_an_operator_problem(api: str, shape: str) -> None:
    fake, clock = FakeModel(), VirtualClock()
    fake.default = json_response(200, ANSWERS[shape])
    model = ModelClient(
        base_url="http://m/v1", clock=clock, transport=fake.transport, api=wire_api(api)
    )
    if shape == api:
        await model.chat(TOOL_ROUND, key=KEY, deadline=clock.now() + 30)
        return
    with pytest.raises(OperatorProblem) as wrong:
        await model.chat(TOOL_ROUND, key=KEY, deadline=clock.now() + 30)
    assert f"set model_api = {shape!r}" in wrong.value.action
    assert len(fake.requests) == 1  # never retried, never burns the step


async def test_the_anthropic_request_carries_its_headers_and_the_runners_max_tokens() -> None:
    fake, clock = FakeModel(), VirtualClock()
    fake.default = json_response(200, ANSWERS["anthropic"])
    model = ModelClient(
        base_url="http://m/v1/",
        clock=clock,
        transport=fake.transport,
        api=wire_api("anthropic", anthropic_max_tokens=321),
    )
    body = {
        **TOOL_ROUND,
        "messages": [{"role": "system", "content": "S"}, *TOOL_ROUND["messages"]],
        "stop": "END",
        "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "list_files"}}],
    }
    await model.chat(body, key=KEY, deadline=clock.now() + 30)
    request = fake.requests[0]
    assert request.url == "http://m/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "authorization" not in request.headers
    sent = fake.bodies()[0]
    assert (sent["system"], sent["max_tokens"], sent["stop_sequences"]) == ("S", 321, ["END"])
    assert sent["tool_choice"] == {"type": "any"}
    assert sent["tools"] == [
        {"name": "list_files", "input_schema": {"type": "object", "properties": {}}}
    ]
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "list_files", "input": {"path": "."}}
    ]
    assert sent["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "[]"}],
    }


async def test_anthropic_usage_counts_the_cache_and_responses_usage_is_read() -> None:
    fake, clock = FakeModel(), VirtualClock()
    fake.script(
        json_response(
            200,
            {
                **ANSWERS["anthropic"],
                "stop_reason": "max_tokens",
                "usage": {
                    "input_tokens": 3,
                    "cache_creation_input_tokens": 10,
                    "cache_read_input_tokens": 20,
                    "output_tokens": 4,
                },
            },
        ),
        json_response(
            200,
            {
                **ANSWERS["responses"],
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "usage": {"input_tokens": 6, "output_tokens": 2, "total_tokens": 8},
            },
        ),
    )
    anthropic = ModelClient(
        base_url="http://m/v1", clock=clock, transport=fake.transport, api=wire_api("anthropic")
    )
    got = await anthropic.chat(TOOL_ROUND, key=KEY, deadline=clock.now() + 30)
    assert got.usage == {"prompt_tokens": 33, "completion_tokens": 4, "total_tokens": 37}
    assert got.finish_reason == "length"
    responses = ModelClient(
        base_url="http://m/v1", clock=clock, transport=fake.transport, api=wire_api("responses")
    )
    got = await responses.chat(TOOL_ROUND, key=KEY, deadline=clock.now() + 30)
    assert got.usage == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}
    assert got.finish_reason == "length"


@pytest.mark.parametrize("model_api", ["responses", "anthropic"])
async def test_every_apis_usage_counts_toward_the_tenants_budget(
    model_api: str, api: ApiHarness, tmp_path: Path
) -> None:
    payload = {"messages": [{"role": "user", "content": "count me"}]}
    plan = {
        "idempotency_key": f"k-{model_api}",
        "plan": {"steps": [{"name": "ask", "kind": "chat", "payload": payload}]},
    }
    task = await submitted(api, plan)
    view = await run_steps(api, tmp_path, standin(), task["id"], model_key=KEY, model_api=model_api)
    assert view["state"] == "SUCCEEDED", view
    usage = view["steps"][0]["attempts"][0]["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert view["budget"]["spent"] == usage["total_tokens"] > 0


REQUIRED = {
    "TETHER_SUPERVISOR_URL": "http://s",
    "TETHER_MODEL_URL": "http://m/v1",
    "TETHER_MODEL": "m",
}


def test_model_api_is_a_setting_of_three_values_and_the_flag_wins() -> None:
    environ = {**REQUIRED, "TETHER_MODEL_API": "responses", "TETHER_TRACE_CONTENT": "1"}
    got = load_settings(RunnerSettings, environ=environ)
    assert (got.model_api, got.trace_content, got.anthropic_max_tokens) == (
        "responses",
        True,
        8192,
    )
    flagged = load_settings(RunnerSettings, environ=environ, flags={"model_api": "anthropic"})
    assert flagged.model_api == "anthropic"
    with pytest.raises(SettingsError, match="'model_api' must be one of chat, responses"):
        load_settings(RunnerSettings, environ={**REQUIRED, "TETHER_MODEL_API": "gemini"})
    with pytest.raises(SettingsError, match="anthropic_max_tokens"):
        load_settings(RunnerSettings, environ={**REQUIRED, "TETHER_ANTHROPIC_MAX_TOKENS": "0"})


ANTHROPIC_CREDIT = json_response(
    400,
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API.",
        },
    },
)
SPEND_LIMIT = json_response(
    429,
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "spend limit",
            "details": {"error_code": "enforced_spend_limit_reached"},
        },
    },
)
RESPONSES_QUOTA = json_response(429, {"error": {"message": "quota", "code": "insufficient_quota"}})
RELEASES: list[tuple[str, str, Any, dict[str, Any], tuple[str, bool], str]] = [
    ("anthropic_credit", "anthropic", ANTHROPIC_CREDIT, {}, ("operator", True), "quota"),
    ("anthropic_spend_limit", "anthropic", SPEND_LIMIT, {}, ("operator", True), "quota"),
    ("responses_quota", "responses", RESPONSES_QUOTA, {}, ("operator", True), "quota"),
    (
        "anthropic_answered_as_chat",
        "anthropic",
        json_response(200, ANSWERS["chat"]),
        {},
        ("operator", True),
        "in the shape of model_api 'chat'",
    ),
    (
        "responses_malformed",
        "responses",
        json_response(200, {"output": 3}),
        {},
        ("transient", True),
        "not an OpenAI response",
    ),
    (
        "responses_seed",
        "responses",
        json_response(200, ANSWERS["responses"]),
        {"seed": 1},
        ("invalid", True),
        "model_api 'chat'",
    ),
]


@pytest.mark.parametrize(
    ("api", "answer", "extra", "release", "said"),
    [c[1:] for c in RELEASES],
    ids=[c[0] for c in RELEASES],
)
async def test_a_runner_releases_each_apis_refusal_by_the_same_rules(
    tmp_path: Path,
    api: str,
    answer: Any,
    extra: dict[str, Any],
    release: tuple[str, bool],
    said: str,
) -> None:
    """A spent quota or a server that speaks another API never burns the step (`operator`,
    uncounted); a malformed answer is retried until the deadline (`transient`); a request the
    API cannot carry is left for another runner (`invalid`, retryable) before any call."""
    rig = make_rig(tmp_path, model_api=api, pause_initial_s=30.0, model_timeout_s=0.5)
    rig.supervisor.requeue_released = False
    rig.model.default = answer
    payload = {"messages": [{"role": "user", "content": "hi"}], **extra}
    rig.supervisor.offer(make_lease("s1", payload=payload))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await rig.supervisor.until(lambda: bool(rig.supervisor.of("release", "s1")))
        rig.runner.request_shutdown()
    body = rig.supervisor.of("release", "s1")[0].body
    assert (body["reason"], body["retryable"]) == release
    assert said in body["detail"]
    if release[0] == "invalid":
        assert rig.model.requests == []
