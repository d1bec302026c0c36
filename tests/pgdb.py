"""A PostgreSQL server for the tests: a throwaway database each, and the `pg_url` fixture.

The server is `TETHER_TEST_PG` (default the local one). Where none is reachable a test that
needs it is skipped with one line, except under CI (`CI` set), where that is a failure.
A test module takes the fixture with `pg_url = pgdb.pg_url`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import NoReturn

import pytest
from psycopg import sql

from tether.sim.pgscratch import with_database
from tether.supervisor.ledger.errors import StorageError
from tether.supervisor.ledger.pg_schema import connect, migrate, one_line, redact

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"

_unreachable: dict[str, str] = {}  # server URL -> why; asked once per run, not once per test


def pg_server_url() -> str:
    """The server the tests use: a URL whose database the test user can connect to."""
    return os.environ.get("TETHER_TEST_PG") or DEFAULT_SERVER


def _unavailable(server: str, why: str) -> NoReturn:
    line = f"PostgreSQL not reachable at {redact(server)}: set TETHER_TEST_PG ({why})"
    if os.environ.get("CI"):
        pytest.fail(line, pytrace=False)
    pytest.skip(line)


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database `tether_test_<random>` on the test server, its commits not waiting
    for the disk; its URL. Dropped after, with whatever connections are still open to it."""
    server = pg_server_url()
    if server in _unreachable:
        _unavailable(server, _unreachable[server])
    try:
        admin = connect(server)
    except StorageError as exc:
        _unreachable[server] = one_line(exc.__cause__ or exc, server)
        _unavailable(server, _unreachable[server])
    name = f"tether_test_{secrets.token_hex(6)}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            # A throwaway database: its commits need not wait for the server's disk, 3 ms
            # each on this machine, 0.3 ms without (the tests kill sessions and supervisors,
            # never the server, so none can tell but by the clock).
            no_wait = sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
            admin.execute(no_wait.format(sql.Identifier(name)))
            yield with_database(server, name)
        finally:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a fresh database migrated to the newest schema."""
    with fresh_database() as url:
        with connect(url) as conn:
            migrate(conn)
        yield url
