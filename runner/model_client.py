"""An OpenAI-compatible chat client: `POST {model_url}/chat/completions`, retried with care.

Transient failures are retried (honouring `Retry-After`) until the step's deadline; a request
that cannot succeed fails the task; a wrong key, a spent quota or a wrong URL is the
operator's problem and never burns the step (docs/design.md, The runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from tether.clocks import MonotonicClock
from tether.runner import tracing
from tether.runner.errors import OperatorProblem, StepRejected, TransientFailure
from tether.runner.http import make_client
from tether.runner.retry_after import HasRetryAfter, parse_retry_after, stop_before_deadline
from tether.runner.retry_after import wait_retry_after as wait_retry_after_header
from tether.wire.payloads import ToolCall

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


# The keys of the provider's message that `Completion` reads; the others go to `extra`.
_READ_KEYS = frozenset({"role", "content", "tool_calls"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completion:
    """The first choice of a provider's answer.

    `text` is "" when the provider sent no content (as beside tool calls). `extra` holds what
    else the provider put in the message (a `refusal`, `reasoning_content`, the keys of a tool
    call other than id, type and function), in the shape it was sent; keys whose value is
    null or empty carry nothing and are left out.
    """

    text: str
    finish_reason: str | None
    model: str
    usage: dict[str, int]
    tool_calls: tuple[ToolCall, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


# Told of each retry of a model call: (tries so far, why the last failed, seconds until the next).
RetryHook = Callable[[int, str, float], None]


class _Retryable(HasRetryAfter):
    """One failed try worth another."""

    def __init__(self, detail: str, retry_after_s: float | None = None) -> None:
        self.detail = detail
        self.retry_after_s = retry_after_s
        super().__init__(detail)


def _provider_error(response: httpx.Response) -> tuple[str, str]:
    """`(code, message)` from an OpenAI-style `{"error": {...}}` body, tolerant of others."""
    try:
        body = response.json()
    except ValueError:
        return "", response.text[:200]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or ""
        return str(code), str(error.get("message", ""))[:300]
    if isinstance(error, str):
        return error, str(body.get("detail", ""))[:300]
    return "", str(body)[:200]


def _usage(raw: Any) -> dict[str, int]:
    usage = {}
    if isinstance(raw, dict):
        for key in USAGE_KEYS:
            value = raw.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                usage[key] = value
    if "total_tokens" not in usage and usage:
        usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return usage


def _carries(value: Any) -> bool:
    return value is not None and value not in ([], {})


def _read_tool_calls(raw: Any) -> tuple[tuple[ToolCall, ...], list[dict[str, Any]]]:
    """The calls of a message's `tool_calls`, and per call the keys it had besides them;
    `_Retryable` naming the call if one is not a function call."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        raise _Retryable("200 answer's tool_calls is not a list")
    calls, others = [], []
    for i, call in enumerate(raw):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise _Retryable(f"200 answer's tool_calls[{i}] is not a function call")
        function = call["function"]
        try:
            calls.append(
                msgspec.convert(
                    {
                        "id": call.get("id"),
                        "type": call.get("type", "function"),
                        "function": {
                            "name": function.get("name"),
                            "arguments": function.get("arguments"),
                        },
                    },
                    ToolCall,
                )
            )
        except msgspec.ValidationError as exc:
            raise _Retryable(
                f"200 answer's tool_calls[{i}] is not a function call: {exc}"
            ) from None
        other = {k: v for k, v in call.items() if k not in ("id", "type", "function")}
        other_function = {
            k: v for k, v in function.items() if k not in ("name", "arguments") and _carries(v)
        }
        if other_function:
            other["function"] = other_function
        others.append({k: v for k, v in other.items() if _carries(v)})
    return tuple(calls), others


def parse_completion(response: httpx.Response, asked_model: str) -> Completion:
    """The first choice of a 200 reply; `_Retryable` if it is not a completion at all."""
    try:
        body = response.json()
        choice = body["choices"][0]
        message = choice["message"]
        text = message.get("content")
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        finish = choice.get("finish_reason")
        model = body.get("model") or asked_model
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise _Retryable("200 answer is not a chat completion") from None
    tool_calls, call_extras = _read_tool_calls(message.get("tool_calls"))
    extra = {k: v for k, v in message.items() if k not in _READ_KEYS and _carries(v)}
    if any(call_extras):
        extra["tool_calls"] = call_extras
    return Completion(
        text=text,
        finish_reason=None if finish is None else str(finish),
        model=str(model),
        usage=_usage(body.get("usage")),
        tool_calls=tool_calls,
        extra=extra,
    )


