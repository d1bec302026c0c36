"""The ledger's store: the rules behind one writer thread with group commit, over SQLite or
PostgreSQL (`backends`).

Rules queue up while a batch is being committed; the writer takes every waiting rule into the
next batch (one transaction, one fsync) and returns to each caller once that batch is durable
(`writer.Writer`). One class serves both storages; what differs is the `Backend` it is given.

PostgreSQL (`postgres.PostgresBackend`), several supervisors on one database: each runs its
own writer; their batches are serialized by a transaction-scoped advisory lock taken right
after BEGIN, in READ COMMITTED, so every rule keeps the one-writer reasoning it was written
with (read, decide, write) and the event journal's `seq` becomes visible in commit order (a
watcher reading `seq > after` never skips a lower seq committed later). A batch holds the
lock for the milliseconds it runs. Fences come from the database sequence `fences`, so they
never repeat whichever supervisor grants them. A batch that woke anything says so with
`pg_notify` inside its transaction; every supervisor listens and wakes its own long-polls.

Reads stay synchronous functions over `TypedReads` (the rules call the same helpers inside
their transactions): one worker-thread hop per read function, on SQLite's read-only
connection or a small psycopg pool, rather than aiosqlite or async psycopg with one await
per query (a departure from the design's aiosqlite for reads). bench/readpath.py measured a
task view of 14 queries on the 2-core machine, per view, one at a time / 8 at a time / CPU:
SQLite, one hop 178 / 183 / 181 us, aiosqlite 703-940 / 1696 / 724-744 us; PostgreSQL, one
hop 1.3-2.7 / 1.3-1.4 / 0.8-0.9 ms, async psycopg (a pool as large) 1.9-3.4 / 2.0-2.1 /
1.05-1.14 ms. A hop per query costs more than a hop per view.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections import defaultdict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import anyio

from tether.broadcast import Broadcast
from tether.clocks import WallClock
from tether.supervisor.ledger import (
    artifacts,
    checkpoints,
    effects,
    fencing,
    identity,
    invariants,
    logs,
    operator,
    outbox_delivery,
    outbox_gates,
    prefixes,
    reaper,
    repositories,
    tokens,
    ui_sessions,
    views,
)
from tether.supervisor.ledger.backend_protocol import EVERYTHING, Backend, Reads, Wakeup
from tether.supervisor.ledger.backends import SqliteBackend, open_backend
from tether.supervisor.ledger.batch import BatchResult, RuleOutcome, Transactions, random_id
from tether.supervisor.ledger.counts import LedgerCounts
from tether.supervisor.ledger.decisions import log_decisions
from tether.supervisor.ledger.errors import LedgerError, Refused, StorageError
from tether.supervisor.ledger.outbox import Answer, Outgoing
from tether.supervisor.ledger.renewal_memory import RenewalMemory
from tether.supervisor.ledger.tx import ALL_POOLS, EFFECTS, LedgerConfig, Tx, TypedReads
from tether.supervisor.ledger.verification import Evidence
from tether.supervisor.ledger.views import RunnerRow, TaskSearch
from tether.supervisor.ledger.writer import Writer
from tether.wire import Outcome as ResultOutcome
from tether.wire import ReleaseReason
from tether.wire.answers import ReviewRecord
from tether.wire.records import (
    Budget,
    Checkpoint,
    Checkpointed,
    Event,
    Lease,
    LogLine,
    LogLinesKept,
    PoolStatus,
    Renewal,
    Report,
    TaskDetail,
    TaskLogs,
    TaskPage,
)

T = TypeVar("T")

MAX_BATCH = 512


class LedgerStore:
    """The ledger over one `Backend`. Use `async with open_ledger(db) as ledger` (or
    `SqliteLedger.open(path)`)."""

    max_batch: ClassVar[int] = MAX_BATCH  # rules per transaction at most

    def __init__(
        self,
        backend: Backend,
        *,
        config: LedgerConfig | None = None,
        clock: WallClock = time.time,
        new_id: Callable[[], str] = random_id,
    ) -> None:
        self.backend = backend
        self.config = config or LedgerConfig()
        self.clock = clock
        self.new_id = new_id
        self.counters = LedgerCounts()
        self.renewals = RenewalMemory(self.config.renew_every_s / 2)
        # One wake-up per pool: work queued for one pool never wakes the others' claims.
        self._work: defaultdict[str, Broadcast] = defaultdict(Broadcast)
        self._events = Broadcast()
        self._effects = Broadcast()  # fired when an effect may be ready to take
        self._reads: Reads | None = None
        self._writer: Writer | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Self]:
        """Open (check integrity, migrate), listen for other supervisors' commits, refresh
        open leases, and start the writer; close all of it when the block ends."""
        backend = self.backend
        write_db = await anyio.to_thread.run_sync(backend.open_writer)
        transactions = Transactions(
            db=write_db, config=self.config, clock=self.clock, new_id=self.new_id, backend=backend
        )
        try:
            async with backend.reads() as reads, backend.listen(self._heard):
                self._reads = reads
                writer = Writer(transactions.run, self._committed, max_batch=self.max_batch)
                self._writer = writer
                try:
                    async with anyio.create_task_group() as tg:
                        # If the writer dies, its error cancels this block and is raised here.
                        tg.start_soon(writer.run)
                        try:
                            await self.write(reaper.refresh_after_restart)
                            yield self
                        finally:
                            writer.close()  # the task group waits for queued rules to commit
                finally:
                    self._reads = None
        finally:
            # `transactions.db`: the writer may have replaced a lost connection.
            await anyio.to_thread.run_sync(lambda: backend.close_writer(transactions.db))

    @property
    def is_open(self) -> bool:
        """True from `open` until the ledger closes (on purpose, or because its writer died)."""
        writer = self._writer
        return self._reads is not None and writer is not None and writer.accepting

    # -- the writer -------------------------------------------------------------------------

    def _committed(self, outcomes: Sequence[RuleOutcome], result: BatchResult) -> None:
        """After a batch's callers are answered (on the event loop): count it, wake the
        long-polls it may concern, and log its decisions."""
        self.counters.batches += 1
        self.counters.batched_rules += len(outcomes)
        lost = False
        for outcome in outcomes:
            if isinstance(outcome.error, Refused):
                self.counters.rejections[outcome.error.code] += 1
            lost = lost or isinstance(outcome.error, StorageError)
        if lost:
            # The batch may have committed with its answer lost (the connection dropped after
            # COMMIT): it tells nothing of what it woke, and this process's listener drops
            # its own notification. A spurious wake-up costs a look; a missed one, a wait.
            self.renewals.forget_all()
            self._fire(EVERYTHING)
        else:
            # Before any other request runs: a renewal after a cancel is written, not recalled.
            self.renewals.committed((o.value for o in outcomes), result.touched_tasks)
            self._fire(Wakeup(frozenset(result.woken_pools), bool(result.touched_tasks)))
        # Here, not in the rules: only a committed decision is logged.
        log_decisions(result.notes)

    def _heard(self, wakeup: Wakeup) -> None:
        """Another supervisor's commit: its events may be about a task whose renewals this one
        remembers (a cancel on a shared database), so it forgets them all."""
        if wakeup.events:
            self.renewals.forget_all()
        self._fire(wakeup)

    def _fire(self, wakeup: Wakeup) -> None:
        """Wake the claims, event watches and the dispatcher that `wakeup` concerns: after
        this store's own commits, and another supervisor's (`Backend.listen`)."""
        woken = wakeup.pools
        if EFFECTS in woken:
            self._effects.fire()
        for pool in list(self._work) if ALL_POOLS in woken else woken - {EFFECTS}:
            if pool in self._work:  # a pool nobody waits on needs no Broadcast made for it
                self._work[pool].fire()
        if wakeup.events:
            self._events.fire()

    async def write(self, rule: Callable[[Tx], T]) -> T:
        """Run one rule in the next group-commit batch; return once it is durable."""
        value: T = _value(await self._queue(rule))
        return value

    def _queue(self, rule: Callable[[Tx], object]) -> asyncio.Future[RuleOutcome]:
        """`rule` queued for the next group-commit batch now: a rule queued after it runs
        after it, in the same batch or a later one."""
        if self._writer is None:
            raise RuntimeError("the ledger is not open")
        return self._writer.submit(rule)

    async def read(self, query: Callable[[TypedReads], T]) -> T:
        """Run `query` on committed data, beside the writer (`Backend.reads`)."""
        reads = self._reads
        if reads is None:
            raise RuntimeError("the ledger is not open")
        return await reads.run(query)

    # -- operators ----------------------------------------------------------------------------

    async def create_task(self, spec: identity.TaskSpec) -> identity.Created:
        return await self.write(lambda tx: identity.create_task(tx, spec))

    async def approve(
        self,
        tenant: str,
        task_id: str,
        plan_hash: str,
        base_sha: str | None,
        observed_head: str | None = None,
    ) -> None:
        await self.write(
            lambda tx: operator.approve(tx, tenant, task_id, plan_hash, base_sha, observed_head)
        )

    async def binding_of_task(self, tenant: str, task_id: str) -> repositories.Binding | None:
        return await self.read(lambda db: repositories.binding_of_task(db, tenant, task_id))

    async def binding_of_step(self, step_id: str, pool: str | None) -> repositories.Binding | None:
        return await self.read(lambda db: repositories.binding_of_step(db, step_id, pool))

    async def binding_of_lease(
        self, step_id: str, fence: int, token_id: str | None, pool: str | None
    ) -> repositories.Binding | None:
        return await self.read(
            lambda db: fencing.binding_of_lease(db, step_id, fence, token_id, pool)
        )

    async def committed_candidates(self, url: str) -> list[repositories.Candidate]:
        return await self.read(lambda db: repositories.committed_candidates(db, url))

    async def cancel(self, tenant: str, task_id: str, reason: str) -> None:
        await self.write(lambda tx: operator.cancel(tx, tenant, task_id, reason))

    async def set_repository_head(self, tenant: str, repository: str, sha: str) -> None:
        await self.write(lambda tx: operator.set_repository_head(tx, tenant, repository, sha))

    async def record_review(self, tenant: str, task_id: str, decision: str, note: str) -> None:
        await self.write(lambda tx: operator.record_review(tx, tenant, task_id, decision, note))

    async def set_budget(self, tenant: str, tokens_: int | None) -> None:
        await self.write(lambda tx: operator.set_budget(tx, tenant, tokens_))

    async def set_verify_pool(self, tenant: str, pool: str | None) -> None:
        await self.write(lambda tx: operator.set_verify_pool(tx, tenant, pool))

    # -- runners ------------------------------------------------------------------------------

    async def claim(
        self,
        runner_id: str,
        pool: str,
        capacity: int,
        wait_s: float,
        *,
        token_id: str | None = None,
        kinds: Collection[str] = ("chat",),
    ) -> list[Lease]:
        """Grant leases now, or wait up to `wait_s` for work to be queued. `token_id` is the
        claiming runner token's, recorded on each attempt; only steps of `kinds`, the kinds
        the runner serves, are granted.

        Cancelling a claim (its client went away, the server is draining) takes effect only
        while it waits: a grant already on its way to the writer is seen through and returned,
        so no lease is granted to a caller that stopped listening mid-write.
        """
        deadline = anyio.current_time() + max(0.0, wait_s)
        while True:
            armed = self._work[pool].armed()
            with anyio.CancelScope(shield=True):
                leases = await self.write(
                    lambda tx: fencing.claim(
                        tx, runner_id, pool, capacity, token_id=token_id, kinds=kinds
                    )
                )
            remaining = deadline - anyio.current_time()
            if leases or remaining <= 0:
                self.counters.leases_granted += len(leases)
                return leases
            await self._work[pool].wait(armed, remaining)

    async def claim_after(
        self,
        reported: Sequence[tuple[str, int]],
        runner_id: str,
        pool: str,
        want: int,
        *,
        token_id: str | None = None,
        kinds: Collection[str] = ("chat",),
    ) -> list[Lease]:
        """Eager dispatch: up to `want` leases granted after the results `reported` (step id,
        fence), none unless one of them is committed (`fencing.claim_after_results`). Never
        waits for work. `queue_claim_after` queues it right behind the reports instead."""
        with anyio.CancelScope(shield=True):  # as `claim`: a grant on its way is seen through
            leases = await self.queue_claim_after(
                reported, runner_id, pool, want, token_id=token_id, kinds=kinds
            )
        return leases

    def queue_claim_after(
        self,
        reported: Sequence[tuple[str, int]],
        runner_id: str,
        pool: str,
        want: int,
        *,
        token_id: str | None = None,
        kinds: Collection[str] = ("chat",),
    ) -> Awaitable[list[Lease]]:
        """`claim_after`, queued for the next batch now, before this returns: queued right
        after `queue_reports`, it runs after those reports in their batch. Await the answer
        for the leases (or the `LedgerError` it raises); the rule runs even if nobody does."""
        future = self._queue(
            lambda tx: fencing.claim_after_results(
                tx, reported, runner_id, pool, want, token_id=token_id, kinds=kinds
            )
        )
        return _Later(lambda: self._granted(future))

    async def _granted(self, future: asyncio.Future[RuleOutcome]) -> list[Lease]:
        leases: list[Lease] = _value(await future)
        self.counters.leases_granted += len(leases)
        return leases

    async def renew(
        self, step_id: str, fence: int, pool: str | None = None, *, token_id: str | None = None
    ) -> Renewal:
        """`fencing.renew`, or the answer of this lease's last renewal written when it was
        less than half a renew interval ago (`RenewalMemory`): no write, the same deadline."""
        remembered = self.renewals.answer(step_id, fence, token_id, pool, self.clock())
        if remembered is not None:
            self.counters.leases_renewed += 1
            self.counters.renewals_remembered += 1
            return remembered
        written = await self.write(
            lambda tx: fencing.renew_lease(tx, step_id, fence, pool, token_id=token_id)
        )
        self.counters.leases_renewed += 1
        return written.renewal

    async def release(
        self,
        step_id: str,
        fence: int,
        reason: ReleaseReason,
        retryable: bool,
        detail: str,
        pool: str | None = None,
        usage: Mapping[str, int] | None = None,
        *,
        token_id: str | None = None,
    ) -> None:
        await self.write(
            lambda tx: fencing.release(
                tx, step_id, fence, reason, retryable, detail, pool, usage, token_id=token_id
            )
        )
        self.counters.leases_released += 1
        if reason is ReleaseReason.PREEMPTED:
            self.counters.leases_preempted += 1

    async def report(
        self,
        rep: Report,
        pool: str | None = None,
        evidence: Evidence | None = None,
        *,
        token_id: str | None = None,
    ) -> ResultOutcome:
        outcome = await self.write(
            lambda tx: effects.report(tx, rep, pool, evidence, token_id=token_id)
        )
        self.counters.commits[outcome] += 1
        return outcome

    def queue_reports(
        self,
        reports: Sequence[tuple[Report, Evidence | None]],
        pool: str | None = None,
        *,
        token_id: str | None = None,
    ) -> Awaitable[list[ResultOutcome | LedgerError]]:
        """`report` for each of `reports` (with its evidence), queued for the next batch now,
        in order, before this returns: a rule queued after it runs after them. Await the
        answer for each one's outcome, or the `LedgerError` that refused it, once their batch
        is durable. One future per report instead of one task each: a batch of results is
        the runner's usual request (bench/README.md, issue 28)."""
        futures = [
            self._queue(
                functools.partial(
                    effects.report, rep=rep, pool=pool, evidence=ev, token_id=token_id
                )
            )
            for rep, ev in reports
        ]
        return _Later(lambda: self._reported(futures))

    async def _reported(
        self, futures: list[asyncio.Future[RuleOutcome]]
    ) -> list[ResultOutcome | LedgerError]:
        found: list[ResultOutcome | LedgerError] = []
        for future in futures:
            outcome = await future
            if outcome.error is None:
                self.counters.commits[outcome.value] += 1
                found.append(outcome.value)
            elif isinstance(outcome.error, LedgerError):
                found.append(outcome.error)
            else:
                raise outcome.error
        return found

    async def checkpoint(
        self, step_id: str, cp: Checkpoint, pool: str | None = None, *, token_id: str | None = None
    ) -> Checkpointed:
        return await self.write(
            lambda tx: checkpoints.checkpoint(tx, step_id, cp, pool, token_id=token_id)
        )

    async def keep_log_lines(
        self, lines: Sequence[LogLine], pool: str, token_id: str
    ) -> LogLinesKept:
        return await self.write(lambda tx: logs.keep(tx, lines, pool, token_id))

    async def expire(self) -> int:
        reaped = await self.write(reaper.expire)
        self.counters.leases_expired += reaped
        return reaped

    async def next_deadline(self) -> float | None:
        return await self.write(reaper.next_deadline)

    # -- effects: the dispatcher ------------------------------------------------------------

    async def take_effects(self, holder: str, limit: int) -> list[Outgoing]:
        """Take up to `limit` effects to deliver (lapsed holds first): `outbox_delivery.take`."""
        return await self.write(lambda tx: outbox_delivery.take(tx, holder, limit))

    async def begin_attempt(self, effect_id: str, holder: str, digest: str) -> int:
        """Record that an attempt is about to be sent; return its number."""
        return await self.write(
            lambda tx: outbox_delivery.begin_attempt(tx, effect_id, holder, digest)
        )

    async def record_attempt(
        self, effect_id: str, attempt: int, holder: str, answer: Answer
    ) -> None:
        await self.write(
            lambda tx: outbox_delivery.record_attempt(tx, effect_id, attempt, holder, answer)
        )

    async def give_up(self, effect_id: str, holder: str, reason: str) -> None:
        await self.write(lambda tx: outbox_delivery.give_up(tx, effect_id, holder, reason))

    async def release_effect(self, effect_id: str, holder: str) -> None:
        await self.write(lambda tx: outbox_delivery.release(tx, effect_id, holder))

    async def wait_for_effects(self, timeout_s: float) -> None:
        """Return when an effect may have become ready to take, or after `timeout_s`."""
        armed = self._effects.armed()
        await self._effects.wait(armed, max(0.0, timeout_s))

    # -- effects: the operator --------------------------------------------------------------

    async def open_gate(
        self, tenant: str, task_id: str, step_name: str, digest: str, by: str
    ) -> None:
        await self.write(
            lambda tx: outbox_gates.open_gate(tx, tenant, task_id, step_name, digest, by)
        )

    async def resolve_effect(
        self, tenant: str, task_id: str, step_name: str, happened: bool, by: str
    ) -> None:
        await self.write(
            lambda tx: outbox_gates.resolve(tx, tenant, task_id, step_name, happened, by)
        )

    # -- reads --------------------------------------------------------------------------------

    async def resolve_task_id(self, tenant: str, given: str) -> str:
        """The full id of the tenant's task `given` names, by its id or a unique prefix."""
        return await self.read(lambda db: prefixes.resolve_task_id(db, tenant, given))

    async def task(self, task_id: str, tenant: str | None = None) -> TaskDetail:
        now = self.clock()
        return await self.read(lambda db: views.task_view(db, task_id, tenant, now=now))

    async def list_tasks(
        self,
        tenant: str,
        state: str | None,
        cursor: int | None,
        limit: int,
        search: TaskSearch | None = None,
    ) -> TaskPage:
        now = self.clock()
        return await self.read(
            lambda db: views.list_tasks(db, tenant, state, cursor, limit, now=now, search=search)
        )

    async def events(
        self, task_id: str, tenant: str | None, after: int, wait_s: float
    ) -> list[Event]:
        """Events after `after`; if none yet, wait up to `wait_s` for one."""
        await self.task_exists(task_id, tenant)
        deadline = anyio.current_time() + max(0.0, wait_s)
        while True:
            armed = self._events.armed()
            found = await self.read(lambda db: views.events_after(db, task_id, after))
            remaining = deadline - anyio.current_time()
            if found or remaining <= 0:
                return found
            await self._events.wait(armed, remaining)

    async def task_log(
        self, task_id: str, tenant: str | None, after_seq: int, after_line: int
    ) -> TaskLogs:
        return await self.read(lambda db: logs.task_log(db, task_id, tenant, after_seq, after_line))

    async def task_exists(self, task_id: str, tenant: str | None) -> None:
        await self.read(lambda db: views._task_row(db, tenant, task_id))

    async def review(self, task_id: str, tenant: str | None = None) -> ReviewRecord:
        return await self.read(lambda db: views.review(db, task_id, tenant))

    async def queue_depth(self) -> dict[str, int]:
        return await self.read(views.queue_depth)

    async def pools(self, also: Collection[str] = ()) -> list[PoolStatus]:
        now = self.clock()
        return await self.read(lambda db: views.pool_status(db, now, also))

    async def runners(self) -> list[RunnerRow]:
        now = self.clock()
        return await self.read(lambda db: views.runners(db, now))

    async def budget(self, tenant: str) -> Budget:
        return await self.read(lambda db: operator.budget_of(db, tenant))

    async def budgets(self) -> list[Budget]:
        return await self.read(operator.all_budgets)

    async def violations(self) -> list[str]:
        return await self.read(invariants.find_violations)

    # -- artifacts ----------------------------------------------------------------------------

    async def artifact_upload(
        self, who: tokens.Principal, lease: tuple[str, int] | None
    ) -> artifacts.Upload:
        now = self.clock()
        return await self.read(lambda db: artifacts.upload_tenant(db, who, lease, now))

    async def artifact_bytes_kept(self, who: tokens.Principal, besides: str) -> int:
        return await self.read(lambda db: artifacts.bytes_kept(db, who, besides))

    async def record_artifact(
        self,
        digest: str,
        size: int,
        who: tokens.Principal,
        upload: artifacts.Upload | None = None,
        quota: int | None = None,
    ) -> bool:
        """Record `who`'s upload of `digest` for `upload` (by default: an operator's tenant, a
        runner's no tenant), within `quota` bytes (by default none)."""
        made = upload or artifacts.Upload(
            tenant=who.scope if who.role is tokens.Role.OPERATOR else artifacts.NO_TENANT
        )
        limit = quota if quota is not None else sys.maxsize
        return await self.write(
            lambda tx: artifacts.record_upload(tx, digest, size, who, made, limit)
        )

    async def artifact_owners(self, digest: str) -> list[artifacts.ArtifactOwner]:
        return await self.read(lambda db: artifacts.owners(db, digest))

    async def artifact_owned(self, digest: str) -> bool:
        return await self.read(lambda db: artifacts.owned(db, digest))

    async def verifies_bundle(self, digest: str, pool: str) -> bool:
        return await self.read(lambda db: artifacts.verified_in_pool(db, digest, pool))

    async def forget_unreferenced_artifacts(
        self, uploaded_before: float, limit: int
    ) -> artifacts.Forgotten:
        return await self.write(
            lambda tx: artifacts.forget_unreferenced(tx, uploaded_before, limit)
        )

    # -- the status page's sessions ---------------------------------------------------------

    async def start_ui_session(self, operator: tokens.Principal, ttl_s: float) -> str:
        return await self.write(lambda tx: ui_sessions.start(tx, operator, ttl_s))

    async def ui_session(self, session_id: str) -> tokens.Principal | None:
        now = self.clock()
        return await self.read(lambda db: ui_sessions.operator_of(db, session_id, now))

    async def end_ui_session(self, session_id: str) -> None:
        await self.write(lambda tx: ui_sessions.end(tx, session_id))

    # -- tokens -------------------------------------------------------------------------------

    async def authenticate(self, secret: str) -> tokens.Principal | None:
        """The principal behind `secret`; writes the token's last use when it is a minute old."""
        found = await self.read(lambda db: tokens.authenticate(db, secret))
        if found is not None and tokens.use_is_stale(found, self.clock()):
            await self.write(lambda tx: tokens.note_use(tx, found.token_id))
        return found

    async def create_token(self, scope: str, role: str) -> tokens.NewToken:
        return await self.write(lambda tx: tokens.create_token(tx, scope, role))

    async def revoke_token(self, token_id: str) -> None:
        await self.write(lambda tx: tokens.revoke_token(tx, token_id))


