"""The built-in `chat` kind: one completion for the payload's messages.

The `chat` payload is `tether.wire.payloads.ChatPayload`, the record the supervisor also checks
plans with at submit; a payload that is not one (a typo in a key, a bad role, a wrong type) is
refused here too, before any model call. Besides `messages`, `model`, `temperature`, `top_p`,
`max_tokens`, `seed`, `stop` and `use_outputs` it takes OpenAI's function calling:

- `tools`: `[{"type": "function", "function": {"name", "description"?, "parameters"?,
  "strict"?}}]`, names unique and of `[A-Za-z0-9_-]{1,64}`, `parameters` a JSON Schema object;
- `tool_choice`: "none", "auto", "required" or `{"type": "function", "function": {"name"}}`
  naming a declared tool (and only with `tools`);
- `assistant` messages with `tool_calls` (`[{"id", "type": "function", "function": {"name",
  "arguments"}}]`, `content` then optional) and `tool` messages (`tool_call_id`, `content`)
  answering each of those calls before the next other message.

With `use_outputs: true` the outputs of the task's earlier steps go to the model as one
`user` message placed after the payload's leading `system` messages: one section per step,
`## <step name>` followed by its `text` (a chat output) or its canonical JSON.

The `chat` output: `{"text", "finish_reason", "model", "usage"}`, plus `tool_calls` (as in
an `assistant` message, `arguments` the model's JSON text unparsed) when the model called
tools, `text` then often "", and `extra` when the provider's message held other keys (a
`refusal`, `reasoning_content`, a tool call's other keys), kept as sent, so nothing it sent is
lost; null or empty ones are left out. Outside the message only the first choice's
`finish_reason`, `model` and `usage` are read; the answer's `id`, `created`,
`system_fingerprint`, `logprobs` and further choices are dropped: tether asks for one choice
and they say nothing about its content. `usage` (the provider's token counts) also goes with
the result, for the tenant's budget.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tether.runner.errors import StepRejected
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.lease import EarlierOutput
from tether.wire import canonical_json
from tether.wire.payloads import ChatPayload, plain, read_payload


def chat_request(
    payload: Any, outputs: tuple[EarlierOutput, ...], default_model: str
) -> dict[str, Any]:
    """The provider request for a `chat` payload; `StepRejected` names what is wrong."""
    try:
        chat = read_payload(payload, ChatPayload)
    except ValueError as exc:
        raise StepRejected(f"chat payload: {exc}") from None
    model = default_model if chat.model is msgspec.UNSET else chat.model
    messages = [m.request() for m in chat.messages]
    if chat.use_outputs and outputs:
        lead = 0
        while lead < len(messages) and messages[lead]["role"] == "system":
            lead += 1
        messages.insert(lead, {"role": "user", "content": earlier_outputs_text(outputs)})
    return {"model": model, **chat.model_parameters(), "messages": messages}


def earlier_outputs_text(outputs: tuple[EarlierOutput, ...]) -> str:
    sections = ["Outputs of the earlier steps of this task:"]
    for earlier in outputs:
        out = earlier.output
        if isinstance(out, dict) and isinstance(out.get("text"), str):
            text = out["text"]
        else:
            text = canonical_json(out).decode("utf-8")
        sections.append(f"## {earlier.name}\n{text}")
    return "\n\n".join(sections)


async def run_chat(ctx: StepContext) -> StepOutput:
    """The built-in `chat` kind: one completion for the payload's messages."""
    completion = await ctx.chat(chat_request(ctx.payload, ctx.outputs, ctx.default_model))
    output: dict[str, Any] = {
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "model": completion.model,
        "usage": completion.usage,
    }
    if completion.tool_calls:
        output["tool_calls"] = plain(completion.tool_calls)
    if completion.extra:
        output["extra"] = completion.extra
    return StepOutput(output=output, usage=completion.usage)
