"""What every model API module shares: the neutral `Completion` it returns, the `WireApi` it
implements, and the readers of a provider's error body and token counts.

The neutral request is the Chat Completions body a step kind builds (`messages` with
`tool_calls` and `tool` answers, `tools`, `tool_choice`, `temperature`, `top_p`, `max_tokens`,
`seed`, `stop`); each `WireApi` turns it into its own request and its own answer back into a
`Completion`, so transcripts, checkpoints and budgets never see which API carried a turn.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from tether.runner.errors import StepUnsupported
from tether.runner.retry_after import HasRetryAfter
from tether.wire.payloads import ToolCall

# The neutral token counts: every API's usage is read into these (the supervisor's budget
# counts `total_tokens`, else the other two).
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")

# Told of each retry of a model call: (tries so far, why the last failed, seconds until the next).
RetryHook = Callable[[int, str, float], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completion:
    """The model's answer, whichever API carried it.

    `text` is "" when the provider sent no text (as beside tool calls). `finish_reason` is in
    Chat Completions' words (`stop`, `length`, `tool_calls`, `content_filter`; another API's
    reason with no such word is kept as it was sent). `extra` holds what else the provider's
    answer carried that tether does not read (a `refusal`, `reasoning_content`, an Anthropic
    `thinking` block, a Responses `reasoning` item), in the shape it was sent; keys whose value
    is null or empty carry nothing and are left out.
    """

    text: str
    finish_reason: str | None
    model: str
    usage: dict[str, int]
    tool_calls: tuple[ToolCall, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    response_id: str | None = None  # the provider's id of the answer, for the trace


class Retryable(HasRetryAfter):
    """A failed try worth another: the network, a 429, 408, 409 or 5xx, or a 200 answer that
    is not what the API returns (a proxy's hiccup). Tried again until the step's deadline,
    then the step is released `transient` with `detail` naming what was wrong."""

    def __init__(self, detail: str, retry_after_s: float | None = None) -> None:
        self.detail = detail
        self.retry_after_s = retry_after_s
        super().__init__(detail)


@dataclasses.dataclass(frozen=True)
class ProviderError:
    """What a refusal's body says: OpenAI's `{"error": {"code"|"type", "message"}}` or
    Anthropic's `{"type": "error", "error": {"type", "message", "details"?}}`."""

    code: str = ""
    message: str = ""
    detail_code: str = ""  # Anthropic's `error.details.error_code`


def read_provider_error(body: Any, text: str) -> ProviderError:
    """The error a refusal's body (`body`, its JSON; `text`, its raw text) describes."""
    if not isinstance(body, dict):
        return ProviderError(message=text[:200])
    error = body.get("error")
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or ""
        details = error.get("details")
        detail_code = details.get("error_code") if isinstance(details, dict) else None
        return ProviderError(str(code), str(error.get("message", ""))[:300], str(detail_code or ""))
    if isinstance(error, str):
        return ProviderError(error, str(body.get("detail", ""))[:300])
    return ProviderError(message=str(body)[:200])


def count(value: Any) -> int | None:
    """A token count as providers send one: a non-negative integer, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def neutral_usage(prompt: Any, completion: Any, total: Any = None) -> dict[str, int]:
    """The neutral usage from an answer's counts; a count that is not one is left out, and
    `total_tokens` is their sum when the provider sent none."""
    usage = {
        key: value
        for key, raw in zip(USAGE_KEYS, (prompt, completion, total), strict=True)
        if (value := count(raw)) is not None
    }
    if "total_tokens" not in usage and usage:
        usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return usage


def carries(value: Any) -> bool:
    return value is not None and value not in ([], {})


def read_call(call_id: Any, name: Any, arguments: Any, where: str) -> ToolCall:
    """One tool call of an answer as a neutral `ToolCall`; `Retryable` naming `where` if it
    is not one (no id, a name outside `[A-Za-z0-9_-]{1,64}`, arguments not text)."""
    try:
        return msgspec.convert(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}},
            ToolCall,
        )
    except msgspec.ValidationError as exc:
        raise Retryable(f"200 answer's {where} is not a function call: {exc}") from None


# What each API's answer looks like at a glance, to tell an answer in another API's shape
# (the server speaks another API than `model_api` says) from a broken one.
def answer_shape(body: Any) -> str | None:
    """The API whose answer `body` looks like, by its top-level keys; None for none."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("choices"), list):
        return "chat"
    if body.get("object") == "response" and isinstance(body.get("output"), list):
        return "responses"
    if body.get("type") == "message" and isinstance(body.get("content"), list):
        return "anthropic"
    return None


def unsupported(api: str, what: str) -> StepUnsupported:
    """A step whose request this API cannot carry: another runner (another `model_api`) might."""
    return StepUnsupported(
        f"model_api {api!r} cannot carry {what}; a runner with model_api 'chat' can"
    )


class WireApi(abc.ABC):
    """One model API: where its requests go, how they are written and its answers read.

    `request` raises `StepUnsupported` for a neutral request it cannot express (a parameter
    the API lacks); `parse` raises `Retryable` naming what is wrong with a 200 answer that is
    not the API's.
    """

    name: ClassVar[str]  # the `model_api` setting's value
    path: ClassVar[str]  # appended to `model_url`
    provider: ClassVar[str]  # `gen_ai.provider.name`
    answer_is: ClassVar[str]  # what a good answer is, for error messages

    def headers(self, key: str | None) -> dict[str, str]:
        """The request's headers for the model key `key` (None: a server that needs none)."""
        return {"Authorization": f"Bearer {key}"} if key else {}

    @abc.abstractmethod
    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The API's request body for the neutral `body`."""

    @abc.abstractmethod
    def parse(self, answer: Any, asked_model: str) -> Completion:
        """The `Completion` a 200 answer's JSON holds."""

    def quota_spent(self, status: int, error: ProviderError) -> bool:
        """Whether a refusal says the account's quota or credit is spent (never retried,
        never burns the step)."""
        return status == 402 or (status == 429 and error.code == "insufficient_quota")
