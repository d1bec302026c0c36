"""PostgreSQL round trips per committed step (issue 28; target <= 12): what the ledger's one
writer thread sends the server for each step it commits, on its serialized connection.

The ledger runs in this process on a scratch database of the server (`LedgerStore` on its
PostgreSQL backend, the supervisor's own rules and writer), driven in the runner's shape
without HTTP: `workers` loops each claim one lease, then report its result with an eager
grant queued right behind it (`claim_after`, as `POST /v1/steps/results` does), so both rules
share a group-commit batch. While the loops run, psycopg's `Cursor.execute` and `executemany`
are wrapped here to count the calls made on the writer thread (`ledger-writer`): each is one
round trip (an `executemany` is pipelined by psycopg: counted once). The supervisor's code is
not touched. `python -m bench.pg_roundtrips [--steps N] [--workers W]` takes it alone.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg

from bench import pgdb as server
from bench.ledgers import PgLedger
from bench.report import round_trips_row
from tether.supervisor.ledger import Lease, Report
from tether.supervisor.ledger.store import open_ledger

WRITER_THREAD = "ledger-writer"  # tether.supervisor.ledger.writer names its thread so


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundTrips:
    steps: int
    round_trips: int
    by_kind: dict[str, int]  # BEGIN, COMMIT, SAVEPOINT/RELEASE, executemany, other statements
    seconds: float

    @property
    def per_step(self) -> float:
        return self.round_trips / self.steps if self.steps else 0.0


def _kind(query: Any, many: bool) -> str:
    if many:
        return "executemany"
    text = query if isinstance(query, str) else str(query)
    head = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
    if head in ("BEGIN;", "BEGIN"):
        return "begin"
    if head in ("COMMIT", "ROLLBACK"):
        return "commit"
    if head in ("SAVEPOINT", "RELEASE"):
        return "savepoint"
    return "statement"


@contextlib.contextmanager
def counted() -> Iterator[collections.Counter[str]]:
    """Count the writer thread's round trips by kind while entered."""
    seen: collections.Counter[str] = collections.Counter()
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counting_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == WRITER_THREAD:
            seen[_kind(query, False)] += 1
        return execute(self, query, *args, **kwargs)

    def counting_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == WRITER_THREAD:
            seen[_kind(query, True)] += 1
        return executemany(self, query, *args, **kwargs)

    psycopg.Cursor.execute = counting_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = counting_executemany  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]


async def _grant(ledger: Any, lease: Lease, runner: str, pool: str, out: list[Any]) -> None:
    """The eager grant queued behind `lease`'s result (`EagerGrant` in the results route)."""
    out.append(await ledger.claim_after([(lease.step_id, lease.fence)], runner, pool, 1))


async def _drive(ledger: Any, pool: str, workers: int) -> int:
    """Workers in the runner's shape until the queue is empty; the steps committed."""
    done = 0

    async def worker(n: int) -> None:
        nonlocal done
        runner = f"w{n}"
        leases: list[Lease] = await ledger.claim(runner, pool, 1, 0.0)
        while leases:
            lease = leases[0]
            report = Report(
                step_id=lease.step_id,
                fence=lease.fence,
                payload_hash=lease.payload_hash,
                output={"text": "ok"},
                usage={"total_tokens": 1},
            )
            granted: list[list[Lease]] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(ledger.report, report, pool)
                tg.start_soon(_grant, ledger, lease, runner, pool, granted)  # the same batch
            done += 1
            leases = granted[0]

    async with anyio.create_task_group() as tg:
        for n in range(workers):
            tg.start_soon(worker, n)
    return done


def measure(url: str, *, steps: int, workers: int = 64) -> RoundTrips:
    """Round trips per committed step on the server of `url`, in a scratch database."""
    pool = "roundtrips"
    with server.scratch(url, "roundtrips") as db:
        PgLedger(db).create_tasks(pool, steps, approve=True)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("ANALYZE")  # as bench.pg: the claim's plan on a fresh table

        async def main() -> RoundTrips:
            async with open_ledger(db) as ledger:
                with counted() as seen:
                    start = time.perf_counter()
                    done = await _drive(ledger, pool, workers)
                    seconds = time.perf_counter() - start
            return RoundTrips(
                steps=done, round_trips=sum(seen.values()), by_kind=dict(seen), seconds=seconds
            )

        return anyio.run(main)


def figures(r: RoundTrips, workers: int) -> dict[str, Any]:
    """The measurement as the bench's JSON keeps it."""
    return {**dataclasses.asdict(r), "per_step": r.per_step, "workers": workers}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.pg_roundtrips", description=__doc__.splitlines()[0]
    )
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--workers", type=int, default=64)
    args = p.parse_args(argv)
    from tether.logs import configure_logging

    configure_logging(json_lines=True, level="warning")
    url = server.server_url()
    why = server.unreachable(url)
    if why is not None:
        print(f"skipped: {why}")
        return 0
    r = measure(url, steps=args.steps, workers=args.workers)
    print(f"{r.steps} steps in {r.seconds:.1f} s ({r.steps / r.seconds:.0f}/s in process)")
    print(round_trips_row(figures(r, args.workers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
