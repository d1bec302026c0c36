"""The supervisor's runner API (SPEC §5) as calls, with its answers made into types.

`report_many` is `report` for several steps in one request (`POST /v1/steps/results`, an
addition to SPEC §5); each result gets its own answer, turned into what `report` would have
answered or raised.

Each call makes exactly one HTTP request; retrying is the caller's decision, because what a
retry means differs (a claim backs off, a renew races the lease's expiry). Errors come out
as the runner's own exceptions: `LeaseLost` for any answer saying the step is no longer ours,
`TokenRejected` for 401/403, `SupervisorUnreachable` for anything worth retrying.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx

from runner.clock import Clock
from runner.errors import (
    LeaseLost,
    LostBecause,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from runner.http import make_client
from runner.lease import Lease, parse_lease
from tether.wire import API_PREFIX, Outcome, ReleaseReason

# An answer slower than the long-poll by this much means the supervisor is in trouble.
CLAIM_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Renewal:
    ttl_s: float
    renew_every_s: float
    cancelled: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResultReport:
    fence: int
    payload_hash: str
    output: Any
    usage: dict[str, int]
    candidate_sha: str | None = None
    artifacts: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "fence": self.fence,
            "payload_hash": self.payload_hash,
            "output": self.output,
            "usage": self.usage,
        }
        if self.candidate_sha is not None:
            body["candidate_sha"] = self.candidate_sha
        if self.artifacts:
            body["artifacts"] = self.artifacts
        return body


def encode_result(step_id: str, report: ResultReport) -> bytes:
    """One result as an item of `POST /v1/steps/results`, encoded as httpx encodes JSON (UTF-8,
    no NaN). `ValueError` (or `TypeError`) for a result that cannot be sent at all: a lone
    surrogate in a model's text, a NaN, an object that is not JSON."""
    item = {"step_id": step_id, **report.to_wire()}
    return json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _error_of(response: httpx.Response) -> tuple[str, str]:
    """`(code, detail)` of an error answer, tolerant of a body that is not ours."""
    try:
        body = response.json()
    except ValueError:
        return "unknown", response.text[:200]
    if isinstance(body, dict):
        return str(body.get("error", "unknown")), str(body.get("detail", ""))[:500]
    return "unknown", str(body)[:200]


_LOST_CODES = {
    "stale_fence": LostBecause.STALE_FENCE,
    "payload_drift": LostBecause.PAYLOAD_DRIFT,
    "terminal": LostBecause.TERMINAL,
}


def _step_error(status: int, code: str, detail: str) -> Exception:
    """What an error answer about one step means to the runner."""
    if status in (401, 403):
        return TokenRejected(f"{status} {code}: {detail}")
    if status >= 500 or status in (408, 429):
        return SupervisorUnreachable(f"{status} {code}: {detail}")
    if status == 404:
        return LeaseLost(LostBecause.NOT_FOUND, f"supervisor: {code}: {detail}")
    if status == 409 and code in _LOST_CODES:
        return LeaseLost(_LOST_CODES[code], f"supervisor: {code}: {detail}")
    return SupervisorRefused(status, code, detail)


def _item_answer(step_id: str, raw: Any) -> Outcome | Exception:
    if not isinstance(raw, dict) or raw.get("step_id") != step_id:
        return SupervisorRefused(200, "bad_answer", "results answer out of order")
    if "outcome" in raw:
        try:
            return Outcome(raw["outcome"])
        except ValueError:
            return SupervisorRefused(200, "bad_answer", "result answer is malformed")
    status = raw.get("status")
    if not isinstance(status, int) or isinstance(status, bool):
        return SupervisorRefused(200, "bad_answer", "result answer has no outcome nor status")
    return _step_error(status, str(raw.get("error", "unknown")), str(raw.get("detail", ""))[:500])


