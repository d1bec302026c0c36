"""The supervisor's runner API (docs/design.md, Runner API) as calls, with its replies read
into the contract's records.

Each call makes one HTTP request to the current supervisor. With several supervisors on one
ledger (`supervisor_url` lists them), a request the current one gives no answer to is sent
again, at once, to the next (`tether.runner.failover`), each supervisor at most once per call; a
streamed body is never sent twice, so such a call only moves the next one. Retrying once
every supervisor failed is the caller's decision, because what a retry means differs (a claim
backs off, a renew races the lease's expiry). Every error's detail starts with the request's
method and URL, so a log line says which call failed where.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import TypeVar
from urllib.parse import urlencode

import anyio
import httpx
import structlog

from tether.clocks import MonotonicClock
from tether.runner import tracing
from tether.runner.errors import (
    LeaseLost,
    LostBecause,
    NotASupervisor,
    SupervisorError,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from tether.runner.failover import Endpoint, Endpoints
from tether.runner.http import SUPERVISOR_KEEPALIVE_EXPIRY_S, make_client
from tether.runner.lease import Lease
from tether.wire import API_PREFIX, ErrorCode, Outcome, ReleaseReason, RunnerAction, runner_action
from tether.wire.codec import BadMessage, decode, encode, encode_strict
from tether.wire.records import (
    ArtifactStored,
    Checkpoint,
    Checkpointed,
    ClaimAnswer,
    ClaimRequest,
    ErrorBody,
    ItemAnswer,
    LeaseRef,
    LogLine,
    LogLines,
    LogLinesKept,
    Record,
    ReleaseRequest,
    Renewal,
    RenewalItem,
    Renewals,
    RenewalsAnswer,
    RenewRequest,
    Result,
    ResultAnswer,
    ResultsAnswer,
    RunnerIdentity,
    WantLeases,
)

__all__ = ["CLAIM_GRACE_S", "Renewal", "ResultReport", "SupervisorClient", "encode_result"]

R = TypeVar("R", bound=Record)

log = structlog.get_logger("runner")

Transports = httpx.AsyncBaseTransport | Sequence[httpx.AsyncBaseTransport | None] | None

# A reply slower than the long-poll by this much means the supervisor is in trouble.
CLAIM_GRACE_S = 10.0
# The paths a runner calls for every step or batch of steps, their URLs parsed once
# (`Endpoint.target`); paths holding a step's id are parsed on each call.
_HOT_PATHS = frozenset({"/leases/claim", "/leases/renewals", "/steps/results", "/logs"})
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


def _renewal_of(item: RenewalItem, request: str) -> Renewal | Exception:
    """One lease's entry of a renewals answer, as `renew` would have returned or raised it."""
    said = f"{request} (step {item.step_id})"
    if item.status is not None:
        return _step_error(item.status, item.error or "unknown", (item.detail or "")[:500], said)
    if item.ttl_s is None or item.renew_every_s is None or item.cancelled is None:
        return SupervisorRefused(200, "bad_answer", "renewal has no ttl_s", request=said)
    return Renewal(
        ttl_s=item.ttl_s,
        renew_every_s=item.renew_every_s,
        cancelled=item.cancelled,
        budget_exhausted=bool(item.budget_exhausted),
    )


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


def _retry_elsewhere(response: httpx.Response) -> bool:
    """Whether `response` is one the runner would send again (5xx, 408, 429): another
    supervisor on the same ledger may answer it."""
    if response.status_code < 400:
        return False
    code, _detail = _error_of(response)
    return runner_action(response.status_code, code) is RunnerAction.RETRY


def _split_base_urls(base_url: str | Sequence[str]) -> list[str]:
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
        raise ValueError("at least one supervisor URL is needed")
    return [url.rstrip("/") for url in urls]


def _transport_for(transport: Transports, n: int, count: int) -> httpx.AsyncBaseTransport | None:
    if transport is None or isinstance(transport, httpx.AsyncBaseTransport):
        return transport
    if len(transport) != count:
        raise ValueError(f"{len(transport)} transports for {count} supervisor URLs")
    return transport[n]


