"""DBOS, durably, on a SQLite system database: one `@DBOS.step` per `@DBOS.workflow`.

C client threads each run the workflow (which runs its one no-op step) again and again for a
fixed time; DBOS records the workflow's status, the step's output and the outcome in its
SQLite system database before each call returns. The database is DBOS's default for a
`sqlite:///` URL (SQLite's defaults: rollback journal, `synchronous=FULL`), so every commit is
durable, as tether's are. With `--wal` DBOS gets an engine in WAL mode, still
`synchronous=FULL`, like tether's ledger: not its default, but what a user tuning it would do.
Workflows run in the calling thread (the fastest way DBOS offers).

With `--pg-url` the system database is PostgreSQL instead: a fresh
`tether_bench_dbos_<random>` on that server (dropped afterwards), committed with the server's
`synchronous_commit` (on: durable), through DBOS's own engine (psycopg, a pool of
`PG_POOL` connections: the server allows 100 in all).

    python dbos_bench.py --db FILE --seconds S --concurrency 1,16,64
    python dbos_bench.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres --seconds S
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig
from scratch_db import scratch

PG_POOL = 40


@DBOS.step()
def noop_step(i: int) -> int:
    return i


@DBOS.workflow()
def one_step_workflow(i: int) -> int:
    return noop_step(i)


def run(clients: int, seconds: float) -> float:
    done = [0] * clients
    deadline = time.monotonic() + seconds

    def client(n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            if one_step_workflow(n * 1_000_000 + i) == n * 1_000_000 + i:
                done[n] += 1
            i += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return sum(done) / (time.monotonic() - start)


def wal_engine(db: str) -> sa.Engine:
    """The same file in WAL mode, still `synchronous=FULL`: DBOS's best durable SQLite setup,
    set the way its own engine is (IMMEDIATE transactions, a long busy timeout)."""
    engine = sa.create_engine(f"sqlite:///{db}", pool_size=64)

    @sa.event.listens_for(engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")

    return engine


def measure(config: DBOSConfig, concurrency: str, seconds: float) -> dict[str, float]:
    DBOS(config=config)
    DBOS.launch()
    try:
        run(2, 0.5)  # warm up
        return {c: run(int(c), seconds) for c in concurrency.split(",")}
    finally:
        DBOS.destroy()


def sqlite_run(args: argparse.Namespace) -> dict[str, Any]:
    config: DBOSConfig = {
        "name": f"bench-{uuid.uuid4().hex[:8]}",
        "system_database_url": f"sqlite:///{args.db}",
        "log_level": "ERROR",
        "sys_db_pool_size": 64,
    }
    if args.wal:
        config["system_database_engine"] = wal_engine(args.db)
    by_c = measure(config, args.concurrency, args.seconds)
    pragma = sqlite3.connect(args.db)
    journal = pragma.execute("PRAGMA journal_mode").fetchone()[0]
    pragma.close()
    return {
        "peer": "dbos_wal" if args.wal else "dbos",
        "config": f"SQLite system database, journal_mode={journal}, synchronous=FULL"
        + (" (WAL engine given)" if args.wal else " (DBOS's default engine)"),
        "by_concurrency": by_c,
    }


@contextlib.contextmanager
def pg_database(server_url: str) -> Iterator[tuple[str, str]]:
    """A scratch database's URL, and the server's `synchronous_commit`."""
    with scratch(server_url, "dbos") as url:
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            sync = str(conn.execute(sa.text("SHOW synchronous_commit")).scalar())
        engine.dispose()
        yield url, sync


def pg_run(args: argparse.Namespace) -> dict[str, Any]:
    with pg_database(args.pg_url) as (url, sync):
        config: DBOSConfig = {
            "name": f"bench-{uuid.uuid4().hex[:8]}",
            "system_database_url": url,
            "log_level": "ERROR",
            "sys_db_pool_size": PG_POOL,
        }
        by_c = measure(config, args.concurrency, args.seconds)
    return {
        "peer": "dbos_pg",
        "config": f"PostgreSQL system database (synchronous_commit={sync}), DBOS's own engine,"
        f" pool of {PG_POOL}",
        "by_concurrency": by_c,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="a SQLite system database file")
    where.add_argument("--pg-url", help="a PostgreSQL server (any database on it)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--wal", action="store_true", help="give DBOS a WAL engine (not its default)")
    args = p.parse_args()
    if args.wal and args.pg_url:
        p.error("--wal is for a SQLite system database")
    logging.disable(logging.WARNING)
    found = pg_run(args) if args.pg_url else sqlite_run(args)
    found["version"] = importlib.metadata.version("dbos")
    found["steps_per_s"] = max(found["by_concurrency"].values())
    print(json.dumps(found))


if __name__ == "__main__":
    main()
