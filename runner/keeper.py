"""The lease keeper: acknowledges a lease in time, renews it on time, and gives up honestly.

Any loss (`stale_fence`, a cancelled task, an unknown step, a rejected token, expiry) goes to
`on_lost` once per event; the step decides what to cancel. A renew reply saying the tenant's
token budget is spent goes to `on_budget_exhausted`; the lease is kept meanwhile. The keeper
never reads or sends a wall-clock time, only the fence (docs/design.md, The runner).

With several supervisors (`runner.failover`) a renew waits at most one renew interval for an
answer, and one that gets none goes on to the next supervisor by the same fence: a supervisor
that hangs without refusing costs one renew interval, not the whole request timeout, and the
lease stays live through the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from runner.errors import (
    LeaseLost,
    LostBecause,
    SupervisorRefused,
    SupervisorUnreachable,
    TokenRejected,
)
from runner.lease import Lease
from runner.supervisor_client import SupervisorClient
from tether.clocks import MonotonicClock


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
    ) -> None:
        self._lease = lease
        self._client = client
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
