"""The model APIs the runner speaks, one module each behind one interface (`WireApi`), and the
client that calls them (docs/design.md, The runner).

The runner's `model_api` setting picks one:

- `chat` (the default): OpenAI Chat Completions, `POST {model_url}/chat/completions`, and the
  many servers that copy it (`tether.runner.models.chat`);
- `responses`: OpenAI Responses, `POST {model_url}/responses` (`tether.runner.models.responses`);
- `anthropic`: Anthropic Messages, `POST {model_url}/messages` (`tether.runner.models.anthropic`).

Step kinds ask in one neutral shape (the Chat Completions body) and get a `Completion`
back, so the agent's transcript and checkpoints hold the same messages under every API (a
checkpointed transcript resumes under the API that wrote it, or any other), and every API's
token counts are read into the same `usage` keys the tenant's budget counts.
"""

from __future__ import annotations

from typing import Literal, get_args

from tether.runner.models.anthropic import DEFAULT_MAX_TOKENS, AnthropicMessages
from tether.runner.models.base import USAGE_KEYS, Completion, RetryHook, WireApi
from tether.runner.models.chat import ChatCompletions
from tether.runner.models.client import ModelClient
from tether.runner.models.responses import Responses

__all__ = [
    "MODEL_APIS",
    "USAGE_KEYS",
    "Completion",
    "ModelApi",
    "ModelClient",
    "RetryHook",
    "WireApi",
    "wire_api",
]

ModelApi = Literal["chat", "responses", "anthropic"]
MODEL_APIS: tuple[str, ...] = get_args(ModelApi)


def wire_api(name: str, *, anthropic_max_tokens: int = DEFAULT_MAX_TOKENS) -> WireApi:
    """The `WireApi` a `model_api` setting names; `ValueError` for another name."""
    if name == "chat":
        return ChatCompletions()
    if name == "responses":
        return Responses()
    if name == "anthropic":
        return AnthropicMessages(max_tokens=anthropic_max_tokens)
    raise ValueError(f"model_api must be one of {', '.join(MODEL_APIS)}, got {name!r}")
