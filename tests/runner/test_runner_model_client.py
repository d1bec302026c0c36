"""The runner's model client: what is retried, how long it waits, and what is never retried."""

from __future__ import annotations

import httpx
import pytest

from tests.runner.test_runner_fakes import (
    MODEL_KEY,
    FakeModel,
    VirtualClock,
    completion,
    json_response,
)
from tether.runner.errors import OperatorProblem, StepRejected, TransientFailure
from tether.runner.model_client import ModelClient
from tether.runner.retry_after import MAX_RETRY_AFTER_S, parse_retry_after

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _client(model: FakeModel, clock: VirtualClock) -> ModelClient:
    return ModelClient(base_url="http://model.test/v1/", clock=clock, transport=model.transport)


def openai_error(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return json_response(
        status, {"error": {"message": f"nope {MODEL_KEY[:6]}", "type": code, "code": code}}, headers
    )


async def test_a_completion_is_parsed_with_its_usage_and_the_key_is_sent() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(completion("answer", prompt=10, out=4, model="m-2024"))
    got = await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert got.text == "answer"
    assert got.finish_reason == "stop"
    assert got.model == "m-2024"
    assert got.usage == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    request = model.requests[0]
    assert request.url == "http://model.test/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {MODEL_KEY}"
    assert model.bodies() == [BODY]


async def test_no_key_means_no_authorization_header() -> None:
    model, clock = FakeModel(), VirtualClock()
    await _client(model, clock).chat(BODY, key=None, deadline=clock.now() + 60)
    assert "authorization" not in model.requests[0].headers


async def test_429_waits_exactly_what_retry_after_asks() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(openai_error(429, "rate_limit_exceeded", {"Retry-After": "7"}), completion("ok"))
    got = await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert got.text == "ok"
    assert len(model.requests) == 2
    assert clock.sleeps == [7.0]


async def test_500_and_transport_errors_are_retried_with_backoff() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(
        openai_error(500, "server_error"),
        httpx.ConnectError("refused"),
        openai_error(503, "overloaded"),
        json_response(200, {"not": "a completion"}),
        completion("finally"),
    )
    got = await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 600)
    assert got.text == "finally"
    assert len(model.requests) == 5
    assert len(clock.sleeps) == 4
    assert all(0 <= s <= 20.0 for s in clock.sleeps)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (openai_error(400, "invalid_request_error"), StepRejected),
        (openai_error(422, "unprocessable"), StepRejected),
        (openai_error(401, "invalid_api_key"), OperatorProblem),
        (openai_error(403, "forbidden"), OperatorProblem),
        (openai_error(402, "payment_required"), OperatorProblem),
        (openai_error(429, "insufficient_quota", {"Retry-After": "1"}), OperatorProblem),
        (openai_error(404, "model_not_found"), OperatorProblem),
    ],
)
async def test_refusals_are_never_retried(answer: httpx.Response, problem: type[Exception]) -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(answer, completion("must not be reached"))
    with pytest.raises(problem) as caught:
        await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert len(model.requests) == 1
    assert clock.sleeps == []
    if answer.status_code in (400, 404, 422):  # about the request: the provider's words kept
        assert f"nope {MODEL_KEY[:6]}" in str(caught.value)
    else:  # about the account (key, payment, quota): a stock line, the provider's text dropped
        assert "nope" not in str(caught.value)


async def test_a_rejected_key_names_the_operator_action_but_not_the_providers_text() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(openai_error(401, "invalid_api_key"))
    with pytest.raises(OperatorProblem) as caught:
        await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert caught.value.about_key
    assert "valid API key" in caught.value.action
    assert "nope" not in caught.value.detail


async def test_a_retry_after_beyond_the_deadline_gives_up_at_once_and_says_how_long() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(openai_error(429, "rate_limit_exceeded", {"Retry-After": "100"}))
    with pytest.raises(TransientFailure) as caught:
        await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 10)
    assert caught.value.retry_after_s == 100.0
    assert len(model.requests) == 1
    assert clock.sleeps == []


