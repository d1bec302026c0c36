"""OpenAI Responses (`model_api = "responses"`): `POST {model_url}/responses`.

The neutral messages become `input` items in order: `system`, `user` and an assistant's text
are messages (`{"type": "message", "role", "content"}`), an assistant's tool calls are
`function_call` items (`call_id`, `name`, `arguments`) and a `tool` message is the
`function_call_output` of its `call_id`. Tools are the flat `{"type": "function", "name",
"parameters", "strict"}`; `strict` is sent false unless the payload says true, since this API
makes it true by default and a schema with optional properties then fails. `max_tokens` is
`max_output_tokens`; the API has no `seed` and no `stop`, so a request with either goes to a
runner with another `model_api` (`StepUnsupported`).

`store` is false: tether keeps the conversation itself (the transcript, its checkpoints) and
sends all of it each turn, so nothing needs to stay at the provider. Of the answer, the
`output` items are read in order: `message` items' `output_text` parts are the text, their
`refusal` parts the `refusal` in `extra`, `function_call` items the tool calls; any other item
(a `reasoning` summary) is kept in `extra["output"]` as sent.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tether.runner.models.base import (
    Completion,
    Retryable,
    WireApi,
    neutral_usage,
    read_call,
    unsupported,
)
from tether.wire.payloads import ToolCall

# The neutral request's keys, and the Responses request keys they become.
_SAME = ("model", "temperature", "top_p")
_KNOWN = frozenset({*_SAME, "messages", "tools", "tool_choice", "max_tokens"})
_NOT_HERE = ("seed", "stop")
# An answer that stopped short (`status: "incomplete"`), in Chat Completions' words.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": content or "",
                }
            )
            continue
        if role != "assistant" or content:
            items.append({"type": "message", "role": role, "content": content or ""})
        for call in message.get("tool_calls") or ():
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    flat: dict[str, Any] = {
        "type": "function",
        "name": function["name"],
        "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        "strict": bool(function.get("strict", False)),
    }
    if "description" in function:
        flat["description"] = function["description"]
    return flat


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice


class Responses(WireApi):
    name: ClassVar[str] = "responses"
    path: ClassVar[str] = "/responses"
    provider: ClassVar[str] = "openai"
    answer_is: ClassVar[str] = "an OpenAI response"

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        for key in _NOT_HERE:
            if key in body:
                raise unsupported(self.name, f"`{key}` (the Responses API has none)")
        unknown = sorted(set(body) - _KNOWN)
        if unknown:
            raise unsupported(self.name, f"the request keys {unknown}")
        wire: dict[str, Any] = {k: body[k] for k in _SAME if k in body}
        wire["input"] = _items(body["messages"])
        wire["store"] = False
        if "max_tokens" in body:
            wire["max_output_tokens"] = body["max_tokens"]
        if "tools" in body:
            wire["tools"] = [_tool(t) for t in body["tools"]]
        if "tool_choice" in body:
            wire["tool_choice"] = _tool_choice(body["tool_choice"])
        return wire

    def parse(self, answer: Any, asked_model: str) -> Completion:
        if not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
            raise Retryable("200 answer is not an OpenAI response: it has no `output` list")
        status = answer.get("status")
        if status == "failed":
            error = answer.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            raise Retryable(f"the response failed ({code or 'no error code'})")
        if status not in (None, "completed", "incomplete"):
            raise Retryable(f"200 answer's response is {status!r}, not completed")
        texts: list[str] = []
        refusals: list[str] = []
        calls: list[ToolCall] = []
        others: list[Any] = []
        for i, item in enumerate(answer["output"]):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "function_call":
                calls.append(
                    read_call(
                        item.get("call_id"), item.get("name"), item.get("arguments"), f"output[{i}]"
                    )
                )
            elif kind == "message":
                _read_message(item, i, texts, refusals, others)
            elif kind is None:
                raise Retryable(f"200 answer's output[{i}] is not an item with a `type`")
            else:
                others.append(item)
        if calls:
            finish = "tool_calls"
        elif status == "incomplete":
            details = answer.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            finish = _INCOMPLETE.get(str(reason), str(reason or "incomplete"))
        else:
            finish = "stop"
        extra: dict[str, Any] = {}
        if refusals:
            extra["refusal"] = "".join(refusals)
        if others:
            extra["output"] = others
        usage = answer.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return Completion(
            text="".join(texts),
            finish_reason=finish,
            model=str(answer.get("model") or asked_model),
            usage=neutral_usage(
                usage.get("input_tokens"), usage.get("output_tokens"), usage.get("total_tokens")
            ),
            tool_calls=tuple(calls),
            extra=extra,
            response_id=answer.get("id") if isinstance(answer.get("id"), str) else None,
        )


def _read_message(
    item: dict[str, Any], i: int, texts: list[str], refusals: list[str], others: list[Any]
) -> None:
    content = item.get("content")
    if not isinstance(content, list):
        raise Retryable(f"200 answer's output[{i}].content is not a list")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "output_text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            refusals.append(part["refusal"])
        elif kind in ("output_text", "refusal", None):
            raise Retryable(f"200 answer's output[{i}].content[{j}] is not a text or refusal")
        else:
            others.append(part)