class _Later(Awaitable[T]):
    """An awaitable whose coroutine is made only when it is awaited: one never awaited (its
    request failed first) leaves no coroutine unawaited behind."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._make = make

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()


def _value(outcome: RuleOutcome) -> Any:
    """A rule's value, or the error it raised."""
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


class SqliteLedger(LedgerStore):
    """The ledger over one SQLite file. Use `async with SqliteLedger.open(path) as ledger`."""

    def __init__(
        self,
        path: Path | str,
        *,
        config: LedgerConfig | None = None,
        clock: WallClock = time.time,
        synchronous: str = "FULL",
        new_id: Callable[[], str] = random_id,
    ) -> None:
        self.path = Path(path)
        self.synchronous = synchronous
        super().__init__(
            SqliteBackend(self.path, synchronous), config=config, clock=clock, new_id=new_id
        )

    @classmethod
    def open(cls, path: Path | str, **kwargs: Any) -> AbstractAsyncContextManager[Self]:
        """Check integrity, migrate, refresh open leases, and start the writer."""
        return cls(path, **kwargs).running()


def open_ledger(
    db: str | Path, *, synchronous: str = "FULL", **kwargs: Any
) -> AbstractAsyncContextManager[LedgerStore]:
    """The ledger `--db` names, opened for an `async with`: a path or `sqlite:///path` is a
    `SqliteLedger`, `postgresql://...` a store on PostgreSQL; anything else raises
    `LedgerUrlError` with the line to print (`backends.open_backend`)."""
    backend = open_backend(db, synchronous=synchronous)
    if isinstance(backend, SqliteBackend):
        return SqliteLedger(backend.path, synchronous=synchronous, **kwargs).running()
    return LedgerStore(backend, **kwargs).running()