class SupervisorClient:
    """An `httpx.AsyncClient` bound to one supervisor and one runner token."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        clock: Clock,
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
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        content: bytes | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._token}"}
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = await self._http.post(
                API_PREFIX + path,
                json=body,
                content=content,
                headers=headers,
                timeout=timeout_s or self._timeout_s,
            )
        except httpx.RequestError as exc:  # the network, or an answer httpx cannot decode
            raise SupervisorUnreachable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code in (401, 403):
            code, detail = _error_of(response)
            raise TokenRejected(f"{response.status_code} {code}: {detail}")
        if response.status_code >= 500 or response.status_code in (408, 429):
            code, detail = _error_of(response)
            raise SupervisorUnreachable(f"{response.status_code} {code}: {detail}")
        return response

    def _lease_error(self, response: httpx.Response) -> Exception:
        """A 4xx about one step: lost if it says the step is no longer ours, else refused."""
        code, detail = _error_of(response)
        return _step_error(response.status_code, code, detail)

    async def claim(self, runner_id: str, capacity: int, wait_s: float) -> list[Lease]:
        """Long-poll for up to `capacity` leases; [] when none came within `wait_s`."""
        response = await self._post(
            "/leases/claim",
            {"runner_id": runner_id, "capacity": capacity, "wait_s": wait_s},
            timeout_s=wait_s + CLAIM_GRACE_S,
        )
        answered_at = self._clock.now()
        if response.status_code == 204:
            return []
        if response.status_code != 200:
            code, detail = _error_of(response)
            raise SupervisorRefused(response.status_code, code, detail)
        try:
            body = response.json()
        except ValueError:
            raise SupervisorRefused(200, "bad_answer", "claim answer is not JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("leases"), list):
            raise SupervisorRefused(200, "bad_answer", "claim answer has no 'leases' list")
        return [parse_lease(raw, answered_at=answered_at) for raw in body["leases"]]

    async def renew(self, step_id: str, fence: int) -> Renewal:
        response = await self._post(f"/leases/{step_id}/renew", {"fence": fence})
        if response.status_code != 200:
            raise self._lease_error(response)
        try:
            body = response.json()
            renewal = Renewal(
                ttl_s=float(body["ttl_s"]),
                renew_every_s=float(body["renew_every_s"]),
                cancelled=bool(body["cancelled"]),
            )
        except (ValueError, KeyError, TypeError):
            raise SupervisorRefused(200, "bad_answer", "renew answer is malformed") from None
        if not renewal.renew_every_s > 0:  # would make the keeper spin
            raise SupervisorRefused(200, "bad_answer", "renew answer needs renew_every_s > 0")
        return renewal

    async def release(
        self, step_id: str, fence: int, reason: ReleaseReason, *, retryable: bool, detail: str
    ) -> None:
        response = await self._post(
            f"/leases/{step_id}/release",
            {"fence": fence, "reason": str(reason), "retryable": retryable, "detail": detail},
        )
        if response.status_code != 200:
            raise self._lease_error(response)

    async def report(self, step_id: str, report: ResultReport) -> Outcome:
        """`applied` or `replayed`, both success; `LeaseLost` when the step is not ours."""
        response = await self._post(f"/steps/{step_id}/result", report.to_wire())
        if response.status_code != 200:
            raise self._lease_error(response)
        try:
            return Outcome(response.json()["outcome"])
        except (ValueError, KeyError, TypeError):
            raise SupervisorRefused(200, "bad_answer", "result answer is malformed") from None

    async def report_many(self, items: list[tuple[str, bytes]]) -> list[Outcome | Exception]:
        """One answer per `(step_id, encode_result(...))`, in order: an outcome, or the
        exception `report` would have raised for that step. A refusal of the whole request (a
        supervisor without this route, a body over its limit) raises `SupervisorRefused`; the
        caller then reports one by one."""
        content = b'{"results":[' + b",".join(encoded for _, encoded in items) + b"]}"
        response = await self._post("/steps/results", content=content)
        if response.status_code != 200:
            code, detail = _error_of(response)
            raise SupervisorRefused(response.status_code, code, detail)
        try:
            answers = response.json()["results"]
        except (ValueError, KeyError, TypeError):
            raise SupervisorRefused(200, "bad_answer", "results answer is malformed") from None
        if not isinstance(answers, list) or len(answers) != len(items):
            raise SupervisorRefused(200, "bad_answer", "results answer has the wrong length")
        pairs = zip(items, answers, strict=True)
        return [_item_answer(step_id, raw) for (step_id, _), raw in pairs]
