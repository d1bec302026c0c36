"""OpenAI Chat Completions (`model_api = "chat"`): `POST {model_url}/chat/completions`.

The neutral request is this API's own body, sent as it is; of the answer the first choice's
message, `finish_reason`, the answer's `model` and `usage` are read. The answer's `id`,
`created`, `system_fingerprint`, `logprobs` and further choices are dropped: tether asks for
one choice and they say nothing about its content.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tether.runner.models.base import (
    Completion,
    Retryable,
    WireApi,
    carries,
    neutral_usage,
    read_call,
)
from tether.wire.payloads import ToolCall

# The keys of the provider's message that `Completion` reads; the others go to `extra`.
_READ_KEYS = frozenset({"role", "content", "tool_calls"})


def _read_tool_calls(raw: Any) -> tuple[tuple[ToolCall, ...], list[dict[str, Any]]]:
    """The calls of a message's `tool_calls`, and per call the keys it had besides them;
    `Retryable` naming the call if one is not a function call."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        raise Retryable("200 answer's tool_calls is not a list")
    calls, others = [], []
    for i, call in enumerate(raw):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise Retryable(f"200 answer's tool_calls[{i}] is not a function call")
        function = call["function"]
        if call.get("type", "function") != "function":
            raise Retryable(f"200 answer's tool_calls[{i}] is not a function call")
        calls.append(
            read_call(
                call.get("id"), function.get("name"), function.get("arguments"), f"tool_calls[{i}]"
            )
        )
        other = {k: v for k, v in call.items() if k not in ("id", "type", "function")}
        other_function = {
            k: v for k, v in function.items() if k not in ("name", "arguments") and carries(v)
        }
        if other_function:
            other["function"] = other_function
        others.append({k: v for k, v in other.items() if carries(v)})
    return tuple(calls), others


class ChatCompletions(WireApi):
    name: ClassVar[str] = "chat"
    path: ClassVar[str] = "/chat/completions"
    provider: ClassVar[str] = "openai"
    answer_is: ClassVar[str] = "a chat completion"

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def parse(self, answer: Any, asked_model: str) -> Completion:
        try:
            choice = answer["choices"][0]
            message = choice["message"]
            text = message.get("content")
            if not isinstance(text, str):
                text = "" if text is None else str(text)
            finish = choice.get("finish_reason")
            model = answer.get("model") or asked_model
        except (KeyError, IndexError, TypeError, AttributeError):
            raise Retryable("200 answer is not a chat completion") from None
        tool_calls, call_extras = _read_tool_calls(message.get("tool_calls"))
        extra = {k: v for k, v in message.items() if k not in _READ_KEYS and carries(v)}
        if any(call_extras):
            extra["tool_calls"] = call_extras
        usage = answer.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return Completion(
            text=text,
            finish_reason=None if finish is None else str(finish),
            model=str(model),
            usage=neutral_usage(
                usage.get("prompt_tokens"),
                usage.get("completion_tokens"),
                usage.get("total_tokens"),
            ),
            tool_calls=tool_calls,
            extra=extra,
            response_id=answer.get("id") if isinstance(answer.get("id"), str) else None,
        )
