"""The collector of unreferenced artifacts (docs/design.md, Artifacts): owner rows that no step
names (a result's artifact, bundle or check log, a checkpoint), older than
`artifact_keep_unreferenced_s` and whose step is not leased, are removed from the ledger, and
the bytes of each digest left with no row are removed from the store. `serve` runs it every
`artifact_collect_every_s`; each turn that removed anything is logged.

An upload of bytes the collector is removing must not end with an owner row and no bytes.
Both hold the digest's lock (`DigestLocks`) across their two steps: the collector across "no
row names it" and the removal, the upload across recording its row and making sure the bytes
are there (storing them again from its own copy when they are not). Between supervisors on one
PostgreSQL ledger the removal itself is conditional on no row naming the digest, in the one
statement that removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Final

import anyio
import structlog

from tether.clocks import WallClock
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import LedgerStore, StorageError

log = structlog.get_logger("tether.supervisor")

ROWS_PER_TURN: Final = 1000  # owner rows one ledger transaction removes


class DigestLocks:
    """One lock per digest in use, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, anyio.Lock] = {}

    @contextlib.asynccontextmanager
    async def hold(self, digest: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(digest, anyio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(digest, None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collected:
    """What one collection removed: owner rows, and digests' bytes with their total size."""

    rows: int = 0
    digests: int = 0
    bytes: int = 0


async def collect(
    ledger: LedgerStore, store: Artifacts, locks: DigestLocks, *, keep_s: float, now: float
) -> Collected:
    """Remove what nothing has named for `keep_s` before `now`; logged when anything went."""
    rows = digests = size = 0
    while True:
        forgotten = await ledger.forget_unreferenced_artifacts(now - keep_s, ROWS_PER_TURN)
        rows += forgotten.rows
        for digest, bytes_ in forgotten.digests.items():
            async with locks.hold(digest):
                if await ledger.artifact_owned(digest):  # uploaded again meanwhile
                    continue
                if await store.remove(digest):
                    digests += 1
                    size += bytes_
        if forgotten.rows < ROWS_PER_TURN:
            break
    collected = Collected(rows=rows, digests=digests, bytes=size)
    if rows:
        log.info("unreferenced artifacts collected", rows=rows, digests=digests, bytes=size)
    return collected


async def collect_forever(
    ledger: LedgerStore,
    store: Artifacts,
    locks: DigestLocks,
    *,
    keep_s: float,
    every_s: float,
    clock: WallClock,
) -> None:
    """`collect` every `every_s`, the first time `every_s` after the start. A storage error is
    logged and tried again next time, like the reaper's."""
    while True:
        await anyio.sleep(every_s)
        try:
            await collect(ledger, store, locks, keep_s=keep_s, now=clock())
        except (StorageError, OSError) as exc:
            log.error(  # noqa: TRY400 - the detail says it all; no traceback
                "the artifact collector failed; trying again later", error=str(exc)
            )
