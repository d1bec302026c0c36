"""Results that are ready at the same moment go to the supervisor in one request.

The runner's half of group commit. There is no timer and no background task: results that
become ready while a request is out wait for it and go together in the next one (up to
`RESULTS_PER_REQUEST_MAX`). Nothing waits for company, so batching adds no latency; under load
one request carries many steps, and the supervisor commits them in one transaction.

Eager dispatch: when the daemon says what it can take (`wanting`), the request also asks for
the next leases, granted in the results' own batch, and hands them to `on_leases` before any
of the request's steps hears its answer (docs/design.md, The runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import anyio

from tether.runner.errors import LeaseLost, SupervisorRefused, SupervisorUnreachable, TokenRejected
from tether.runner.lease import Lease
from tether.runner.shared_request import SharedRequests
from tether.runner.supervisor_client import ResultReport, SupervisorClient, encode_result
from tether.wire import RESULTS_PER_REQUEST_MAX, Outcome
from tether.wire.records import WantLeases

Answer = Outcome | Exception
# What the runner asks for beside `n` results (eager dispatch): None to ask for nothing.
Wanting = Callable[[int], WantLeases | None]


@dataclasses.dataclass(eq=False)
class _Pending:
    step_id: str
    report: ResultReport
    encoded: bytes
    answer: Answer | None = None


class ResultSender(SharedRequests[_Pending, Outcome]):
    """Send each step's result, sharing a request with the results ready beside it."""

    item_name = "result"

    def __init__(
        self,
        client: SupervisorClient,
        *,
        per_request: int = RESULTS_PER_REQUEST_MAX,
        wanting: Wanting | None = None,
        on_leases: Callable[[list[Lease]], None] = lambda _leases: None,
    ) -> None:
        super().__init__(per_request)
        self._client = client
        self._wanting = wanting
        self._on_leases = on_leases
        self.batch_route = True  # False once the supervisor said it has no such route
        self.requests = 0
        self.results = 0

    async def report(self, step_id: str, report: ResultReport) -> Outcome:
        """Report one step's result; return or raise as `SupervisorClient.report` does.

        A result that cannot be encoded is refused to its own step (`SupervisorRefused`, so
        the step is released as rejected) before it joins a request, and never spoils another
        step's request.
        """
        try:
            encoded = encode_result(step_id, report)
        except (ValueError, TypeError) as exc:
            detail = f"the result cannot be sent as JSON ({type(exc).__name__}: {exc})"
            raise SupervisorRefused(422, "invalid_field", detail) from None
        return await self._answer(_Pending(step_id, report, encoded))

    async def _answers(self, batch: list[_Pending]) -> list[Answer]:
        """Return one outcome per result, on the batch route or else one request each.

        A refusal of the whole batch (a body over the supervisor's limit) sends its results
        again one per request; a supervisor without the batch route (404/405) gets single
        reports from then on.
        """
        self.requests += 1
        self.results += len(batch)
        if self.batch_route:
            items = [(p.step_id, p.encoded) for p in batch]
            want = None if self._wanting is None else self._wanting(len(batch))
            try:
                if want is None:
                    return await self._client.report_many(items)
                answers, leases = await self._client.report_many_with_leases(items, want)
            except SupervisorRefused as refused:
                if refused.status in (404, 405):
                    self.batch_route = False
            else:
                if leases:  # started before any of these steps hears its answer
                    self._on_leases(leases)
                return answers
        singles: list[Answer] = [SupervisorUnreachable("no answer") for _ in batch]

        async def one(n: int, pending: _Pending) -> None:
            try:
                singles[n] = await self._client.report(pending.step_id, pending.report)
            except (LeaseLost, SupervisorRefused, SupervisorUnreachable, TokenRejected) as exc:
                singles[n] = exc

        async with anyio.create_task_group() as tg:
            for n, pending in enumerate(batch):
                tg.start_soon(one, n, pending)
        return singles
