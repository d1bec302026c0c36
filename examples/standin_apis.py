"""The stand-in model's other two APIs, strict: OpenAI Responses (`POST /v1/responses`) and
Anthropic Messages (`POST /v1/messages`). A TEST DOUBLE, as `examples/standin_model.py` is.

Each refuses, with the provider's status and error shape, a request outside the API's
documented shape (the official SDKs' request types): an unknown top-level key (`messages`
sent to Responses), a missing required one (`max_tokens`, the `anthropic-version` header), a
wrong type, a tool result that answers no call, a call left unanswered, an empty text block.
A valid request is read into the neutral Chat Completions messages the stand-in's scenarios
match, and the stand-in's answer is written back in the API's own answer shape. The input
item and content block types tether never sends (images, files, reasoning items) are refused
as this double does not know them, not because the API would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
ToolName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


@dataclasses.dataclass
class Refusal(Exception):
    """A request the API refuses: its status, the provider's error type and message."""

    status: int
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class Neutral:
    """A valid request as the stand-in's scenarios read it."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None


def _convert(value: Any, into: type[Any], where: str) -> Any:
    try:
        return msgspec.convert(value, into)
    except msgspec.ValidationError as exc:
        raise Refusal(400, "invalid_request_error", f"{where}: {exc}") from None


# -- OpenAI Responses ------------------------------------------------------------------------


class FunctionTool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: ToolName
    parameters: dict[str, Any] | None  # required, may be null
    strict: bool | None = None
    description: str | None = None


class InputMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call"]
    call_id: NonEmpty
    name: ToolName
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutput(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call_output"]
    call_id: NonEmpty
    output: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


_ITEMS: dict[str, type[Any]] = {
    "message": InputMessage,
    "function_call": FunctionCall,
    "function_call_output": FunctionCallOutput,
}


class ResponsesRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /v1/responses` as openai-python's `ResponseCreateParams` has it (non-streaming)."""

    model: NonEmpty
    input: str | list[Any]
    background: bool | None = None
    conversation: Any = None
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: Any = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    stream: Literal[False] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    text: dict[str, Any] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    tools: list[FunctionTool] | None = None
    top_logprobs: int | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None


def _responses_unknown(body: dict[str, Any]) -> None:
    known = set(ResponsesRequest.__struct_fields__)
    for key in body:
        if key not in known:  # OpenAI's own words for it
            raise Refusal(
                400, "invalid_request_error", f"Unrecognized request argument supplied: {key}"
            )


def read_responses(body: Any) -> Neutral:
    """The neutral form of a Responses request; `Refusal` if the API would refuse it."""
    if not isinstance(body, dict):
        raise Refusal(400, "invalid_request_error", "the body must be a JSON object")
    _responses_unknown(body)
    request = _convert(body, ResponsesRequest, "request")
    declared = [tool.name for tool in request.tools or ()]
    if len(set(declared)) != len(declared):
        raise Refusal(400, "invalid_request_error", "tools: names must be unique")
    choice = request.tool_choice
    if isinstance(choice, dict) and (
        choice.get("type") != "function" or choice.get("name") not in declared
    ):
        raise Refusal(400, "invalid_request_error", f"tool_choice: {choice} names no tool")
    raw = (
        [{"type": "message", "role": "user", "content": request.input}]
        if isinstance(request.input, str)
        else request.input
    )
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    open_calls: list[str] = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        into = _ITEMS.get(str(kind))
        if into is None:
            raise Refusal(
                400, "invalid_request_error", f"input[{i}]: this double knows no {kind!r}"
            )
        read = _convert(item, into, f"input[{i}]")
        if isinstance(read, FunctionCallOutput):
            if read.call_id not in open_calls:
                raise Refusal(
                    400,
                    "invalid_request_error",
                    f"No tool call found for function call output with call_id {read.call_id}.",
                )
            open_calls.remove(read.call_id)
            messages.append({"role": "tool", "tool_call_id": read.call_id, "content": read.output})
        elif isinstance(read, FunctionCall):
            call = {
                "id": read.call_id,
                "type": "function",
                "function": {"name": read.name, "arguments": read.arguments},
            }
            open_calls.append(read.call_id)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": read.role, "content": read.content})
    if open_calls:
        raise Refusal(
            400, "invalid_request_error", f"No tool output found for function call {open_calls[0]}."
        )
    if not messages:
        raise Refusal(400, "invalid_request_error", "input: must not be empty")
    return Neutral(request.model, messages, request.max_output_tokens)


