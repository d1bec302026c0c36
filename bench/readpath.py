"""The ledger's read path, two ways: one worker-thread hop running a synchronous read function
(what the store does), or one await per query (aiosqlite on SQLite, async psycopg on
PostgreSQL, the way issue 14 names).

The read is the operator's task view of a task with `STEPS` steps, half of them done: the
queries `views.task_view` runs are recorded once, then replayed through the async driver one
await each, in one transaction (as the pooled PostgreSQL read runs). Each way runs `REPEATS`
views one after another, then `REPEATS` more `CONCURRENT` at a time; the figures are wall
time and process CPU (user + system, both threads) per view.

    python -m bench.readpath [--pg-url postgresql://...]   (aiosqlite: in the dev extra)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from tether.supervisor.ledger import LedgerConfig, Report, StepSpec, TaskSpec, queries, views
from tether.supervisor.ledger.queries import Query
from tether.supervisor.ledger.store import LedgerStore, open_ledger
from tether.supervisor.ledger.tx import Row, Statements

STEPS = 8
REPEATS = 400
CONCURRENT = 8


@dataclasses.dataclass
class Recorder:
    """A `Statements` that runs on another and writes down each query it ran."""

    inner: Statements
    ran: list[tuple[str, Mapping[str, Any], bool]] = dataclasses.field(default_factory=list)

    def one(self, name: str, /, **params: Any) -> Row | None:
        self.ran.append((name, params, False))
        return self.inner.one(name, **params)

    def all(self, name: str, /, **params: Any) -> list[Row]:
        self.ran.append((name, params, True))
        return self.inner.all(name, **params)


async def seeded(ledger: LedgerStore) -> str:
    """A task of `STEPS` steps, half of them committed; its id."""
    spec = TaskSpec(
        tenant="acme",
        idempotency_key="readpath",
        steps=tuple(
            StepSpec(name=f"s{i}", kind="chat", payload={"i": i, "text": "x" * 200})
            for i in range(STEPS)
        ),
    )
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, None)
    for _ in range(STEPS // 2):
        [lease] = await ledger.claim("bench", "default", 1, 0)
        report = Report(
            step_id=lease.step_id,
            fence=lease.fence,
            payload_hash=lease.payload_hash,
            output={"answer": "y" * 500},
            usage={"total_tokens": 10},
        )
        await ledger.report(report)
    return task_id


async def timed(view: Callable[[], Awaitable[object]]) -> tuple[float, float, float]:
    """Microseconds per view: wall one at a time, wall `CONCURRENT` at a time, and CPU over
    both runs."""
    for _ in range(20):
        await view()
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(REPEATS):
        await view()
    serial = time.perf_counter() - start
    start = time.perf_counter()

    async def worker() -> None:
        for _ in range(REPEATS // CONCURRENT):
            await view()

    async with anyio.create_task_group() as tg:
        for _ in range(CONCURRENT):
            tg.start_soon(worker)
    parallel = time.perf_counter() - start
    used = time.process_time() - cpu
    per = 1e6 / REPEATS
    return serial * per, parallel * per, used * per / 2


def _bound(query: Query, params: Mapping[str, Any]) -> tuple[str, Any]:
    """A query's text and what it is given for `params` (`Query.bind`)."""
    return query.text, params if query.bind is None else query.bind(params)


@contextlib.asynccontextmanager
async def sqlite_replay(path: Path, sql: Mapping[str, Query]) -> AsyncIterator[Any]:
    import importlib
    import sqlite3

    # In the dev extra only (pyproject.toml): the supervisor never imports it.
    aiosqlite: Any = importlib.import_module("aiosqlite")

    async with aiosqlite.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None) as db:
        db.row_factory = sqlite3.Row
        one_at_a_time = anyio.Lock()  # one connection, as the store's one reader

        async def replay(ran: list[tuple[str, Mapping[str, Any], bool]]) -> None:
            async with one_at_a_time:
                await db.execute("BEGIN")
                for name, params, many in ran:
                    text, values = _bound(sql[name], params)
                    cursor = await db.execute(text, values)
                    await (cursor.fetchall() if many else cursor.fetchone())
                await db.execute("COMMIT")

        yield replay


@contextlib.asynccontextmanager
async def pg_replay(url: str, sql: Mapping[str, Query]) -> AsyncIterator[Any]:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from tether.supervisor.ledger.pg_schema import pg_row
    from tether.supervisor.ledger.postgres import READ_CONNECTIONS

    async def read_only(db: psycopg.AsyncConnection[Any]) -> None:
        await db.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await db.set_read_only(True)

    pool = AsyncConnectionPool(
        url,
        min_size=READ_CONNECTIONS,
        max_size=READ_CONNECTIONS,
        kwargs={"row_factory": pg_row},
        configure=read_only,
        open=False,
    )  # as many connections as the store's read pool
    async with pool:

        async def replay(ran: list[tuple[str, Mapping[str, Any], bool]]) -> None:
            async with pool.connection() as db:
                for name, params, many in ran:
                    text, values = _bound(sql[name], params)
                    cursor = await db.execute(text, values)
                    await (cursor.fetchall() if many else cursor.fetchone())

        yield replay


async def measure(db: str, replaying: Callable[[Mapping[str, Query]], Any], driver: str) -> None:
    async with open_ledger(db, config=LedgerConfig(), synchronous="OFF") as ledger:
        task_id = await seeded(ledger)
        recorded: list[Recorder] = []

        def record(session: Statements) -> object:
            recorder = Recorder(session)
            recorded.append(recorder)
            return views.task_view(recorder, task_id, None, now=time.time())

        await ledger.read(record)
        ran = recorded[0].ran
        hop = await timed(lambda: ledger.task(task_id))
        async with replaying(queries.load(ledger.backend.dialect)) as replay:
            awaits = await timed(lambda: replay(ran))
    print(f"{ledger.backend.dialect}: a task view of {len(ran)} queries, {STEPS} steps")
    print("  us per view       one at a time   8 at a time   CPU")
    print(f"  one thread hop    {hop[0]:13.0f} {hop[1]:13.0f} {hop[2]:5.0f}")
    print(f"  {driver:<17} {awaits[0]:13.0f} {awaits[1]:13.0f} {awaits[2]:5.0f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="a scratch PostgreSQL database (migrated, written to)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "readpath.db"
        anyio.run(measure, str(path), lambda sql: sqlite_replay(path, sql), "aiosqlite awaits")
    if args.pg_url:
        url = args.pg_url
        anyio.run(measure, url, lambda sql: pg_replay(url, sql), "psycopg awaits")


if __name__ == "__main__":
    main()
