"""Renewals answered from memory: a renew that comes within half a renew interval of the last
one this supervisor wrote for the same lease gets that write's answer again, without a ledger
write (docs/design.md, Fencing and leases; issue 23: a flood of renewals from one lease slowed
every operator's reads by the writes it queued).

The answer is never a fresh TTL: its `ttl_s` is what is left of the deadline written, so a
runner that renews a hundred times a second keeps exactly the lease one renew a half-interval
would give it. Only a write this process made is remembered, under the lease it was made for
(step, fence, token, pool). The store hands each committed batch over in one call
(`committed`): the renewals it wrote are remembered, then every task the batch gave an event
(a cancel, a requeue, a result, an expiry, a failure) is forgotten, renewals of the same batch
included, before any other request runs. An event another supervisor commits on a shared
database forgets everything (`forget_all`). So a cancel is heard at the next renewal. A
tenant's budget being spent makes no event: a renewal from memory may say
`budget_exhausted: false` for at most half an interval longer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tether.wire.records import Renewal


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WrittenRenewal:
    """What the renew rule did for a lease (`step_id`, `fence`, `token_id`, `pool`): the
    answer, the task, when, and the deadline written on the supervisor's clock (None when
    nothing was written: the task was cancelled)."""

    step_id: str
    fence: int
    token_id: str | None
    pool: str | None
    task_id: str
    at: float
    deadline: float | None
    renewal: Renewal


class RenewalMemory:
    """The last renewal written for each lease by this process, for `window_s` after it."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._by_step: dict[str, WrittenRenewal] = {}
        self._step_of_task: dict[str, str] = {}  # a task has one leased step at a time
        self._swept_at = float("-inf")

    def __len__(self) -> int:
        return len(self._by_step)

    def answer(
        self, step_id: str, fence: int, token_id: str | None, pool: str | None, now: float
    ) -> Renewal | None:
        """The answer for this lease from the last write, if that was less than `window_s`
        ago (by `now`, the supervisor's clock); else None: the renewal must be written."""
        held = self._by_step.get(step_id)
        if (
            held is None
            or held.deadline is None
            or (held.fence, held.token_id, held.pool) != (fence, token_id, pool)
            or not held.at <= now < held.at + self.window_s
        ):
            return None
        return Renewal(
            ttl_s=held.deadline - now,
            renew_every_s=held.renewal.renew_every_s,
            cancelled=False,
            budget_exhausted=held.renewal.budget_exhausted,
        )

    def committed(self, values: Iterable[object], touched_tasks: Iterable[str]) -> None:
        """One durable batch: remember the renewals among its rules' `values`, then forget
        every task it gave an event. Call it before any other request can run."""
        for value in values:
            if isinstance(value, WrittenRenewal):
                self._remember(value)
        self.forget(touched_tasks)

    def forget(self, task_ids: Iterable[str]) -> None:
        """Something happened to these tasks: none of their renewals is answered from memory."""
        for task_id in task_ids:
            step_id = self._step_of_task.pop(task_id, None)
            if step_id is not None:
                self._by_step.pop(step_id, None)

    def forget_all(self) -> None:
        self._by_step.clear()
        self._step_of_task.clear()

    def _remember(self, written: WrittenRenewal) -> None:
        self._sweep(written.at)
        if written.deadline is None or written.renewal.cancelled:
            return
        self._by_step[written.step_id] = written
        self._step_of_task[written.task_id] = written.step_id

    def _sweep(self, now: float) -> None:
        """Drop entries past their window, at most once a window: memory stays as large as
        the leases renewed within one window."""
        if now - self._swept_at < self.window_s:
            return
        self._swept_at = now
        for step_id, held in list(self._by_step.items()):
            if now >= held.at + self.window_s:
                del self._by_step[step_id]
                if self._step_of_task.get(held.task_id) == step_id:
                    del self._step_of_task[held.task_id]