def responses_answer(completion: dict[str, Any]) -> dict[str, Any]:
    """The stand-in's chat completion as a Responses answer."""
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{completion['id'][-16:]}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    for call in message.get("tool_calls") or ():
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call['id']}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    usage = completion["usage"]
    incomplete = choice["finish_reason"] == "length"
    return {
        "id": f"resp_{completion['id'][-24:]}",
        "object": "response",
        "created_at": 0,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": completion["model"],
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


# -- Anthropic Messages -----------------------------------------------------------------------


class TextBlock(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolUseBlock(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["tool_use"]
    id: NonEmpty
    name: ToolName
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["tool_result"]
    tool_use_id: NonEmpty
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


_BLOCKS: dict[str, type[Any]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
}


class MessageParam(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]
    content: str | list[Any]


class InputSchema(msgspec.Struct):
    type: Literal["object"]


class ToolParam(msgspec.Struct, forbid_unknown_fields=True):
    name: ToolName
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: dict[str, Any] | None = None
    type: Literal["custom"] | None = None


class ToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /v1/messages` as anthropic-sdk-python's `MessageCreateParams` has it
    (non-streaming)."""

    model: NonEmpty
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: Annotated[list[MessageParam], msgspec.Meta(min_length=1)]
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    stop_sequences: list[str] | None = None
    stream: Literal[False] | None = None
    system: str | list[TextBlock] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    thinking: dict[str, Any] | None = None
    tool_choice: ToolChoice | None = None
    tools: list[ToolParam] | None = None
    top_k: int | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None


def _blocks(message: MessageParam, i: int) -> list[Any]:
    if isinstance(message.content, str):
        return [TextBlock(type="text", text=message.content)]
    blocks = []
    for j, raw in enumerate(message.content):
        kind = raw.get("type") if isinstance(raw, dict) else None
        into = _BLOCKS.get(str(kind))
        if into is None:
            raise Refusal(
                400,
                "invalid_request_error",
                f"messages.{i}.content.{j}: this double knows no {kind!r}",
            )
        blocks.append(_convert(raw, into, f"messages.{i}.content.{j}"))
    return blocks


def _bad(message: str) -> Refusal:
    return Refusal(400, "invalid_request_error", message)


def _unanswered(where: str, calls: list[str]) -> Refusal:
    return _bad(
        f"{where}: `tool_use` ids were found without `tool_result` blocks immediately after:"
        f" {', '.join(calls)}"
    )


def _read_request(body: Any, headers: Callable[[str], str | None]) -> MessagesRequest:
    if not headers("anthropic-version"):
        raise _bad("anthropic-version: header is required")
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    for key in body:
        if key not in MessagesRequest.__struct_fields__:
            raise _bad(f"{key}: Extra inputs are not permitted")
    request: MessagesRequest = _convert(body, MessagesRequest, "request")
    declared = [tool.name for tool in request.tools or ()]
    for tool in request.tools or ():
        _convert(tool.input_schema, InputSchema, f"tools.{tool.name}.input_schema")
    choice = request.tool_choice
    if choice is not None and choice.type == "tool" and choice.name not in declared:
        raise _bad("tool_choice.name: names no declared tool")
    return request


def _results(blocks: list[Any], role: str, i: int, open_calls: list[str]) -> list[dict[str, Any]]:
    """The `tool` messages a turn's `tool_result` blocks are; each must answer a `tool_use`
    of the turn before, come first, and all of that turn's calls must be answered."""
    results = [b for b in blocks if isinstance(b, ToolResultBlock)]
    if open_calls and role != "user":
        raise _unanswered(f"messages.{i}", open_calls)
    if any(not isinstance(b, ToolResultBlock) for b in blocks[: len(results)]):
        raise _bad(f"messages.{i}: tool_result blocks must come first in the content")
    answered: list[dict[str, Any]] = []
    for block in results:
        if block.tool_use_id not in open_calls:
            raise _bad(
                f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks:"
                f" {block.tool_use_id}. Each `tool_result` block must have a corresponding"
                " `tool_use` block in the previous message."
            )
        open_calls.remove(block.tool_use_id)
        content = block.content
        text = content if isinstance(content, str) else "".join(b.text for b in content)
        answered.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
    if open_calls:
        raise _unanswered(f"messages.{i}", open_calls)
    return answered


def read_messages(body: Any, headers: Callable[[str], str | None]) -> Neutral:
    """The neutral form of a Messages request; `Refusal` if the API would refuse it."""
    request = _read_request(body, headers)
    messages: list[dict[str, Any]] = []
    if request.system:
        system = request.system
        text = system if isinstance(system, str) else "".join(b.text for b in system)
        messages.append({"role": "system", "content": text})
    open_calls: list[str] = []  # the previous assistant turn's tool_use ids
    for i, message in enumerate(request.messages):
        blocks = _blocks(message, i)
        if any(isinstance(b, TextBlock) and not b.text for b in blocks):
            raise _bad(f"messages.{i}: text content blocks must be non-empty")
        results = _results(blocks, message.role, i, open_calls)
        messages.extend(results)
        texts = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
        if message.role == "assistant":
            calls = [
                {
                    "id": u.id,
                    "type": "function",
                    "function": {"name": u.name, "arguments": json.dumps(u.input)},
                }
                for u in uses
            ]
            entry: dict[str, Any] = {"role": "assistant", "content": texts or None}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
            open_calls = [u.id for u in uses]
        elif uses:
            raise _bad(f"messages.{i}: tool_use in a user turn")
        elif texts or not results:
            messages.append({"role": "user", "content": texts})
    if open_calls:
        raise _unanswered("messages", open_calls)
    return Neutral(request.model, messages, request.max_tokens)


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"raw": arguments}


def messages_answer(completion: dict[str, Any]) -> dict[str, Any]:
    """The stand-in's chat completion as a Messages answer."""
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        content.append(
            {
                "type": "tool_use",
                "id": call["id"].replace("call_", "toolu_", 1),
                "name": call["function"]["name"],
                "input": _tool_input(call["function"]["arguments"]),
            }
        )
    usage = completion["usage"]
    return {
        "id": f"msg_{completion['id'][-24:]}",
        "type": "message",
        "role": "assistant",
        "model": completion["model"],
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice["finish_reason"], "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def anthropic_error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
