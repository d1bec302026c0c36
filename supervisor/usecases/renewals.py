"""A runner's renewals of many leases at once (`renew_many`)."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from tether.supervisor.ledger import LedgerError, LedgerStore, Principal
from tether.wire.records import LeaseRef, RenewalItem, RenewalsAnswer

# The item an answer carries for a renewal the single route would have refused, by step id.
Refusal = Callable[[str, LedgerError], RenewalItem]


async def renew_many(
    ledger: LedgerStore, who: Principal, held: tuple[LeaseRef, ...], *, refusal: Refusal
) -> RenewalsAnswer:
    """Each lease of `held` renewed by the same ledger rule as one alone, started together so
    that they reach the writer together (one transaction); each gets its own answer, in
    order: the renewal, or the item `refusal` makes of what refused it."""
    answers: list[RenewalItem | None] = [None] * len(held)

    async def one(n: int, lease: LeaseRef) -> None:
        try:
            r = await ledger.renew(lease.step_id, lease.fence, who.scope, token_id=who.token_id)
        except LedgerError as exc:
            answers[n] = refusal(lease.step_id, exc)
        else:
            answers[n] = RenewalItem(
                step_id=lease.step_id,
                ttl_s=r.ttl_s,
                renew_every_s=r.renew_every_s,
                cancelled=r.cancelled,
                budget_exhausted=r.budget_exhausted,
            )

    async with anyio.create_task_group() as tg:
        for n, lease in enumerate(held):
            tg.start_soon(one, n, lease)
    done = tuple(a for a in answers if a is not None)
    assert len(done) == len(held)
    return RenewalsAnswer(leases=done)