class ModelClient:
    """Chat completions against one OpenAI-compatible base URL."""

    def __init__(
        self,
        *,
        base_url: str,
        clock: MonotonicClock,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff: wait_base | None = None,
    ) -> None:
        self._clock = clock
        self._backoff = backoff or wait_random_exponential(multiplier=0.5, max=20.0)
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._http = make_client(transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _classify(self, response: httpx.Response) -> Exception | None:
        """None for success; otherwise the exception a non-2xx reply stands for."""
        status = response.status_code
        if 200 <= status < 300:
            return None
        code, message = _provider_error(response)
        call = f"POST {self._url}"  # every error names the call: model_url is often the cause
        if status in (401, 403):  # the provider's message is never copied: some echo the key
            return OperatorProblem(
                f"model provider rejected the API key ({call} answered {status})",
                action="put a valid API key in the model key file; the runner re-reads it",
                about_key=True,
            )
        if status == 402 or (status == 429 and code == "insufficient_quota"):
            return OperatorProblem(
                f"model provider quota exhausted ({status} {code or 'payment required'})",
                action="raise the provider quota or add credit; steps wait, they do not fail",
            )
        if status in (400, 413, 422):
            return StepRejected(
                f"model rejected the request ({call} answered {status} {code}): {message}"
            )
        if status == 429 or status in (408, 409) or status >= 500:
            return _Retryable(
                f"{call} answered {status} {code}".strip(), parse_retry_after(response.headers)
            )
        return OperatorProblem(
            f"{call} answered {status} {code}: {message}".strip(),
            action="check model_url and the model name in the runner's settings",
        )

    async def _try_once(self, body: dict[str, Any], key: str | None, deadline: float) -> Completion:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        remaining = max(0.01, deadline - self._clock.now())
        try:
            response = await self._http.post(
                self._url, json=body, headers=headers, timeout=remaining
            )
        except httpx.RequestError as exc:  # the network, or a reply httpx cannot decode
            raise _Retryable(f"model unreachable: POST {self._url}: {type(exc).__name__}") from exc
        tracing.annotate(status_code=response.status_code)
        problem = self._classify(response)
        if problem is not None:
            raise problem
        return parse_completion(response, str(body.get("model", "")))

    async def chat(
        self,
        body: dict[str, Any],
        *,
        key: str | None,
        deadline: float,
        on_retry: RetryHook | None = None,
    ) -> Completion:
        """One completion, retried until `deadline` (on the runner's clock) at the latest.

        `on_retry(tries, why, wait_s)` hears of each retry before its wait. Retries exhausted
        raise `TransientFailure` carrying the last `Retry-After`, so the runner can hold off
        claiming.
        """

        def before_sleep(state: RetryCallState) -> None:
            if on_retry is None or state.outcome is None:
                return
            failure = state.outcome.exception()
            why = failure.detail if isinstance(failure, _Retryable) else str(failure)
            wait_s = state.next_action.sleep if state.next_action is not None else 0.0
            on_retry(state.attempt_number, why, wait_s)

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Retryable),
            wait=wait_retry_after_header(self._backoff),
            stop=stop_before_deadline(self._clock, deadline),
            sleep=self._clock.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        with tracing.span("tether.model.call", model=str(body.get("model", ""))) as span:
            completion = await self._chat(retrying, body, key, deadline)
            span.set(tries=retrying.statistics.get("attempt_number", 1), **completion.usage)
            span.set(finish_reason=completion.finish_reason)
            return completion

    async def _chat(
        self, retrying: AsyncRetrying, body: dict[str, Any], key: str | None, deadline: float
    ) -> Completion:
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._try_once(body, key, deadline)
        except _Retryable as exc:
            tries = retrying.statistics.get("attempt_number", 1)
            raise TransientFailure(
                f"{exc.detail}; gave up after {tries} tries within the step's deadline",
                retry_after_s=exc.retry_after_s,
            ) from None
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover
