"""The PostgreSQL server the benchmark's PostgreSQL section runs on: whether it answers, a
scratch database per measurement (dropped afterwards), and the server's commit bound.

`BENCH_PG` names the server (any database on it: the URL is only used to reach it), else the
test suite's `TETHER_TEST_PG`, else the local one, `postgresql://postgres@127.0.0.1:5432/postgres`.
"""

from __future__ import annotations

import os
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# One copy of the scratch database: the peers' scripts run it in their own venv, as a plain
# module beside them, and the tether side imports it from there.
from bench.peers.scratch_db import scratch

__all__ = ["scratch"]

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def server_url() -> str:
    return os.environ.get("BENCH_PG") or os.environ.get("TETHER_TEST_PG") or DEFAULT_SERVER


def shown(url: str) -> str:
    """`url` without its password, for messages."""
    params = conninfo_to_dict(url)
    params.pop("password", None)
    return make_conninfo("", **params)


def unreachable(url: str) -> str | None:
    """Why the server of `url` cannot be used, in one line; None when it answers."""
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL at {shown(url)} ({' '.join(str(exc).split())[:160]})"
    return None


def commits_per_s(url: str, seconds: float) -> float:
    """Single-row commits/s on one connection (the server's `synchronous_commit`, as every
    peer and tether commit with): PostgreSQL's counterpart of `bench.disk`."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (n bigint)")
        done = 0
        start = time.monotonic()
        deadline = start + seconds
        while time.monotonic() < deadline:
            conn.execute("INSERT INTO bench_commit_probe VALUES (%s)", (done,))
            done += 1
        elapsed = time.monotonic() - start
        conn.execute("DROP TABLE bench_commit_probe")
    return done / elapsed if elapsed > 0 else 0.0


def synchronous_commit(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    return str(row[0]) if row else "?"
