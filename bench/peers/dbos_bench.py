"""DBOS, durably, on a SQLite system database: one `@DBOS.step` per `@DBOS.workflow`.

C client threads each run the workflow (which runs its one no-op step) again and again for a
fixed time; DBOS records the workflow's status, the step's output and the outcome in its
SQLite system database before each call returns. The database is DBOS's default for a
`sqlite:///` URL (SQLite's defaults: rollback journal, `synchronous=FULL`), so every commit is
durable, as tether's are. With `--wal` DBOS gets an engine in WAL mode, still
`synchronous=FULL`, like tether's ledger: not its default, but what a user tuning it would do.
Workflows run in the calling thread (the fastest way DBOS offers).

    python dbos_bench.py --db FILE --seconds S --concurrency 1,16,64
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import threading
import time
import uuid
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--wal", action="store_true", help="give DBOS a WAL engine (not its default)")
    args = p.parse_args()
    logging.disable(logging.WARNING)
    config: DBOSConfig = {
        "name": f"bench-{uuid.uuid4().hex[:8]}",
        "system_database_url": f"sqlite:///{args.db}",
        "log_level": "ERROR",
        "sys_db_pool_size": 64,
    }
    if args.wal:
        config["system_database_engine"] = wal_engine(args.db)
    DBOS(config=config)
    DBOS.launch()
    try:
        run(2, 0.5)  # warm up
        by_c = {c: run(int(c), args.seconds) for c in args.concurrency.split(",")}
    finally:
        DBOS.destroy()
    pragma = sqlite3.connect(args.db)
    journal = pragma.execute("PRAGMA journal_mode").fetchone()[0]
    pragma.close()
    import importlib.metadata

    print(json.dumps({
        "peer": "dbos_wal" if args.wal else "dbos",
        "version": importlib.metadata.version("dbos"),
        "config": f"SQLite system database, journal_mode={journal}, synchronous=FULL"
        + (" (WAL engine given)" if args.wal else " (DBOS's default engine)"),
        "by_concurrency": by_c,
        "steps_per_s": max(by_c.values()),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