class SupervisorClient:
    """Calls to the supervisors of one ledger (one, or several to fail over between) with one
    runner token.

    `base_url` is one URL or several in failover order; `transport` is one transport for
    every URL, or one per URL (`None` for httpx's own), so that each supervisor has its own
    connection pool.
    """

    def __init__(
        self,
        *,
        base_url: str | Sequence[str],
        token: str,
        clock: MonotonicClock,
        timeout_s: float = 10.0,
        transport: Transports = None,
    ) -> None:
        self._clock = clock
        self._timeout_s = timeout_s
        urls = _split_base_urls(base_url)
        self.endpoints = Endpoints(
            [
                Endpoint(
                    url,
                    make_client(
                        base_url=url,
                        transport=_transport_for(transport, n, len(urls)),
                        timeout=timeout_s,
                        keepalive_expiry_s=SUPERVISOR_KEEPALIVE_EXPIRY_S,
                    ),
                )
                for n, url in enumerate(urls)
            ]
        )
        self._token = token

    @property
    def can_fail_over(self) -> bool:
        """Whether there is another supervisor to send a call to when one gives no answer."""
        return self.endpoints.several

    @property
    def base_url(self) -> str:
        """The current supervisor's base URL."""
        return self.endpoints.current.url

    def set_token(self, token: str) -> None:
        self._token = token

    async def aclose(self) -> None:
        await self.endpoints.aclose()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        """The token, and the current span's `traceparent` when a step's call is traced."""
        headers = {"Authorization": f"Bearer {self._token}"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        traceparent = tracing.traceparent()
        if traceparent is not None:
            headers["traceparent"] = traceparent
        return headers

    @staticmethod
    def _unreachable(
        endpoint: Endpoint, method: str, path: str, exc: httpx.RequestError
    ) -> SupervisorUnreachable:
        # Some errors carry no text (a reset connection is `ReadError('')`).
        why = str(exc) or "no answer: the connection was closed or reset"
        url = f"{endpoint.url}{API_PREFIX}{path}"
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
        (`content` an async iterable) is sent with `size` as its Content-Length.

        While a supervisor gives no answer (no reply, or one the runner would retry), the
        next becomes current (`tether.runner.failover`) and the request goes there, unless its body
        is a stream, which cannot be sent twice; the last supervisor's answer (or silence)
        is the call's."""
        headers = self._headers(content_type if content is not None else None)
        if size is not None:
            headers["Content-Length"] = str(size)
        once = content is not None and not isinstance(content, bytes)
        failure: SupervisorUnreachable | None = None
        response: httpx.Response | None = None
        for endpoint in self.endpoints.attempts():
            try:
                response = await endpoint.http.request(
                    method,
                    endpoint.target(API_PREFIX + path) if path in _HOT_PATHS else API_PREFIX + path,
                    content=content,
                    headers=headers,
                    timeout=timeout_s or self._timeout_s,
                )
            except httpx.RequestError as exc:  # the network, or a response httpx cannot decode
                failure, response = self._unreachable(endpoint, method, path, exc), None
                self.endpoints.failed(endpoint, failure.detail)
            else:
                if not _retry_elsewhere(response):
                    return response
                code, _detail = _error_of(response)
                self.endpoints.failed(
                    endpoint,
                    f"{method} {endpoint.url}{API_PREFIX}{path} answered"
                    f" {response.status_code} {code}",
                )
            if once:
                break
        if response is not None:
            return response
        assert failure is not None
        raise failure

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
        """The pool and token id the supervisors know this runner's token by: the runner's
        first call, and the only one that checks who replies. Every URL is asked.

        `TokenRejected` for a token refused in the contract's error shape and
        `SupervisorUnreachable` for no reply, a 5xx or a 408/429 (a proxy's 502 while the
        supervisor restarts); any other reply (an HTML page, the model server's 404, the
        supervisor's own 404 for a URL ending in /v1) is `NotASupervisor`.

        With several URLs: any URL that replies but not as a supervisor is `NotASupervisor`,
        and so are two supervisors that know the token by different identities (they do not
        share a ledger). Otherwise one identity is enough: the first URL that answered
        becomes current and every other is named in one warning line; with none, a refused
        token is `TokenRejected`, else `SupervisorUnreachable`.
        """
        endpoints = self.endpoints.all
        if len(endpoints) == 1:
            return await self._whoami_at(endpoints[0])
        answers: list[RunnerIdentity | SupervisorError] = [
            SupervisorUnreachable("not asked") for _ in endpoints
        ]

        async def ask(n: int, endpoint: Endpoint) -> None:
            try:
                answers[n] = await self._whoami_at(endpoint)
            except (SupervisorUnreachable, TokenRejected, NotASupervisor) as exc:
                answers[n] = exc

        async with anyio.create_task_group() as tg:
            for n, endpoint in enumerate(endpoints):
                tg.start_soon(ask, n, endpoint)
        for answer in answers:
            if isinstance(answer, NotASupervisor):
                raise answer
        answered = [
            (e, a) for e, a in zip(endpoints, answers, strict=True) if isinstance(a, RunnerIdentity)
        ]
        if not answered:
            for answer in answers:
                if isinstance(answer, TokenRejected):
                    raise answer
            said = "; ".join(str(a) for a in answers)
            raise SupervisorUnreachable(f"no supervisor answered: {said}")
        first, identity = answered[0]
        for endpoint, other in answered[1:]:
            if (other.pool, other.token_id) != (identity.pool, identity.token_id):
                raise NotASupervisor(
                    f"{first.shown} and {endpoint.shown} know the runner token as different"
                    f" tokens (pool {identity.pool!r}, token {identity.token_id} against pool"
                    f" {other.pool!r}, token {other.token_id}): they do not share one ledger;"
                    " list only the supervisors of one ledger in supervisor_url"
                )
        for endpoint, answer in zip(endpoints, answers, strict=True):
            if not isinstance(answer, RunnerIdentity):
                log.warning(
                    "supervisor did not answer at start; the runner fails over to it if it must",
                    url=endpoint.shown,
                    error=str(answer),
                )
        self.endpoints.prefer(first)
        return identity

    async def _whoami_at(self, endpoint: Endpoint) -> RunnerIdentity:
        """`GET /v1/runner` at one supervisor, without failing over (see `whoami`)."""
        try:
            response = await endpoint.http.request(
                "GET", API_PREFIX + "/runner", headers=self._headers(None)
            )
        except httpx.RequestError as exc:
            raise self._unreachable(endpoint, "GET", "/runner", exc) from exc
        status = response.status_code
        if status == 200:
            try:
                return decode(response.content, RunnerIdentity)
            except BadMessage:
                raise _not_a_supervisor(endpoint.url, response) from None
        body = _contract_error(response)
        code = body.error if body is not None else "unknown"
        action = runner_action(status, code)
        said = f"{_request_of(response)} answered {status} {code}"
        if action is RunnerAction.RETRY:
            raise SupervisorUnreachable(said)
        if action is RunnerAction.STOP and body is not None:
            raise TokenRejected(f"{said}: {body.detail[:500]}")
        raise _not_a_supervisor(endpoint.url, response)

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

    async def renew(self, step_id: str, fence: int, *, timeout_s: float | None = None) -> Renewal:
        """Renew the lease `fence` holds; `timeout_s`, when given, shortens the request's
        timeout (never lengthens it)."""
        if timeout_s is not None:
            timeout_s = min(timeout_s, self._timeout_s)
        response = await self._post(
            f"/leases/{step_id}/renew", encode(RenewRequest(fence=fence)), timeout_s=timeout_s
        )
        if response.status_code != 200:
            raise self._lease_error(response)
        return _answer(response, Renewal, "renew")

    async def renew_many(
        self, leases: Sequence[tuple[str, int]], *, timeout_s: float | None = None
    ) -> list[Renewal | Exception]:
        """Renew many leases (`(step_id, fence)` each) in one request: one entry per lease, in
        order, the renewal or the exception `renew` would have raised for it. A refusal of the
        whole request (a supervisor without the route answers 404) raises
        `SupervisorRefused`; the caller then renews one by one."""
        if timeout_s is not None:
            timeout_s = min(timeout_s, self._timeout_s)
        ask = Renewals(leases=tuple(LeaseRef(step_id=s, fence=f) for s, f in leases))
        response = await self._post("/leases/renewals", encode(ask), timeout_s=timeout_s)
        if response.status_code != 200:
            raise self._refused(response)
        request = _request_of(response)
        items = _answer(response, RenewalsAnswer, "renewals").leases
        if [item.step_id for item in items] != [step_id for step_id, _ in leases]:
            raise SupervisorRefused(
                200, "bad_answer", "renewals answer out of order", request=request
            )
        return [_renewal_of(item, request) for item in items]

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
        answers, _leases = await self.report_many_with_leases(items, None)
        return answers

    async def report_many_with_leases(
        self, items: list[tuple[str, bytes]], want: WantLeases | None
    ) -> tuple[list[Outcome | Exception], list[Lease]]:
        """`report_many`, asking with `want` for the next leases (eager dispatch): also return
        the leases granted, held from when the answer arrived, as a claim's are. A supervisor
        older than `want` grants none."""
        content = b'{"results":[' + b",".join(encoded for _, encoded in items) + b"]"
        if want is not None:
            content += b',"want":' + encode(want)
        content += b"}"
        response = await self._post("/steps/results", content)
        answered_at = self._clock.now()
        if response.status_code != 200:
            raise self._refused(response)
        request = _request_of(response)
        answer = _answer(response, ResultsAnswer, "results")
        answers = answer.results
        if len(answers) != len(items):
            raise SupervisorRefused(
                200, "bad_answer", "results answer has the wrong length", request=request
            )
        pairs = zip(items, answers, strict=True)
        leases = [Lease.held(lease, answered_at=answered_at) for lease in answer.leases]
        return [_item_answer(step_id, item, request) for (step_id, _), item in pairs], leases

    async def checkpoint(self, step_id: str, checkpoint: Checkpoint) -> Checkpointed:
        """`PUT /v1/steps/{step_id}/checkpoint`; `LeaseLost` when the step is not ours (its
        fence is stale, its task ended), `SupervisorRefused` for any other refusal."""
        response = _stop_or_retry(
            await self._request("PUT", f"/steps/{step_id}/checkpoint", encode(checkpoint))
        )
        if response.status_code != 200:
            raise self._lease_error(response)
        return _answer(response, Checkpointed, "checkpoint")

    async def ship_logs(self, lines: Sequence[LogLine]) -> LogLinesKept:
        """`POST /v1/logs`: keep `lines` (each about an attempt this token holds or held) on
        the supervisor. `SupervisorRefused` for a refusal: 404 from a supervisor without the
        route."""
        response = await self._post("/logs", encode(LogLines(lines=tuple(lines))))
        if response.status_code != 200:
            raise self._refused(response)
        return _answer(response, LogLinesKept, "log lines")

    async def put_artifact(
        self,
        digest: str,
        content: bytes | AsyncIterable[bytes],
        *,
        size: int,
        lease: tuple[str, int] | None = None,
    ) -> ArtifactStored:
        """`PUT /v1/artifacts/{digest}` with `size` bytes (a stream is never held whole), for
        `lease` (step id, fence) when given: only that task's tenant may then read them.
        `SupervisorRefused` for a refusal: 413 `body_too_large` or `quota_exceeded`, 422
        `digest_mismatch`; `LeaseLost` when the lease is no longer this runner's."""
        path = f"/artifacts/{digest}"
        if lease is not None:
            path += "?" + urlencode({"step_id": lease[0], "fence": lease[1]})
        with tracing.span("tether.artifact.upload", digest=digest, bytes=size) as span:
            response = _stop_or_retry(
                await self._request(
                    "PUT",
                    path,
                    content,
                    content_type="application/octet-stream",
                    size=size,
                )
            )
            span.set(status_code=response.status_code)
        if response.status_code != 200:
            raise self._refused(response) if lease is None else self._lease_error(response)
        return _answer(response, ArtifactStored, "artifact upload")

    @contextlib.asynccontextmanager
    async def artifact(self, digest: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """`GET /v1/artifacts/{digest}`: its bytes as chunks of at most
        `ARTIFACT_CHUNK_BYTES`, read while the caller iterates. `SupervisorRefused` for a
        refusal (404 `not_found`: no such digest, or not one this runner's pool uploaded); a
        connection lost mid-stream is `SupervisorUnreachable`. A stream is not asked again
        elsewhere: a supervisor that gives no answer makes the next current for the caller's
        retry."""
        path = f"/artifacts/{digest}"
        endpoint = self.endpoints.current
        try:
            async with endpoint.http.stream(
                "GET", API_PREFIX + path, headers=self._headers(None), timeout=self._timeout_s
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    if _retry_elsewhere(response):
                        status = response.status_code
                        self.endpoints.failed(endpoint, f"GET {path} answered {status}")
                    raise self._refused(_stop_or_retry(response))
                yield response.aiter_bytes(ARTIFACT_CHUNK_BYTES)
        except httpx.RequestError as exc:
            unreachable = self._unreachable(endpoint, "GET", path, exc)
            self.endpoints.failed(endpoint, unreachable.detail)
            raise unreachable from exc
