"""What every grant goes through before the runner gets it, a claim's or an eager one's
(`hand_out`), and the eager grant a result asks for (`EagerGrant`). A grant reads the head of
each repository it granted a step of, so no step runs on a base that moved since the last
report (`on_current_heads`; docs/design.md, Verification).
"""

from __future__ import annotations

from collections.abc import Awaitable

import anyio
import structlog

from tether.git import redact
from tether.supervisor import tracing
from tether.supervisor.ledger import Lease, LedgerError
from tether.supervisor.ledger.repositories import Binding
from tether.supervisor.repos.evidence import RepositoryUnavailable, read_head
from tether.supervisor.usecases.parts import Parts
from tether.wire.records import WantLeases

log = structlog.get_logger("tether.api")


async def hand_out(parts: Parts, leases: list[Lease], runner_id: str, pool: str) -> list[Lease]:
    """`leases` as the answer carries them: the unbound steps noted, the grant spans, and the
    leases whose base moved left out."""
    if not leases:
        return leases
    parts.unbound.granted(leases)
    with tracing.Grants(leases, runner_id=runner_id, pool=pool) as grants:
        return grants.sent(await on_current_heads(parts, leases, pool))


class EagerGrant:
    """The leases a result request's `want` asks for (eager dispatch, docs/design.md, Runner
    API): `queue` queues the claim rule right after the request's reports, so it runs in their
    group-commit batch; `leases` are then what the runner gets. A supervisor draining for
    shutdown grants none, as its claims do."""

    def __init__(
        self, parts: Parts, want: WantLeases | None, pool: str, token_id: str, *, draining: bool
    ) -> None:
        self._parts = parts
        self._want = None if want is None or want.leases < 1 or draining else want
        self._pool = pool
        self._token_id = token_id
        self.leases: list[Lease] = []
        self._queued: Awaitable[list[Lease]] | None = None

    def queue(self, reported: list[tuple[str, int]]) -> None:
        """Queue the claim rule for the next batch now: called right after the reports are
        queued (`LedgerStore.queue_reports`), it runs after them in their batch; `sent` waits
        for it."""
        want = self._want
        if want is not None and reported:
            self._queued = self._parts.ledger.queue_claim_after(
                reported,
                want.runner_id,
                self._pool,
                want.leases,
                token_id=self._token_id,
                kinds=want.kinds,
            )

    async def sent(self) -> tuple[Lease, ...]:
        """The granted leases as the answer carries them (`hand_out`)."""
        if self._want is None:
            return ()
        queued, self._queued = self._queued, None
        if queued is not None:
            try:
                with anyio.CancelScope(shield=True):  # as `claim_after`: seen through
                    self.leases = await queued
            except LedgerError as exc:
                log.warning("eager grant failed", code=exc.code.value, detail=exc.detail)
        leases = await hand_out(self._parts, self.leases, self._want.runner_id, self._pool)
        return tuple(leases)


async def on_current_heads(parts: Parts, leases: list[Lease], pool: str) -> list[Lease]:
    """`leases` without those whose repository's head is no longer their approved base
    (docs/design.md, Verification): each repository a lease names is read once (`git
    ls-remote`, all at once) and its head recorded, which fails every approved task on
    another base `stale_base` at once; a left-out lease's step is no longer the runner's,
    and the lease lapses unused. Leases without a repository cost nothing here.

    A remote that cannot be read now does not hold the step back: its leases are handed out
    and one warning is logged; the step's result reads the head again before the ledger
    judges it, so a moved base is still caught, one step later.
    """
    bound = [lease for lease in leases if lease.repository is not None]
    if not bound:
        return leases
    ledger = parts.ledger
    named: dict[tuple[str, str], Binding] = {}  # by tenant and repository name
    heads: dict[str, str] = {}  # by URL, for the remotes that answered

    async def bind(lease: Lease) -> None:
        binding = await ledger.binding_of_step(lease.step_id, pool)
        if binding is not None:
            named.setdefault((binding.tenant, binding.repository), binding)

    async def read(url: str, binding: Binding) -> None:
        try:
            heads[url] = await read_head(parts.mirrors, binding)
        except RepositoryUnavailable as exc:
            log.warning(
                "head not read at grant",
                repository=binding.repository,
                url=redact(url),
                detail=exc.detail,
            )

    async with anyio.create_task_group() as tg:
        for lease in bound:
            tg.start_soon(bind, lease)
    async with anyio.create_task_group() as tg:
        for url, binding in {b.url: b for b in named.values()}.items():
            tg.start_soon(read, url, binding)
    async with anyio.create_task_group() as tg:
        for (tenant, repository), binding in named.items():
            if binding.url in heads:
                tg.start_soon(ledger.set_repository_head, tenant, repository, heads[binding.url])
    return [
        lease
        for lease in leases
        if lease.repository is None
        or lease.repository.url not in heads
        or heads[lease.repository.url] == lease.repository.base_sha
    ]
