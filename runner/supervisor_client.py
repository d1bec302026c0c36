"""The supervisor's runner API (docs/design.md, Runner API) as calls, with its answers read
into the contract's records.

`report_many` is `report` for several steps in one request (`POST /v1/steps/results`); each
result gets its own answer, turned into what `report` would have answered or raised.

Each call makes exactly one HTTP request; retrying is the caller's decision, because what a
retry means differs (a claim backs off, a renew races the lease's expiry). An error answer
becomes the runner's own exception by the contract's table (`tether.wire.runner_action`):
`LeaseLost` for any answer saying the step is no longer ours, `TokenRejected` for a token
refused, `SupervisorUnreachable` for anything worth retrying, `SupervisorRefused` for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import httpx

from runner.errors import (
    LeaseLost,
    LostBecause,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from runner.http import make_client
from runner.lease import Lease
from tether.clocks import MonotonicClock
from tether.codec import BadMessage, decode, encode, encode_strict
from tether.messages import (
    ClaimAnswer,
    ClaimRequest,
    ErrorBody,
    ItemAnswer,
    Record,
    ReleaseRequest,
    Renewal,
    RenewRequest,
    Result,
    ResultAnswer,
    ResultsAnswer,
)
from tether.wire import API_PREFIX, Outcome, ReleaseReason, RunnerAction, runner_action

__all__ = ["CLAIM_GRACE_S", "Renewal", "ResultReport", "SupervisorClient", "encode_result"]

R = TypeVar("R", bound=Record)

# An answer slower than the long-poll by this much means the supervisor is in trouble.
CLAIM_GRACE_S = 10.0

# The runner's name for the contract's result (what a step reports, before it names its step).
ResultReport = Result


def encode_result(step_id: str, report: Result) -> bytes:
    """One result as an item of `POST /v1/steps/results`. `ValueError` (or `TypeError`) for a
    result that cannot be sent at all: a lone surrogate in a model's text, a NaN, an object
    that is not JSON."""
    return encode_strict(report.for_step(step_id))


def _error_of(response: httpx.Response) -> tuple[str, str]:
    """`(code, detail)` of an error answer, tolerant of a body that is not ours."""
    try:
        body = decode(response.content, ErrorBody)
    except BadMessage:
        return "unknown", response.text[:200]
    return body.error, body.detail[:500]


def _step_error(status: int, code: str, detail: str) -> Exception:
    """What an error answer about one step means to the runner."""
    action = runner_action(status, code)
    if action is RunnerAction.STOP:
        return TokenRejected(f"{status} {code}: {detail}")
    if action is RunnerAction.RETRY:
        return SupervisorUnreachable(f"{status} {code}: {detail}")
    if action is RunnerAction.DROP:
        because = LostBecause(code) if status == 409 else LostBecause.NOT_FOUND
        return LeaseLost(because, f"supervisor: {code}: {detail}")
    return SupervisorRefused(status, code, detail)


def _answer(response: httpx.Response, into: type[R], what: str) -> R:
    """The 200 answer `response` holds; a malformed one is `SupervisorRefused`."""
    try:
        return decode(response.content, into)
    except BadMessage as exc:
        raise SupervisorRefused(200, "bad_answer", f"{what} answer: {exc.detail}") from None


def _item_answer(step_id: str, answer: ItemAnswer) -> Outcome | Exception:
    if answer.step_id != step_id:
        return SupervisorRefused(200, "bad_answer", "results answer out of order")
    if answer.outcome is not None:
        return answer.outcome
    if answer.status is None:
        return SupervisorRefused(200, "bad_answer", "result answer has no outcome nor status")
    return _step_error(answer.status, answer.error or "unknown", (answer.detail or "")[:500])


class SupervisorClient:
    """An `httpx.AsyncClient` bound to one supervisor and one runner token."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        clock: MonotonicClock,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._clock = clock
        self._timeout_s = timeout_s
        self._http = make_client(
            base_url=base_url.rstrip("/"), transport=transport, timeout=timeout_s
        )
        self._token = token

    def set_token(self, token: str) -> None:
        self._token = token

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(
        self, path: str, content: bytes, *, timeout_s: float | None = None
    ) -> httpx.Response:
        """POST `content`; an answer saying stop or retry is raised, any other returned."""
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}
        try:
            response = await self._http.post(
                API_PREFIX + path,
                content=content,
                headers=headers,
                timeout=timeout_s or self._timeout_s,
            )
        except httpx.RequestError as exc:  # the network, or an answer httpx cannot decode
            raise SupervisorUnreachable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            code, detail = _error_of(response)
            action = runner_action(response.status_code, code)
            if action is RunnerAction.STOP:
                raise TokenRejected(f"{response.status_code} {code}: {detail}")
            if action is RunnerAction.RETRY:
                raise SupervisorUnreachable(f"{response.status_code} {code}: {detail}")
        return response

    def _lease_error(self, response: httpx.Response) -> Exception:
        """A 4xx about one step: lost if it says the step is no longer ours, else refused."""
        code, detail = _error_of(response)
        return _step_error(response.status_code, code, detail)

    async def claim(
        self, runner_id: str, capacity: int, wait_s: float, kinds: Sequence[str] = ("chat",)
    ) -> list[Lease]:
        """Long-poll for up to `capacity` leases of steps whose kind is in `kinds` (the kinds
        this runner serves); [] when none came within `wait_s`."""
        ask = ClaimRequest(
            runner_id=runner_id, capacity=capacity, wait_s=wait_s, kinds=tuple(kinds)
        )
        response = await self._post("/leases/claim", encode(ask), timeout_s=wait_s + CLAIM_GRACE_S)
        answered_at = self._clock.now()
        if response.status_code == 204:
            return []
        if response.status_code != 200:
            code, detail = _error_of(response)
            raise SupervisorRefused(response.status_code, code, detail)
        answer = _answer(response, ClaimAnswer, "claim")
        return [Lease.held(lease, answered_at=answered_at) for lease in answer.leases]

    async def renew(self, step_id: str, fence: int) -> Renewal:
        response = await self._post(f"/leases/{step_id}/renew", encode(RenewRequest(fence=fence)))
        if response.status_code != 200:
            raise self._lease_error(response)
        return _answer(response, Renewal, "renew")

    async def release(
        self, step_id: str, fence: int, reason: ReleaseReason, *, retryable: bool, detail: str
    ) -> None:
        ask = ReleaseRequest(fence=fence, reason=reason, retryable=retryable, detail=detail)
        response = await self._post(f"/leases/{step_id}/release", encode(ask))
        if response.status_code != 200:
            raise self._lease_error(response)

    async def report(self, step_id: str, report: Result) -> Outcome:
        """`applied` or `replayed`, both success; `LeaseLost` when the step is not ours."""
        response = await self._post(f"/steps/{step_id}/result", encode_strict(report))
        if response.status_code != 200:
            raise self._lease_error(response)
        return _answer(response, ResultAnswer, "result").outcome

    async def report_many(self, items: list[tuple[str, bytes]]) -> list[Outcome | Exception]:
        """One answer per `(step_id, encode_result(...))`, in order: an outcome, or the
        exception `report` would have raised for that step. A refusal of the whole request (a
        supervisor without this route, a body over its limit) raises `SupervisorRefused`; the
        caller then reports one by one."""
        content = b'{"results":[' + b",".join(encoded for _, encoded in items) + b"]}"
        response = await self._post("/steps/results", content)
        if response.status_code != 200:
            code, detail = _error_of(response)
            raise SupervisorRefused(response.status_code, code, detail)
        answers = _answer(response, ResultsAnswer, "results").results
        if len(answers) != len(items):
            raise SupervisorRefused(200, "bad_answer", "results answer has the wrong length")
        pairs = zip(items, answers, strict=True)
        return [_item_answer(step_id, answer) for (step_id, _), answer in pairs]
