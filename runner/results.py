"""Results that are ready at the same moment go to the supervisor in one request.

The runner's half of group commit. There is no timer and no background task: a step with a
result, finding no request in flight, sends everything queued (its own result included, up to
`RESULTS_PER_REQUEST_MAX`); results that become ready while that request is out wait for its
answer and go together in the next one. At low load every request carries one result, as a
single report would; under load one request answers many steps, and the supervisor commits
them in one transaction. Nothing waits for company, so batching adds no latency.

Each step still gets its own answer, exactly what `SupervisorClient.report` would give it:
`applied` or `replayed`, or the exception. A result that cannot be encoded at all is refused
to its own step before it joins a request (`SupervisorRefused`, so the step is released as
rejected), and never spoils another step's request. A request that got no answer, failed in
a way nobody foresaw, or was cancelled with the step that sent it fails every result in it
with `SupervisorUnreachable`, which each step retries on its own; a retried result is answered
`replayed` if the first one committed. A refusal of the whole request (a body over the
supervisor's limit) sends those results again one per request on the single route; a
supervisor without the batch route (404/405) gets single reports from then on.
"""

from __future__ import annotations

import dataclasses

import anyio

from runner.errors import LeaseLost, SupervisorRefused, SupervisorUnreachable, TokenRejected
from runner.supervisor_client import ResultReport, SupervisorClient, encode_result
from tether.broadcast import Broadcast
from tether.wire import RESULTS_PER_REQUEST_MAX, Outcome

Answer = Outcome | Exception


@dataclasses.dataclass(eq=False)
class _Pending:
    step_id: str
    report: ResultReport
    encoded: bytes
    answer: Answer | None = None


class ResultSender:
    def __init__(
        self, client: SupervisorClient, *, per_request: int = RESULTS_PER_REQUEST_MAX
    ) -> None:
        self._client = client
        self._per_request = per_request
        self._queue: list[_Pending] = []
        self._sending = False
        self._sent = Broadcast()
        self.batch_route = True  # False once the supervisor said it has no such route
        self.requests = 0
        self.results = 0

    async def report(self, step_id: str, report: ResultReport) -> Outcome:
        """Report one step's result; answers or raises as `SupervisorClient.report` does."""
        try:
            encoded = encode_result(step_id, report)
        except (ValueError, TypeError) as exc:
            detail = f"the result cannot be sent as JSON ({type(exc).__name__}: {exc})"
            raise SupervisorRefused(422, "invalid_field", detail) from None
        item = _Pending(step_id, report, encoded)
        self._queue.append(item)
        try:
            while item.answer is None:
                if self._sending:
                    await self._sent.armed().wait()
                else:
                    await self._send_next()
        finally:
            if item.answer is None and item in self._queue:  # cancelled before it was sent
                self._queue.remove(item)
        if isinstance(item.answer, Exception):
            raise item.answer
        return item.answer

    async def _send_next(self) -> None:
        batch = self._queue[: self._per_request]
        del self._queue[: self._per_request]
        self._sending = True
        try:
            answers = await self._answers(batch)
            for pending, answer in zip(batch, answers, strict=True):
                pending.answer = answer
        except (SupervisorUnreachable, TokenRejected) as exc:
            for pending in batch:  # one exception object per step that raises it
                pending.answer = type(exc)(exc.detail)
        except Exception as exc:  # the request's fate is unknown: each step retries
            for pending in batch:
                pending.answer = SupervisorUnreachable(
                    f"sending results failed: {type(exc).__name__}: {exc}"
                )
        finally:
            for pending in batch:
                if pending.answer is None:
                    pending.answer = SupervisorUnreachable(
                        "the request carrying this result was cancelled before its answer"
                    )
            self._sending = False
            self._sent.fire()

    async def _answers(self, batch: list[_Pending]) -> list[Answer]:
        self.requests += 1
        self.results += len(batch)
        if self.batch_route:
            try:
                return await self._client.report_many([(p.step_id, p.encoded) for p in batch])
            except SupervisorRefused as refused:
                if refused.status in (404, 405):
                    self.batch_route = False
        answers: list[Answer] = [SupervisorUnreachable("no answer") for _ in batch]

        async def one(n: int, pending: _Pending) -> None:
            try:
                answers[n] = await self._client.report(pending.step_id, pending.report)
            except (LeaseLost, SupervisorRefused, SupervisorUnreachable, TokenRejected) as exc:
                answers[n] = exc

        async with anyio.create_task_group() as tg:
            for n, pending in enumerate(batch):
                tg.start_soon(one, n, pending)
        return answers
