"""Anthropic Messages (`model_api = "anthropic"`): `POST {model_url}/messages` with `x-api-key`
and `anthropic-version`.

The neutral request is rewritten: the leading `system` messages become the top-level `system`
text (a `system` message later in the conversation has no place in this API: the request goes
to a runner with another `model_api`); an assistant's text and tool calls become `text` and
`tool_use` blocks (the call's JSON `arguments` its `input` object); `tool` messages become
`tool_result` blocks of the `user` turn that follows, before its text, as the API requires;
consecutive messages of one role are one turn; an empty text is left out (the API refuses
one). `max_tokens`, which this API requires, is the payload's or the runner's
`anthropic_max_tokens`; `stop` is `stop_sequences`; `tool_choice` "required" is `any`. The
API has no `seed`, and no `strict` tools here.

Of the answer, `text` blocks are the text and `tool_use` blocks the tool calls (their `input`
as compact JSON `arguments`); any other block (`thinking`) is kept in `extra["content"]` as
sent. `stop_reason` is read in Chat Completions' words (`end_turn` and `stop_sequence` are
`stop`, `max_tokens` is `length`, `tool_use` is `tool_calls`), another kept as sent. The
prompt's tokens are `input_tokens` plus the cache's `cache_creation_input_tokens` and
`cache_read_input_tokens`, which Anthropic counts apart.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import msgspec

from tether.runner.models.base import (
    Completion,
    ProviderError,
    Retryable,
    WireApi,
    count,
    neutral_usage,
    read_call,
    unsupported,
)
from tether.wire.payloads import ToolCall

# The version of the Messages API the request and answer shapes here follow.
ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 8192

_KNOWN = frozenset(
    {"model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "stop"}
)
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}
_CHOICE = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}
# A spent credit balance or spend limit comes back as a 400 `invalid_request_error` whose
# message says so (Anthropic's errors documentation); it must not fail the task.
_SPENT = re.compile(r"credit balance|spend limit|out of extra usage", re.IGNORECASE)


class AnthropicMessages(WireApi):
    name: ClassVar[str] = "anthropic"
    path: ClassVar[str] = "/messages"
    provider: ClassVar[str] = "anthropic"
    answer_is: ClassVar[str] = "an Anthropic message"

    def __init__(self, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.max_tokens = max_tokens

    def headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        if "seed" in body:
            raise unsupported(self.name, "`seed` (the Messages API has none)")
        unknown = sorted(set(body) - _KNOWN)
        if unknown:
            raise unsupported(self.name, f"the request keys {unknown}")
        system, turns = _turns(body["messages"], self.name)
        wire: dict[str, Any] = {
            "model": body["model"],
            "max_tokens": body.get("max_tokens", self.max_tokens),
            "messages": turns,
        }
        if system:
            wire["system"] = system
        for key in ("temperature", "top_p"):
            if key in body:
                wire[key] = body[key]
        if "stop" in body:
            stop = body["stop"]
            wire["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        if "tools" in body:
            wire["tools"] = [_tool(t, self.name) for t in body["tools"]]
        if "tool_choice" in body:
            choice = body["tool_choice"]
            wire["tool_choice"] = (
                {"type": "tool", "name": choice["function"]["name"]}
                if isinstance(choice, dict)
                else _CHOICE[choice]
            )
        return wire

    def parse(self, answer: Any, asked_model: str) -> Completion:
        if not isinstance(answer, dict) or not isinstance(answer.get("content"), list):
            raise Retryable("200 answer is not an Anthropic message: it has no `content` list")
        texts: list[str] = []
        calls: list[ToolCall] = []
        others: list[Any] = []
        for i, block in enumerate(answer["content"]):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use":
                calls.append(_read_tool_use(block, i))
            elif kind in ("text", None):
                raise Retryable(f"200 answer's content[{i}] is not a content block")
            else:
                others.append(block)
        reason = answer.get("stop_reason")
        usage = answer.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        prompt = [
            count(usage.get(k))
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        return Completion(
            text="".join(texts),
            finish_reason=None if reason is None else _STOP.get(str(reason), str(reason)),
            model=str(answer.get("model") or asked_model),
            usage=neutral_usage(
                None if prompt[0] is None else sum(p or 0 for p in prompt),
                usage.get("output_tokens"),
            ),
            tool_calls=tuple(calls),
            extra={"content": others} if others else {},
            response_id=answer.get("id") if isinstance(answer.get("id"), str) else None,
        )

    def quota_spent(self, status: int, error: ProviderError) -> bool:
        if status == 402 or error.code == "billing_error":
            return True
        if status == 429 and error.detail_code == "enforced_spend_limit_reached":
            return True
        return status == 400 and bool(_SPENT.search(error.message))


def _read_tool_use(block: dict[str, Any], i: int) -> ToolCall:
    tool_input = block.get("input")
    if not isinstance(tool_input, dict):
        raise Retryable(f"200 answer's content[{i}] is a tool_use whose input is not an object")
    arguments = msgspec.json.encode(tool_input).decode()
    return read_call(block.get("id"), block.get("name"), arguments, f"content[{i}]")


def _tool(tool: dict[str, Any], api: str) -> dict[str, Any]:
    function = tool["function"]
    if function.get("strict"):
        raise unsupported(api, f"the strict tool {function['name']!r}")
    out: dict[str, Any] = {
        "name": function["name"],
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if "description" in function:
        out["description"] = function["description"]
    return out


def _turns(messages: list[dict[str, Any]], api: str) -> tuple[str, list[dict[str, Any]]]:
    """The leading system text, and the conversation as alternating turns of blocks."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    system = "\n\n".join(str(m.get("content") or "") for m in messages[:lead])
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages[lead:], start=lead):
        role = message["role"]
        if role == "system":
            raise unsupported(api, f"a system message after the conversation began (messages[{i}])")
        blocks = _blocks(message, i, api)
        if not blocks:
            continue
        turn_role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == turn_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": turn_role, "content": blocks})
    for turn in turns:  # tool results lead their turn
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    return system, turns


def _blocks(message: dict[str, Any], i: int, api: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if message["role"] == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": content or "",
            }
        ]
    blocks: list[dict[str, Any]] = []
    if content:
        blocks.append({"type": "text", "text": str(content)})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        try:
            tool_input = json.loads(function["arguments"] or "{}")
        except ValueError:
            tool_input = None
        if not isinstance(tool_input, dict):
            raise unsupported(
                api,
                f"messages[{i}]'s tool call {call['id']!r}, whose arguments are not a JSON object",
            )
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": tool_input}
        )
    return blocks
