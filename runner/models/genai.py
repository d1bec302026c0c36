"""A model call's attributes in OpenTelemetry's GenAI semantic conventions (`gen_ai.*`).

By default only what says nothing of the conversation: the model names, the sampling numbers,
token counts, finish reasons and the answer's id. A value the provider wrote (its model name,
its answer id) goes in only when it is a plain token, since the model server is as hostile as
the model. The messages themselves (`gen_ai.input.messages`, `gen_ai.output.messages`, as JSON
text in the conventions' `parts` form) only when `trace_content` is on, each text clipped to
`CONTENT_TEXT_MAX` characters.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tether.runner.models.base import Completion
from tether.tracing import StandardAttribute

# Enough of each text to follow a conversation in a trace viewer; whole transcripts belong in
# the step's output. Collectors commonly refuse spans of a few MiB.
CONTENT_TEXT_MAX = 8_000

_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+-]{1,200}")

Attributes = dict[str, StandardAttribute | None]


def _plain(value: Any) -> str | None:
    return value if isinstance(value, str) and _PLAIN.fullmatch(value) else None


def _number(value: Any) -> int | float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def request_attributes(body: dict[str, Any], request: dict[str, Any]) -> Attributes:
    """The request's numbers: from the neutral `body`, and `max_tokens` as the API's
    `request` sends it (Anthropic's carries the runner's default)."""
    max_tokens = request.get("max_tokens", request.get("max_output_tokens"))
    return {
        "gen_ai.request.max_tokens": max_tokens if isinstance(max_tokens, int) else None,
        "gen_ai.request.temperature": _number(body.get("temperature")),
        "gen_ai.request.top_p": _number(body.get("top_p")),
        "gen_ai.request.seed": body.get("seed") if isinstance(body.get("seed"), int) else None,
    }


def response_attributes(completion: Completion) -> Attributes:
    usage = completion.usage
    finish = completion.finish_reason
    return {
        "gen_ai.response.model": _plain(completion.model),
        "gen_ai.response.id": _plain(completion.response_id),
        "gen_ai.response.finish_reasons": None if _plain(finish) is None else (str(finish),),
        "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
        "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
    }


def _clip(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) <= CONTENT_TEXT_MAX:
        return text
    return f"{text[:CONTENT_TEXT_MAX]}…[{len(text) - CONTENT_TEXT_MAX} more characters]"


def _call_part(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = _clip(arguments)
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": parsed}


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    if message.get("role") == "tool":
        return [
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": _clip(message.get("content")),
            }
        ]
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"type": "text", "content": _clip(message["content"])})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(_call_part(call.get("id"), function.get("name"), function.get("arguments")))
    return parts


def input_content(body: dict[str, Any]) -> Attributes:
    """`gen_ai.input.messages`: the request's messages (`trace_content` only)."""
    messages = [{"role": m.get("role"), "parts": _parts(m)} for m in body.get("messages", ())]
    return {"gen_ai.input.messages": json.dumps(messages, ensure_ascii=False)}


def output_content(completion: Completion) -> Attributes:
    """`gen_ai.output.messages`: the answer (`trace_content` only)."""
    parts: list[dict[str, Any]] = []
    if completion.text:
        parts.append({"type": "text", "content": _clip(completion.text)})
    for call in completion.tool_calls:
        parts.append(_call_part(call.id, call.function.name, call.function.arguments))
    message = {"role": "assistant", "parts": parts, "finish_reason": completion.finish_reason}
    return {"gen_ai.output.messages": json.dumps([message], ensure_ascii=False)}