async def test_each_retry_is_heard_with_its_try_number_and_the_give_up_counts_every_try() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(
        openai_error(429, "rate_limit_exceeded", {"Retry-After": "2"}),
        openai_error(429, "rate_limit_exceeded", {"Retry-After": "3"}),
        openai_error(429, "rate_limit_exceeded", {"Retry-After": "100"}),
    )
    heard: list[tuple[int, float]] = []
    with pytest.raises(TransientFailure) as caught:
        await _client(model, clock).chat(
            BODY,
            key=MODEL_KEY,
            deadline=clock.now() + 60,
            on_retry=lambda tries, _why, wait_s: heard.append((tries, wait_s)),
        )
    assert heard == [(1, 2.0), (2, 3.0)]
    assert clock.sleeps == [2.0, 3.0]
    assert len(model.requests) == 3
    assert "gave up after 3 tries" in caught.value.detail


async def test_persistent_5xx_stops_before_the_deadline() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.default = openai_error(502, "bad_gateway")
    start = clock.now()
    with pytest.raises(TransientFailure):
        await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=start + 30)
    assert clock.now() < start + 30
    assert len(model.requests) >= 3


def test_retry_after_forms() -> None:
    assert parse_retry_after(httpx.Headers({"Retry-After": "3"})) == 3.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "1.5"})) == 1.5
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    # milliseconds are turned into seconds before the cap, not after (20 s, not 3.6 s)
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "20000"})) == 20.0
    both = httpx.Headers({"retry-after-ms": "20000", "Retry-After": "20"})
    assert parse_retry_after(both) == 20.0
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "1e12"})) == MAX_RETRY_AFTER_S
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "x", "Retry-After": "2"})) == 2.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "-1"})) is None
    assert parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None
    dated = httpx.Headers(
        {"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT", "Date": "Wed, 21 Oct 2015 07:28:00 GMT"}
    )
    assert parse_retry_after(dated) == 30.0
    # A date is only measured against the answer's own Date, never this machine's clock.
    assert (
        parse_retry_after(httpx.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"})) is None
    )
    assert parse_retry_after(httpx.Headers({"Retry-After": "99999999"})) == 3600.0


def tool_answer(message: dict[str, object], finish: str = "tool_calls") -> httpx.Response:
    return json_response(
        200,
        {
            "model": "m",
            "choices": [{"message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        },
    )


async def test_tool_calls_are_kept_and_the_providers_other_keys_go_to_extra() -> None:
    model, clock = FakeModel(), VirtualClock()
    call = {
        "id": "call_a",
        "type": "function",
        "index": 0,
        "extra_content": {"sig": "x1"},
        "function": {"name": "run", "arguments": '{"cmd": "ls"}', "note": None},
    }
    bare = {"id": "call_b", "function": {"name": "list_files", "arguments": "{}"}}  # no `type`
    model.script(
        tool_answer(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call, bare],
                "refusal": None,
                "annotations": [],
                "reasoning_content": "ls first",
            }
        )
    )
    got = await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert got.text == ""
    assert got.finish_reason == "tool_calls"
    assert [(c.id, c.type, c.function.name, c.function.arguments) for c in got.tool_calls] == [
        ("call_a", "function", "run", '{"cmd": "ls"}'),
        ("call_b", "function", "list_files", "{}"),
    ]
    # What tether does not read is kept where the provider put it; null and empty carry nothing.
    assert got.extra == {
        "reasoning_content": "ls first",
        "tool_calls": [{"index": 0, "extra_content": {"sig": "x1"}}, {}],
    }
    assert got.usage["total_tokens"] == 12


async def test_a_plain_answer_has_no_tool_calls_and_no_extra() -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(tool_answer({"role": "assistant", "content": "hi", "refusal": None}, "stop"))
    got = await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert (got.text, got.tool_calls, got.extra) == ("hi", (), {})


@pytest.mark.parametrize(
    "tool_calls",
    [
        "call_a",
        [{"id": "c", "type": "function"}],
        [{"id": "c", "type": "function", "function": {"name": "run", "arguments": {"a": 1}}}],
        [{"type": "function", "function": {"name": "run", "arguments": "{}"}}],
        [{"id": "c", "type": "retrieval", "function": {"name": "run", "arguments": "{}"}}],
    ],
)
async def test_a_malformed_tool_call_is_not_a_completion_and_is_asked_again(
    tool_calls: object,
) -> None:
    model, clock = FakeModel(), VirtualClock()
    model.script(tool_answer({"role": "assistant", "content": None, "tool_calls": tool_calls}))
    model.script(completion("fine"))
    got = await _client(model, clock).chat(BODY, key=MODEL_KEY, deadline=clock.now() + 60)
    assert got.text == "fine"
    assert len(model.requests) == 2
