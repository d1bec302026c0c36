"""`Writer`: the ledger's one writer thread and the event-loop side of group commit.

Rules wait on the event loop while a batch commits. Once that batch is answered, and then
once no new rule arrived during a full turn of the loop (callers woken by the last batch
queue their next rule only once they run), every waiting rule (up to `max_batch`) goes to the
thread as one batch: one transaction, one fsync (`batch.execute_batch`, docs/design.md, The
ledger on disk). The thread answers the loop once per batch, after `COMMIT` returned; only
then does each caller get its outcome. One batch is in flight at a time. A rule, once
submitted, runs even if its caller is cancelled while it waits.

Departure from anyio (the project's named async library): the thread is a plain
`threading.Thread` fed by a `queue.SimpleQueue`; it answers with one
`loop.call_soon_threadsafe` per batch, and each rule waits on an `asyncio.Future`. Measured on
the 2-core bench machine (a batch of 8 rules whose work is free, CPU per batch, median of 5):
`anyio.to_thread.run_sync` plus an `anyio.Event` per rule 223 us; a dedicated thread calling
back through anyio's `from_thread` portal 187 us; this 84 us. Under load the anyio hop
(its worker queue's `Condition.notify`, a task and cancel scopes per hop) was the largest
single cost of the supervisor per step (bench/cpu.py's profile). The supervisor runs only on
anyio's asyncio backend, whose tasks and futures these are.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence

import anyio

from tether.supervisor.ledger.batch import BatchResult, Rule, RuleOutcome
from tether.supervisor.ledger.errors import StorageError

Committed = Callable[[Sequence[RuleOutcome], BatchResult], None]


class _Pending:
    """One rule waiting for its batch, and the future its caller awaits."""

    __slots__ = ("future", "rule")

    def __init__(self, rule: Rule, future: asyncio.Future[RuleOutcome]) -> None:
        self.rule = rule
        self.future = future


_Job = tuple[list[Rule], asyncio.Future[BatchResult]]


class Writer:
    """Runs batches of rules with `run_batch` on its own thread, in the order they were
    submitted, while `run` (a task of the ledger's) gathers and answers them.

    `committed` is called on the event loop with each batch's outcomes once its callers are
    answered (the store counts, wakes long-polls and logs decisions there). If `run_batch`
    or `committed` raises, the batch's callers and every rule still waiting get a
    `StorageError`, nothing more is accepted, and `run` raises that error.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[Rule]], BatchResult],
        committed: Committed,
        *,
        max_batch: int,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._committed = committed
        self._max_batch = max_batch
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._waiting: list[_Pending] = []
        self._arrived: asyncio.Future[None] | None = None  # set while `run` waits for rules
        self._closing = False
        self._dead = False

    @property
    def accepting(self) -> bool:
        return not self._closing and not self._dead

    def submit(self, rule: Rule) -> asyncio.Future[RuleOutcome]:
        """Queue `rule` for the next batch; the future resolves once that batch is durable."""
        if not self.accepting:
            raise RuntimeError("the ledger is not open")
        future: asyncio.Future[RuleOutcome] = self._loop.create_future()
        self._waiting.append(_Pending(rule, future))
        self._wake()
        return future

    def close(self) -> None:
        """Refuse new rules; `run` returns once every queued one is committed."""
        self._closing = True
        self._wake()

    def _wake(self) -> None:
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    async def run(self) -> None:
        """Gather, send and answer batches until `close`; then stop the thread. Shielded:
        shutdown drains, and a batch in flight is always answered."""
        thread = threading.Thread(target=self._work, name="ledger-writer", daemon=True)
        thread.start()
        try:
            with anyio.CancelScope(shield=True):
                while self._waiting or not self._closing:
                    if not self._waiting:
                        self._arrived = self._loop.create_future()
                        await self._arrived
                        self._arrived = None
                        continue
                    await self._settle()
                    batch = self._waiting[: self._max_batch]
                    del self._waiting[: self._max_batch]
                    await self._commit(batch)
        finally:
            self._jobs.put(None)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join)

    async def _settle(self) -> None:
        """Yield to the loop until a turn of it brings no new rule (or the batch is full)."""
        seen = -1
        while seen != len(self._waiting) and len(self._waiting) < self._max_batch:
            seen = len(self._waiting)
            await asyncio.sleep(0)

    async def _commit(self, batch: list[_Pending]) -> None:
        answered: asyncio.Future[BatchResult] = self._loop.create_future()
        self._jobs.put(([p.rule for p in batch], answered))
        try:
            result = await answered
            for pending, outcome in zip(batch, result.outcomes, strict=True):
                if not pending.future.done():  # its caller may have been cancelled meanwhile
                    pending.future.set_result(outcome)
            self._committed(result.outcomes, result)
        except BaseException as exc:
            self._die(batch, exc)
            raise

    def _die(self, batch: list[_Pending], exc: BaseException) -> None:
        """Answer the failed batch and every waiting rule with a `StorageError`."""
        self._dead = True
        failure = StorageError(f"the ledger's writer stopped: {exc}")
        failure.__cause__ = exc
        for pending in [*batch, *self._waiting]:
            if not pending.future.done():
                pending.future.set_result(RuleOutcome(error=failure))
        self._waiting.clear()

    # -- the thread ---------------------------------------------------------------------

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            rules, answered = job
            try:
                result = self._run_batch(rules)
            except BaseException as exc:
                self._loop.call_soon_threadsafe(answered.set_exception, exc)
                return
            self._loop.call_soon_threadsafe(answered.set_result, result)
