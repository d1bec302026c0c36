"""PostgreSQL round trips per committed step (issue 28; target <= 12): how often the ledger's
one writer thread sends the server something and waits for its answer, for each step it
commits, on its serialized connection.

The ledger runs in this process on a scratch database of the server (`LedgerStore` on its
PostgreSQL backend, the supervisor's own rules and writer), driven in the runner's shape
without HTTP: `workers` loops each claim one lease, then report its result with an eager
grant queued right behind it (`claim_after`, as `POST /v1/steps/results` does), so both rules
share a group-commit batch. The supervisor's code is not touched.

The figure is read off the wire: libpq's own trace of the writer's connection (`PQtrace`,
switched on here at the connection's first statement on the writer thread) lists every
protocol message in the order sent and received, and a round trip is a run of messages the
client sent followed by the server's answer. A statement sent alone is one; statements
pipelined together (psycopg's pipeline mode, an `executemany`) share one, however many they
are. Beside it, by kind, what the writer asked psycopg for (psycopg's `Cursor.execute`,
`executemany` and pipeline calls wrapped here): statements sent alone (begin, commit,
savepoint, other), `executemany` calls, and in pipeline mode the statements queued and the
waits for their answers. `python -m bench.pg_roundtrips [--steps N] [--workers W]` takes it
alone.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import psycopg
from psycopg import pq

from bench import pgdb as server
from bench.ledgers import PgLedger
from bench.report import round_trips_row
from tether.supervisor.ledger import Lease, Report
from tether.supervisor.ledger.store import open_ledger

WRITER_THREAD = "ledger-writer"  # tether.supervisor.ledger.writer names its thread so


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundTrips:
    steps: int
    round_trips: int  # read off the wire (libpq's trace)
    by_kind: dict[str, int]  # what the writer asked psycopg for; see the module
    seconds: float

    @property
    def per_step(self) -> float:
        return self.round_trips / self.steps if self.steps else 0.0


def _kind(query: Any) -> str:
    text = query if isinstance(query, str) else str(query)
    head = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
    if head in ("BEGIN;", "BEGIN"):
        return "begin"
    if head in ("COMMIT", "ROLLBACK"):
        return "commit"
    if head in ("SAVEPOINT", "RELEASE"):
        return "savepoint"
    return "statement"


# A message's line in libpq's trace: direction (F: the client sent it, B: the server), length.
# A statement's text may hold newlines, so its later lines are told apart by this shape.
_MESSAGE = re.compile(r"([FB])\t\d+\t")


def turns(trace: Path) -> int:
    """Round trips in a libpq trace: each run of messages the client sent (`F`) that the
    server's messages (`B`) follow."""
    count, sending = 0, False
    with trace.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            message = _MESSAGE.match(line)
            if message is None:
                continue
            if message.group(1) == "F":
                sending = True
            elif sending:
                count, sending = count + 1, False
    return count


