"""The supervisor's runner API (docs/design.md, Runner API) as calls, with its replies read
into the contract's records.

Each call makes exactly one HTTP request; retrying is the caller's decision, because what a
retry means differs (a claim backs off, a renew races the lease's expiry). Every error's
detail starts with the request's method and URL, so a log line says which call failed where.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import TypeVar

import httpx

from runner.errors import (
    LeaseLost,
    LostBecause,
    NotASupervisor,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from runner.http import SUPERVISOR_KEEPALIVE_EXPIRY_S, make_client
from runner.lease import Lease
from tether.clocks import MonotonicClock
from tether.codec import BadMessage, decode, encode, encode_strict
from tether.messages import (
    ArtifactStored,
    Checkpoint,
    Checkpointed,
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
    RunnerIdentity,
)
from tether.wire import API_PREFIX, ErrorCode, Outcome, ReleaseReason, RunnerAction, runner_action

__all__ = ["CLAIM_GRACE_S", "Renewal", "ResultReport", "SupervisorClient", "encode_result"]

R = TypeVar("R", bound=Record)

# A reply slower than the long-poll by this much means the supervisor is in trouble.
CLAIM_GRACE_S = 10.0
# A downloaded artifact arrives in pieces of at most this many bytes.
ARTIFACT_CHUNK_BYTES = 64 * 1024

# The runner's name for the contract's result (what a step reports, before it names its step).
ResultReport = Result


def encode_result(step_id: str, report: Result) -> bytes:
    """One result as an item of `POST /v1/steps/results`. `ValueError` (or `TypeError`) for a
    result that cannot be sent at all: a lone surrogate in a model's text, a NaN, an object
    that is not JSON."""
    return encode_strict(report.for_step(step_id))


def _error_of(response: httpx.Response) -> tuple[str, str]:
    """`(code, detail)` of an error response, tolerant of a body that is not ours."""
    body = _contract_error(response)
    if body is None:
        return "unknown", response.text[:200]
    return body.error, body.detail[:500]


def _contract_error(response: httpx.Response) -> ErrorBody | None:
    """The response's body if it is the contract's error shape with a code the contract knows."""
    try:
        body = decode(response.content, ErrorBody)
    except BadMessage:
        return None
    return body if body.error in ErrorCode.__members__.values() else None


def _request_of(response: httpx.Response) -> str:
    """`POST http://host/v1/leases/claim`: the request a response is to, for error details."""
    return f"{response.request.method} {response.request.url}"


def _step_error(status: int, code: str, detail: str, request: str) -> Exception:
    """What an error reply about one step means to the runner, by the contract's table
    (`tether.wire.runner_action`): `LeaseLost` when the step is no longer ours, `TokenRejected`
    for a token refused, `SupervisorUnreachable` for anything worth retrying,
    `SupervisorRefused` for the rest."""
    said = f"{request} answered {status} {code}: {detail}"
    action = runner_action(status, code)
    if action is RunnerAction.STOP:
        return TokenRejected(said)
    if action is RunnerAction.RETRY:
        return SupervisorUnreachable(said)
    if action is RunnerAction.DROP:
        because = LostBecause(code) if status == 409 else LostBecause.NOT_FOUND
        return LeaseLost(because, said)
    return SupervisorRefused(status, code, detail, request=request)


def _stop_or_retry(response: httpx.Response) -> httpx.Response:
    """`response`, unless it is an error saying stop (`TokenRejected`) or retry
    (`SupervisorUnreachable`)."""
    if response.status_code >= 400:
        code, detail = _error_of(response)
        action = runner_action(response.status_code, code)
        said = f"{_request_of(response)} answered {response.status_code} {code}: {detail}"
        if action is RunnerAction.STOP:
            raise TokenRejected(said)
        if action is RunnerAction.RETRY:
            raise SupervisorUnreachable(said)
    return response


def _answer(response: httpx.Response, into: type[R], what: str) -> R:
    """The 200 reply `response` holds; a malformed one is `SupervisorRefused`."""
    try:
        return decode(response.content, into)
    except BadMessage as exc:
        raise SupervisorRefused(
            200, "bad_answer", f"{what} answer: {exc.detail}", request=_request_of(response)
        ) from None


def _item_answer(step_id: str, answer: ItemAnswer, request: str) -> Outcome | Exception:
    request = f"{request} (step {step_id})"
    if answer.step_id != step_id:
        return SupervisorRefused(200, "bad_answer", "results answer out of order", request=request)
    if answer.outcome is not None:
        return answer.outcome
    if answer.status is None:
        return SupervisorRefused(
            200, "bad_answer", "result answer has no outcome nor status", request=request
        )
    code, detail = answer.error or "unknown", (answer.detail or "")[:500]
    return _step_error(answer.status, code, detail, request)


def _not_a_supervisor(base_url: str, response: httpx.Response) -> NotASupervisor:
    """The start-up error for a `supervisor_url` whose reply is not a supervisor's."""
    status = response.status_code
    body = _contract_error(response)
    if body is not None:
        what = f"{status} {body.error}"
    else:
        what = f"{status} {response.headers.get('content-type') or 'with no content type'}"
    fix = "set supervisor_url (or --supervisor) to the supervisor's base URL"
    if httpx.URL(base_url).path.rstrip("/").endswith(API_PREFIX):
        fix += f", without {API_PREFIX}"
    return NotASupervisor(
        f"{base_url} is not a tether supervisor: {_request_of(response)} answered {what},"
        f" not a runner identity; {fix}"
    )


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
        self._base_url = base_url.rstrip("/")
        self._http = make_client(
            base_url=self._base_url,
            transport=transport,
            timeout=timeout_s,
            keepalive_expiry_s=SUPERVISOR_KEEPALIVE_EXPIRY_S,
        )
        self._token = token

    def set_token(self, token: str) -> None:
        self._token = token

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._token}"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    def _unreachable(
        self, method: str, path: str, exc: httpx.RequestError
    ) -> SupervisorUnreachable:
        # Some errors carry no text (a reset connection is `ReadError('')`).
        why = str(exc) or "no answer: the connection was closed or reset"
        url = f"{self._base_url}{API_PREFIX}{path}"
        return SupervisorUnreachable(f"{method} {url}: {type(exc).__name__}: {why}")

    async def _request(
        self,
        method: str,
        path: str,
        content: bytes | AsyncIterable[bytes] | None = None,
        timeout_s: float | None = None,
        *,
        content_type: str = "application/json",
        size: int | None = None,
    ) -> httpx.Response:
        """Send one request; no reply at all is `SupervisorUnreachable`. A streamed body
        (`content` an async iterable) is sent with `size` as its Content-Length."""
        headers = self._headers(content_type if content is not None else None)
        if size is not None:
            headers["Content-Length"] = str(size)
        try:
            return await self._http.request(
                method,
                API_PREFIX + path,
                content=content,
                headers=headers,
                timeout=timeout_s or self._timeout_s,
            )
        except httpx.RequestError as exc:  # the network, or a response httpx cannot decode
            raise self._unreachable(method, path, exc) from exc

    async def _post(
        self, path: str, content: bytes, *, timeout_s: float | None = None
    ) -> httpx.Response:
        """POST `content`; a reply saying stop or retry is raised, any other returned."""
        return _stop_or_retry(await self._request("POST", path, content, timeout_s))

    def _lease_error(self, response: httpx.Response) -> Exception:
        """A 4xx about one step: lost if it says the step is no longer ours, else refused."""
        code, detail = _error_of(response)
        return _step_error(response.status_code, code, detail, _request_of(response))

    def _refused(self, response: httpx.Response) -> SupervisorRefused:
        code, detail = _error_of(response)
        return SupervisorRefused(response.status_code, code, detail, request=_request_of(response))

    async def whoami(self) -> RunnerIdentity:
        """The pool and token id the supervisor knows this runner's token by: the runner's
        first call, and the only one that checks who replies.

        `TokenRejected` for a token refused in the contract's error shape and
        `SupervisorUnreachable` for no reply, a 5xx or a 408/429 (a proxy's 502 while the
        supervisor restarts); any other reply (an HTML page, the model server's 404, the
        supervisor's own 404 for a URL ending in /v1) is `NotASupervisor`.
        """
        response = await self._request("GET", "/runner")
        status = response.status_code
        if status == 200:
            try:
                return decode(response.content, RunnerIdentity)
            except BadMessage:
                raise _not_a_supervisor(self._base_url, response) from None
        body = _contract_error(response)
        code = body.error if body is not None else "unknown"
        action = runner_action(status, code)
        said = f"{_request_of(response)} answered {status} {code}"
        if action is RunnerAction.RETRY:
            raise SupervisorUnreachable(said)
        if action is RunnerAction.STOP and body is not None:
            raise TokenRejected(f"{said}: {body.detail[:500]}")
        raise _not_a_supervisor(self._base_url, response)

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
            raise self._refused(response)
        answer = _answer(response, ClaimAnswer, "claim")
        return [Lease.held(lease, answered_at=answered_at) for lease in answer.leases]

    async def renew(self, step_id: str, fence: int) -> Renewal:
        response = await self._post(f"/leases/{step_id}/renew", encode(RenewRequest(fence=fence)))
        if response.status_code != 200:
            raise self._lease_error(response)
        return _answer(response, Renewal, "renew")

    async def release(
        self,
        step_id: str,
        fence: int,
        reason: ReleaseReason,
        *,
        retryable: bool,
        detail: str,
        usage: Mapping[str, int] | None = None,
    ) -> None:
        """Hand the lease back with the tokens the attempt spent (`usage`), which count toward
        the tenant's budget though the step does not commit."""
        ask = ReleaseRequest(
            fence=fence, reason=reason, retryable=retryable, detail=detail, usage=dict(usage or {})
        )
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
        """Return one entry per `(step_id, encode_result(...))`, in order: an outcome, or the
        exception `report` would have raised for that step. A refusal of the whole request (a
        supervisor without this route, a body over its limit) raises `SupervisorRefused`; the
        caller then reports one by one."""
        content = b'{"results":[' + b",".join(encoded for _, encoded in items) + b"]}"
        response = await self._post("/steps/results", content)
        if response.status_code != 200:
            raise self._refused(response)
        request = _request_of(response)
        answers = _answer(response, ResultsAnswer, "results").results
        if len(answers) != len(items):
            raise SupervisorRefused(
                200, "bad_answer", "results answer has the wrong length", request=request
            )
        pairs = zip(items, answers, strict=True)
        return [_item_answer(step_id, answer, request) for (step_id, _), answer in pairs]

    async def checkpoint(self, step_id: str, checkpoint: Checkpoint) -> Checkpointed:
        """`PUT /v1/steps/{step_id}/checkpoint`; `LeaseLost` when the step is not ours (its
        fence is stale, its task ended), `SupervisorRefused` for any other refusal."""
        response = _stop_or_retry(
            await self._request("PUT", f"/steps/{step_id}/checkpoint", encode(checkpoint))
        )
        if response.status_code != 200:
            raise self._lease_error(response)
        return _answer(response, Checkpointed, "checkpoint")

    async def put_artifact(
        self, digest: str, content: bytes | AsyncIterable[bytes], *, size: int
    ) -> ArtifactStored:
        """`PUT /v1/artifacts/{digest}` with `size` bytes (a stream is never held whole).
        `SupervisorRefused` for a refusal: 413 `body_too_large`, 422 `digest_mismatch`."""
        response = _stop_or_retry(
            await self._request(
                "PUT",
                f"/artifacts/{digest}",
                content,
                content_type="application/octet-stream",
                size=size,
            )
        )
        if response.status_code != 200:
            raise self._refused(response)
        return _answer(response, ArtifactStored, "artifact upload")

    @contextlib.asynccontextmanager
    async def artifact(self, digest: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """`GET /v1/artifacts/{digest}`: its bytes as chunks of at most
        `ARTIFACT_CHUNK_BYTES`, read while the caller iterates. `SupervisorRefused` for a
        refusal (404 `not_found`: no such digest, or not one this runner's pool uploaded); a
        connection lost mid-stream is `SupervisorUnreachable`."""
        path = f"/artifacts/{digest}"
        try:
            async with self._http.stream(
                "GET", API_PREFIX + path, headers=self._headers(None), timeout=self._timeout_s
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise self._refused(_stop_or_retry(response))
                yield response.aiter_bytes(ARTIFACT_CHUNK_BYTES)
        except httpx.RequestError as exc:
            raise self._unreachable("GET", path, exc) from exc
