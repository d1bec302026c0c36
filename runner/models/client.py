"""The model client: one call of the configured `WireApi`, retried with care, traced as a GenAI
`chat <model>` span.

Transient failures are retried (honouring `Retry-After`) until the step's deadline; a request
that cannot succeed fails the task; a wrong key, a spent quota, a wrong URL or a server that
speaks another API than `model_api` says is the operator's problem and never burns the step
(docs/design.md, The runner). The same rules hold for every API.
"""

from __future__ import annotations

from typing import Any

import httpx
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
from tether.runner.models import genai
from tether.runner.models.base import (
    Completion,
    Retryable,
    RetryHook,
    WireApi,
    answer_shape,
    read_provider_error,
)
from tether.runner.models.chat import ChatCompletions
from tether.runner.retry_after import (
    first_then_retrying,
    parse_retry_after,
    stop_before_deadline,
)
from tether.runner.retry_after import wait_retry_after as wait_retry_after_header

# The longest wait between two tries of a model call (random exponential backoff).
BACKOFF_MAX_S = 20.0


class ModelClient:
    """Calls of one model API (`api`, Chat Completions by default) at one base URL."""

    def __init__(
        self,
        *,
        base_url: str,
        clock: MonotonicClock,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff: wait_base | None = None,
        api: WireApi | None = None,
    ) -> None:
        self.api = api or ChatCompletions()
        self._clock = clock
        self._backoff = backoff or wait_random_exponential(multiplier=0.5, max=BACKOFF_MAX_S)
        self._url = base_url.rstrip("/") + self.api.path
        # Parsed once: httpx parses a URL given as text on every request (issue 28: about 5 % of
        # a request's CPU).
        self._target = url = httpx.URL(self._url)
        self._host = url.host
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._http = make_client(transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _refusal(self, response: httpx.Response) -> Exception:
        """The exception a non-2xx reply stands for."""
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            body = None
        error = read_provider_error(body, response.text)
        code = error.code
        call = f"POST {self._url}"  # every error names the call: model_url is often the cause
        if status in (401, 403):  # the provider's message is never copied: some echo the key
            return OperatorProblem(
                f"model provider rejected the API key ({call} answered {status})",
                action="put a valid API key in the model key file; the runner re-reads it",
                about_key=True,
            )
        if self.api.quota_spent(status, error):
            return OperatorProblem(
                f"model provider quota exhausted ({status} {code or 'payment required'})",
                action="raise the provider quota or add credit; steps wait, they do not fail",
            )
        if status in (400, 413, 422):
            return StepRejected(
                f"model rejected the request ({call} answered {status} {code}): {error.message}"
            )
        if status == 429 or status in (408, 409) or status >= 500:
            return Retryable(
                f"{call} answered {status} {code}".strip(), parse_retry_after(response.headers)
            )
        return OperatorProblem(
            f"{call} answered {status} {code}: {error.message}".strip(),
            action="check model_url, model_api and the model name in the runner's settings",
        )

    def _read(self, response: httpx.Response, asked_model: str) -> Completion:
        """The `Completion` of a 200 reply: `Retryable` if it is not one, `OperatorProblem`
        if it is another API's answer (the server speaks another API than `model_api`)."""
        try:
            body = response.json()
        except ValueError:
            raise Retryable(f"200 answer is not JSON, let alone {self.api.answer_is}") from None
        shape = answer_shape(body)
        if shape is not None and shape != self.api.name:
            raise OperatorProblem(
                f"POST {self._url} answered in the shape of model_api {shape!r}, not"
                f" {self.api.name!r}",
                action=f"set model_api = {shape!r}, or point model_url at a server that"
                f" speaks {self.api.name!r}",
            )
        return self.api.parse(body, asked_model)

    async def _try_once(
        self, request: dict[str, Any], key: str | None, deadline: float
    ) -> Completion:
        remaining = max(0.01, deadline - self._clock.now())
        try:
            response = await self._http.post(
                self._target, json=request, headers=self.api.headers(key), timeout=remaining
            )
        except httpx.RequestError as exc:  # the network, or a reply httpx cannot decode
            raise Retryable(f"model unreachable: POST {self._url}: {type(exc).__name__}") from exc
        tracing.annotate(status_code=response.status_code)
        if not 200 <= response.status_code < 300:
            raise self._refusal(response)
        return self._read(response, str(request.get("model", "")))

    async def chat(
        self,
        body: dict[str, Any],
        *,
        key: str | None,
        deadline: float,
        on_retry: RetryHook | None = None,
    ) -> Completion:
        """One answer to the neutral request `body`, retried until `deadline` (on the
        runner's clock) at the latest.

        `on_retry(tries, why, wait_s)` hears of each retry before its wait. Retries exhausted
        raise `TransientFailure` carrying the last `Retry-After`, so the runner can hold off
        claiming. A request the API cannot carry raises `StepUnsupported` before any call.
        """
        request = self.api.request(body)
        model = str(body.get("model", ""))
        with tracing.model_call(
            provider=self.api.provider,
            model=model,
            address=self._host,
            port=self._port,
            request=genai.request_attributes(body, request),
        ) as span:
            if span.recording and tracing.records_content():
                span.set_standard(genai.input_content(body))
            completion, tries = await self._chat(request, key, deadline, on_retry)
            span.set(tries=tries)
            span.set_standard(genai.response_attributes(completion))
            if span.recording and tracing.records_content():
                span.set_standard(genai.output_content(completion))
            return completion

    def _retrying(self, deadline: float, on_retry: RetryHook | None) -> AsyncRetrying:
        def before_sleep(state: RetryCallState) -> None:
            if on_retry is None or state.outcome is None:
                return
            failure = state.outcome.exception()
            why = failure.detail if isinstance(failure, Retryable) else str(failure)
            wait_s = state.next_action.sleep if state.next_action is not None else 0.0
            on_retry(state.attempt_number, why, wait_s)

        return AsyncRetrying(
            retry=retry_if_exception_type(Retryable),
            wait=wait_retry_after_header(self._backoff),
            stop=stop_before_deadline(self._clock, deadline),
            sleep=self._clock.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )

    async def _chat(
        self, request: dict[str, Any], key: str | None, deadline: float, on_retry: RetryHook | None
    ) -> tuple[Completion, int]:
        """The completion and the tries it took; the first try is made before tenacity's loop
        is built (`first_then_retrying`)."""
        tries = 0

        async def once() -> Completion:
            nonlocal tries
            tries += 1
            return await self._try_once(request, key, deadline)

        try:
            completion = await first_then_retrying(
                once, Retryable, lambda: self._retrying(deadline, on_retry)
            )
        except Retryable as exc:
            raise TransientFailure(
                f"{exc.detail}; gave up after {tries} tries within the step's deadline",
                retry_after_s=exc.retry_after_s,
            ) from None
        return completion, tries