@contextlib.contextmanager
def counted(trace: Path) -> Iterator[collections.Counter[str]]:
    """Trace the writer's connection into `trace` and count what the writer thread asks
    psycopg for, by kind, while entered. `untrace` (below) flushes the trace."""
    seen: collections.Counter[str] = collections.Counter()
    traced: set[int] = set()
    inner = threading.local()  # inside an executemany made outside a pipeline
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    sync, leave = psycopg.Pipeline.sync, psycopg.Pipeline.__exit__
    fetch = psycopg.Cursor._fetch_pipeline

    def on_writer(cursor: Any) -> bool:
        if threading.current_thread().name != WRITER_THREAD:
            return False
        pgconn = cursor.connection.pgconn
        if id(pgconn) not in traced:
            traced.add(id(pgconn))
            pgconn.trace(os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            _TRACED.append(pgconn)
        return True

    def counting_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if on_writer(self):
            pipelined = self.connection._pipeline is not None
            seen["pipelined" if pipelined else _kind(query)] += 1
        return execute(self, query, *args, **kwargs)

    def counting_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if not on_writer(self):
            return executemany(self, query, *args, **kwargs)
        if self.connection._pipeline is not None:
            seen["pipelined"] += 1
            return executemany(self, query, *args, **kwargs)
        seen["executemany"] += 1
        inner.many = True
        try:
            return executemany(self, query, *args, **kwargs)
        finally:
            inner.many = False

    def counting_sync(self: Any) -> Any:
        if threading.current_thread().name == WRITER_THREAD:
            seen["pipeline sync"] += 1
        return sync(self)

    def counting_exit(self: Any, *args: Any) -> Any:
        if threading.current_thread().name == WRITER_THREAD and not getattr(inner, "many", False):
            seen["pipeline sync"] += 1
        return leave(self, *args)

    def counting_fetch(self: Any) -> Any:
        pipeline = self.connection._pipeline
        if (
            threading.current_thread().name == WRITER_THREAD
            and pipeline is not None
            and not self.pgresult
            and pipeline.result_queue
        ):
            seen["pipeline read"] += 1
        return fetch(self)

    patches = {
        (psycopg.Cursor, "execute"): counting_execute,
        (psycopg.Cursor, "executemany"): counting_executemany,
        (psycopg.Cursor, "_fetch_pipeline"): counting_fetch,
        (psycopg.Pipeline, "sync"): counting_sync,
        (psycopg.Pipeline, "__exit__"): counting_exit,
    }
    originals = {key: getattr(*key) for key in patches}
    for (cls, name), patched in patches.items():
        setattr(cls, name, patched)
    try:
        yield seen
    finally:
        for (cls, name), original in originals.items():
            setattr(cls, name, original)


_TRACED: list[Any] = []  # the writer connections traced, to flush (`untrace`) at the end


def untrace() -> None:
    """Stop tracing every connection `counted` traced; libpq flushes the trace then."""
    while _TRACED:
        pgconn = _TRACED.pop()
        with contextlib.suppress(Exception):  # a connection lost meanwhile has nothing to flush
            pgconn.untrace()


async def _grant(ledger: Any, lease: Lease, runner: str, pool: str, out: list[Any]) -> None:
    """The eager grant queued behind `lease`'s result (`usecases.grants.EagerGrant`)."""
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
    with server.scratch(url, "roundtrips") as db, tempfile.TemporaryDirectory() as scratch:
        PgLedger(db).create_tasks(pool, steps, approve=True)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("ANALYZE")  # as bench.pg: the claim's plan on a fresh table
        trace = Path(scratch) / "writer.trace"

        async def main() -> RoundTrips:
            async with open_ledger(db) as ledger:
                with counted(trace) as seen:
                    start = time.perf_counter()
                    done = await _drive(ledger, pool, workers)
                    seconds = time.perf_counter() - start
                    untrace()  # the writer is idle: every rule has been answered
            return RoundTrips(
                steps=done, round_trips=turns(trace), by_kind=dict(seen), seconds=seconds
            )

        return anyio.run(main)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CpuPerStep:
    steps: int
    seconds: float
    writer_ms: float  # the writer thread's CPU per committed step
    server_ms: float | None  # the scratch database's server processes'; None: not on this host


def _server_cpu_s(database: str) -> float | None:
    """CPU seconds of this host's PostgreSQL processes serving `database` (their titles name
    it); None when none is seen here (a server on another host)."""
    total, seen = 0.0, False
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or ())
        if title.startswith("postgres:") and f" {database} " in f"{title} ":
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total, seen = total + times.user + times.system, True
    return total if seen else None


def cpu_per_step(url: str, *, steps: int, workers: int = 64) -> CpuPerStep:
    """What a committed step costs the serialized writer in CPU, its own and the server's, in
    the same loops as `measure` but untraced (libpq's trace costs the writer CPU)."""
    pool = "roundtrips"
    with server.scratch(url, "roundtrips") as db:
        PgLedger(db).create_tasks(pool, steps, approve=True)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("ANALYZE")
        database = psycopg.conninfo.conninfo_to_dict(db)["dbname"]

        def writer_s() -> float:
            [writer] = [t for t in threading.enumerate() if t.name == WRITER_THREAD]
            [mine] = [t for t in psutil.Process().threads() if t.id == writer.native_id]
            return float(mine.user_time + mine.system_time)

        async def main() -> CpuPerStep:
            async with open_ledger(db) as ledger:
                writer, served = writer_s(), _server_cpu_s(str(database))
                start = time.perf_counter()
                done = await _drive(ledger, pool, workers)
                seconds = time.perf_counter() - start
                writer, after = writer_s() - writer, _server_cpu_s(str(database))
            per = 1000 / max(1, done)
            return CpuPerStep(
                steps=done,
                seconds=seconds,
                writer_ms=writer * per,
                server_ms=None if served is None or after is None else (after - served) * per,
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
    p.add_argument(
        "--cpu",
        action="store_true",
        help="then, untraced, the CPU a step costs the writer thread and the server",
    )
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
    if args.cpu:
        c = cpu_per_step(url, steps=args.steps, workers=args.workers)
        server_ms = "not on this host" if c.server_ms is None else f"{c.server_ms:.2f} ms"
        print(
            f"untraced: {c.steps} steps in {c.seconds:.1f} s ({c.steps / c.seconds:.0f}/s in"
            f" process); CPU per step: writer thread {c.writer_ms:.2f} ms, server {server_ms}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
