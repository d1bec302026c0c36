"""A fresh PostgreSQL database for one peer's run, dropped afterwards.

`scratch(server_url, name)` creates `tether_bench_<name>_<random>` on the server of
`server_url` (any database of it: the URL is only used to reach the server) and yields the new
database's URL; the database is dropped (`WITH (FORCE)`, so a worker still connected does not
keep it) when the block ends, however it ends.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict


@contextmanager
def scratch(server_url: str, name: str) -> Iterator[str]:
    database = f"tether_bench_{name}_{secrets.token_hex(4)}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        yield url_of(server_url, database)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


def url_of(server_url: str, database: str) -> str:
    """`server_url` with its database replaced, as a `postgresql://` URL (DBOS and SQLAlchemy
    want a URL, not a libpq keyword string)."""
    params = conninfo_to_dict(server_url)
    user = params.get("user", "")
    password = params.get("password")
    host = params.get("host", "127.0.0.1")
    port = params.get("port", "5432")
    auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
    taken = {"user", "password", "host", "port", "dbname"}
    rest = {k: v for k, v in params.items() if k not in taken}
    query = "&".join(f"{k}={v}" for k, v in rest.items())
    return f"postgresql://{auth}{host}:{port}/{database}" + (f"?{query}" if query else "")
