"""The lease keeper: acknowledges a lease in time, renews it on time, and gives up honestly.

Any loss (`stale_fence`, a cancelled task, an unknown step, a rejected token, expiry) goes to
`on_lost` once per event; the step decides what to cancel. A renew reply saying the tenant's
token budget is spent goes to `on_budget_exhausted`; the lease is kept meanwhile. The keeper
never reads or sends a wall-clock time, only the fence (docs/design.md, The runner).

With several supervisors (`tether.runner.failover`) a renew waits at most one renew interval for an
answer, and one that gets none goes on to the next supervisor by the same fence: a supervisor
that hangs without refusing costs one renew interval, not the whole request timeout, and the
lease stays live through the others.

With a `RenewalBatcher` (the daemon's), the renewals of all the runner's leases that fall due
together go in one request (`POST /v1/leases/renewals`), and each keeper hears its own lease's
answer exactly as from a single renew. Keepers line their renew times up on the batcher's
(`RenewalBatcher.align`: a renew may go up to a quarter interval early), so a runner holding
many leases sends about one request per renew interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import anyio

from tether.clocks import MonotonicClock
from tether.runner.errors import (
    LeaseLost,
    LostBecause,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from tether.runner.lease import Lease
from tether.runner.shared_request import SharedRequests
from tether.runner.supervisor_client import Renewal, SupervisorClient
from tether.wire.records import MAX_CAPACITY

RenewAnswer = Renewal | Exception
# How long the first renew of a tick waits for the others, at most and as a share of the renew
# interval: keepers aligned on one tick wake microseconds apart (each timer is set from its own
# reading of the clock).
GATHER_S = 0.002
GATHER_SHARE = 0.02


@dataclasses.dataclass(eq=False)
class _Due:
    step_id: str
    fence: int
    timeout_s: float | None
    gather_s: float
    answer: RenewAnswer | None = None


class RenewalBatcher(SharedRequests[_Due, Renewal]):
    """Renew the leases whose renewals are due at the same moment in one request.

    The first keeper to ask waits `GATHER_S` for the keepers woken at the same tick to join
    it, then sends; keepers asking while a request is out go in the next one. A supervisor
    without the batch route (404, 405) gets single renews from then on.
    """

    item_name = "renewal"

    def __init__(self, client: SupervisorClient, *, clock: MonotonicClock) -> None:
        super().__init__(MAX_CAPACITY)
        self._client = client
        self._clock = clock
        self._ticks: set[float] = set()
        self.batch_route = True
        self.requests = 0

    def align(self, due: float, slack: float) -> float:
        """The renew time for a lease due at `due`: a time another lease already renews at,
        in `[due - slack, due]`, else `due` itself, which others may then join."""
        now = self._clock.now()
        self._ticks = {t for t in self._ticks if t >= now}
        near = [t for t in self._ticks if due - slack <= t <= due]
        if near:
            return max(near)
        self._ticks.add(due)
        return due

    async def renew(
        self, step_id: str, fence: int, *, timeout_s: float | None, every_s: float
    ) -> Renewal:
        """Renew one lease renewed every `every_s`; return or raise as
        `SupervisorClient.renew` does."""
        return await self._answer(
            _Due(step_id, fence, timeout_s, min(GATHER_S, every_s * GATHER_SHARE))
        )

    async def _gather(self) -> None:
        # Keepers woken with this one join it.
        await self._clock.sleep(min(d.gather_s for d in self._queue) if self._queue else 0)

    async def _answers(self, batch: list[_Due]) -> list[RenewAnswer]:
        self.requests += 1
        given = [d.timeout_s for d in batch if d.timeout_s is not None]
        timeout_s = min(given) if given else None
        if self.batch_route:
            try:
                return await self._client.renew_many(
                    [(d.step_id, d.fence) for d in batch], timeout_s=timeout_s
                )
            except SupervisorRefused as refused:
                if refused.status not in (404, 405):
                    raise
                self.batch_route = False
        singles: list[RenewAnswer] = [SupervisorUnreachable("no answer") for _ in batch]

        async def one(n: int, due: _Due) -> None:
            try:
                singles[n] = await self._client.renew(
                    due.step_id, due.fence, timeout_s=due.timeout_s
                )
            except (LeaseLost, SupervisorRefused, SupervisorUnreachable, TokenRejected) as exc:
                singles[n] = exc

        async with anyio.create_task_group() as tg:
            for n, due in enumerate(batch):
                tg.start_soon(one, n, due)
        return singles


class LeaseKeeper:
    """Keep one lease with two loops: one renews it, the other ends it when it must have lapsed."""

    def __init__(
        self,
        *,
        lease: Lease,
        client: SupervisorClient,
        clock: MonotonicClock,
        log: Any,
        on_lost: Callable[[LeaseLost], None],
        on_token_rejected: Callable[[str], None] = lambda _detail: None,
        on_budget_exhausted: Callable[[], None] = lambda: None,
        renewals: RenewalBatcher | None = None,
    ) -> None:
        self._lease = lease
        self._client = client
        self._renewals = renewals
        self._clock = clock
        self._log = log
        self._on_lost = on_lost
        self._on_token_rejected = on_token_rejected
        self._on_budget_exhausted = on_budget_exhausted
        self.expires_at = lease.claim_answered_at + min(lease.ttl_s, 1.5 * lease.renew_every_s)
        self.renew_every_s = lease.renew_every_s
        self.lost: LeaseLost | None = None
        self.renewals = 0

    @property
    def acknowledged(self) -> bool:
        """Whether a renew got a reply (a result acknowledges too, but ends the keeper)."""
        return self.renewals > 0

    @property
    def _retry_s(self) -> float:
        return max(0.05, min(1.0, self.renew_every_s / 4))

    def _lose(self, lost: LeaseLost) -> None:
        if self.lost is None:
            self.lost = lost
        self._on_lost(lost)

    async def run(self) -> None:
        """Keep the lease until cancelled, or until it is lost (then return)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_expiry, tg.cancel_scope)
            await self._renew_loop()
            # A refusal ends renewing; the expiry watch still ends the lease on time.

    async def _watch_expiry(self, scope: anyio.CancelScope) -> None:
        """End the lease once the runner's monotonic clock says it cannot still be valid.

        Before the acknowledgement the bound is the claim reply's arrival plus one and a half
        renew intervals (at most three quarters of the accept window; the rest covers the
        grant's commit and the reply's way back) or `ttl_s`, whichever is sooner. After it,
        each deadline counts from when the renew that earned it was *sent*, the earliest
        moment the supervisor could have stamped it, so the runner gives up no later than the
        supervisor does.
        """
        while (left := self.expires_at - self._clock.now()) > 0:
            await self._clock.sleep(left)
        if self.acknowledged:
            self._log.warning(
                "lease expired on the runner's clock; dropping the step",
                ttl_s=self._lease.ttl_s,
            )
        else:  # the bound before the first renew reply: the supervisor's accept window
            self._log.warning(
                "no renew answered within 1.5 renew intervals of the grant (the supervisor"
                " re-queues an unacknowledged lease); dropping the step",
                bound_s=round(min(self._lease.ttl_s, 1.5 * self.renew_every_s), 3),
            )
        self._lose(LeaseLost(LostBecause.EXPIRED))
        scope.cancel()

    async def _renew_loop(self) -> None:
        """Renew half an interval after the claim reply, then every `renew_every_s`.

        The first renew is the acknowledgement the supervisor waits for within its accept
        window. The step's work does not wait for it: a step whose result comes first needs no
        renew (a result acknowledges too). The supervisor picks `renew_every_s` at most half
        its accept window, so the first renew leaves at most a quarter of the window after the
        reply, with room for retries. The cost, chosen knowingly: a task cancelled in the first
        half interval is noticed at that first renew, as a later cancel is noticed at the next
        one; a step never has two effects either way.
        """
        next_at = self._lease.claim_answered_at + self.renew_every_s / 2
        while True:
            if self._renewals is not None:
                next_at = self._renewals.align(next_at, self.renew_every_s / 4)
            await self._clock.sleep(next_at - self._clock.now())
            sent_at = await self._renew_once()
            if sent_at is None:
                return
            next_at = sent_at + self.renew_every_s

    async def _renew_once(self) -> float | None:
        """Renew until the supervisor replies; return when that renew was sent, or None if lost."""
        unreachable = False
        while True:
            sent_at = self._clock.now()
            # One supervisor: nowhere else to ask, so the whole request timeout is the better bet.
            timeout_s = self.renew_every_s if self._client.can_fail_over else None
            try:
                if self._renewals is not None:
                    renewal = await self._renewals.renew(
                        self._lease.step_id,
                        self._lease.fence,
                        timeout_s=timeout_s,
                        every_s=self.renew_every_s,
                    )
                else:
                    renewal = await self._client.renew(
                        self._lease.step_id, self._lease.fence, timeout_s=timeout_s
                    )
            except SupervisorUnreachable as exc:
                if not unreachable:
                    self._log.warning("renew got no answer; retrying", error=exc.detail)
                    unreachable = True
                await self._clock.sleep(self._retry_s)
                continue
            except LeaseLost as lost:
                self._log.warning(
                    "renew refused; dropping the step", because=str(lost.because), error=lost.detail
                )
                self._lose(lost)
                return None
            except TokenRejected as exc:
                self._on_token_rejected(exc.detail)
                self._lose(LeaseLost(LostBecause.TOKEN_REJECTED, exc.detail))
                return None
            except SupervisorRefused as exc:
                # A malformed renew is a bug on one side; retrying cannot help, the lease
                # will expire and the supervisor re-queues the step.
                self._log.error("renew refused as malformed; dropping the step", error=exc.detail)
                self._lose(LeaseLost(LostBecause.NOT_FOUND, exc.detail))
                return None
            if unreachable:
                self._log.info("renew answered again")
            if renewal.cancelled:
                self._log.info("task cancelled; dropping the step")
                self._lose(LeaseLost(LostBecause.CANCELLED))
                return None
            self.expires_at = max(self.expires_at, sent_at + renewal.ttl_s)
            self.renew_every_s = renewal.renew_every_s
            if not self.renewals:
                self._log.debug("lease acknowledged")
            self.renewals += 1
            if renewal.budget_exhausted:
                # The lease still holds; the step decides whether to stop and let it go.
                self._on_budget_exhausted()
            return sent_at
