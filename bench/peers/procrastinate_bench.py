"""procrastinate on PostgreSQL, durably: the same one-step no-op job, enqueue -> done.

At each concurrency C: a worker process (`app.run_worker(concurrency=C)`, its own process like
tether's runners, woken by procrastinate's LISTEN/NOTIFY) runs an async no-op task; the bench
process defers N jobs from C coroutines at once through a `PsycopgConnector`, and the figure is
N / (last job's `succeeded` event - first job's `deferred` event), from procrastinate's own
event table on the server's clock. Every defer and every job's finish is a PostgreSQL
transaction committed with the server's `synchronous_commit` (on: durable, as tether's are).
The database is a fresh `tether_bench_procrastinate_<random>`, dropped afterwards.

    python procrastinate_bench.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres \
        --jobs 1000 --concurrency 1,16,64
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import signal
import subprocess
import sys
import time

import procrastinate
import psycopg
from scratch_db import scratch

POOL_MAX = 32  # connections per pool at most: the server allows 100 in all


def make_app(url: str, concurrency: int) -> procrastinate.App:
    size = min(POOL_MAX, concurrency + 2)
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=size, max_size=size)
    )

    @app.task(name="noop")
    async def noop(i: int) -> int:
        return i

    return app


def worker(url: str, queue: str, concurrency: int) -> None:
    """Run until SIGTERM (procrastinate stops gracefully on it)."""
    make_app(url, concurrency).run_worker(queues=[queue], concurrency=concurrency, wait=True)


def start_worker(url: str, queue: str, concurrency: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--worker",
            "--pg-url",
            url,
            "--queue",
            queue,
            "--concurrency",
            str(concurrency),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_for(
    conn: psycopg.Connection, query: str, params: tuple[object, ...], want: int, timeout_s: float
) -> int:
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        got = int(row[0]) if row else 0
        if got >= want:
            break
        time.sleep(0.01)
    return got


async def defer(url: str, concurrency: int, queue: str, jobs: int) -> None:
    app = make_app(url, concurrency)
    async with app.open_async():
        task = app.tasks["noop"].configure(queue=queue)
        shares = [range(n, jobs, concurrency) for n in range(concurrency)]

        async def client(share: range) -> None:
            for i in share:
                await task.defer_async(i=i)

        await asyncio.gather(*(client(s) for s in shares))


def end_to_end(url: str, conn: psycopg.Connection, concurrency: int, jobs: int) -> float:
    queue = f"c{concurrency}"
    proc = start_worker(url, queue, concurrency)
    try:
        if not wait_for(conn, "SELECT count(*) FROM procrastinate_workers", (), 1, 30):
            raise RuntimeError("the procrastinate worker did not register within 30 s")
        asyncio.run(defer(url, concurrency, queue, jobs))
        done = wait_for(
            conn,
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s"
            " AND status = 'succeeded'",
            (queue,),
            jobs,
            60 + jobs / 10,
        )
    finally:
        stop(proc)
    row = conn.execute(
        "SELECT extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')"
        " - min(e.at) FILTER (WHERE e.type = 'deferred'))"
        " FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id"
        " WHERE j.queue_name = %s",
        (queue,),
    ).fetchone()
    window = float(row[0]) if row and row[0] is not None else 0.0
    return done / window if window > 0 else 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pg-url", required=True, help="the server (any database on it)")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--queue", default="c1")
    p.add_argument("--jobs", type=int, default=1000, help="jobs per concurrency")
    p.add_argument("--concurrency", default="1,16,64")
    args = p.parse_args()
    logging.disable(logging.WARNING)
    if args.worker:
        worker(args.pg_url, args.queue, int(args.concurrency))
        return
    by_c: dict[str, float] = {}
    with scratch(args.pg_url, "procrastinate") as url:
        app = make_app(url, 1)
        with app.open():
            app.schema_manager.apply_schema()
        with psycopg.connect(url, autocommit=True) as conn:
            end_to_end(url, conn, 2, 20)  # warm up
            for c in args.concurrency.split(","):
                by_c[c] = end_to_end(url, conn, int(c), args.jobs)
            sync = conn.execute("SHOW synchronous_commit").fetchone()
    print(
        json.dumps(
            {
                "peer": "procrastinate",
                "version": importlib.metadata.version("procrastinate"),
                "config": (
                    f"PostgreSQL (synchronous_commit={sync[0] if sync else '?'}), "
                    "PsycopgConnector, worker process with concurrency C, async no-op task, "
                    f"{args.jobs} jobs deferred by C coroutines"
                ),
                "by_concurrency": by_c,
                "steps_per_s": max(by_c.values()),
            }
        )
    )


if __name__ == "__main__":
    main()
