"""PostgreSQL's schema (supervisor/ledger/pg_schema.py): the numbered migrations apply, mean
the same tables as SQLite's at each version, run once when supervisors start together, and a
newer database or an unreachable server is refused with one line and no password."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import pgdb
from tether.supervisor.ledger.errors import SchemaTooNew, StorageError
from tether.supervisor.ledger.pg_schema import (
    MIGRATION_LOCK,
    PgRow,
    connect,
    migrate,
    newest_version,
    redact,
    schema_version,
)
from tether.supervisor.ledger.schema import migrations, open_ledger_file

pg_url = pgdb.pg_url

SQLITE_TO_PG = {"INTEGER": "bigint", "REAL": "double precision", "TEXT": "text", "BLOB": "bytea"}


def value(conn: psycopg.Connection[PgRow], query: str) -> Any:
    """The first column of the one row `query` answers."""
    row = conn.execute(query.encode()).fetchone()
    assert row is not None
    return row[0]


def sqlite_ledger(tmp_path: Path) -> sqlite3.Connection:
    return open_ledger_file(tmp_path / "ledger.db", synchronous="OFF")


def sqlite_tables(db: sqlite3.Connection) -> dict[str, list[tuple[str, str, bool]]]:
    """Table -> its columns in order, as (name, PostgreSQL type, NOT NULL or key)."""
    names = [
        r[0]
        for r in db.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return {
        t: [
            (c["name"], SQLITE_TO_PG[c["type"]], bool(c["notnull"] or c["pk"]))
            for c in db.execute(f"PRAGMA table_info({t})")
        ]
        for t in names
    }


def pg_tables(conn: psycopg.Connection[PgRow]) -> dict[str, list[tuple[str, str, bool]]]:
    rows = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name <> 'schema_version'"
        " ORDER BY table_name, ordinal_position"
    ).fetchall()
    out: dict[str, list[tuple[str, str, bool]]] = {}
    for r in rows:
        column = (r["column_name"], r["data_type"], r["is_nullable"] == "NO")
        out.setdefault(r["table_name"], []).append(column)
    return out


def sqlite_foreign_keys(db: sqlite3.Connection, tables: list[str]) -> set[tuple[str, ...]]:
    return {
        (t, fk["from"], fk["table"], fk["to"])
        for t in tables
        for fk in db.execute(f"PRAGMA foreign_key_list({t})")
    }


def pg_foreign_keys(conn: psycopg.Connection[PgRow]) -> set[tuple[str, ...]]:
    rows = conn.execute(
        "SELECT c.conrelid::regclass::text AS t, a.attname AS col,"
        " c.confrelid::regclass::text AS ref, b.attname AS ref_col"
        " FROM pg_constraint c"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]"
        " JOIN pg_attribute b ON b.attrelid = c.confrelid AND b.attnum = c.confkey[1]"
        " WHERE c.contype = 'f'"
    ).fetchall()
    return {(r["t"], r["col"], r["ref"], r["ref_col"]) for r in rows}


def sqlite_unique_keys(db: sqlite3.Connection, tables: list[str]) -> set[tuple[Any, ...]]:
    """(table, columns, partial) of each unique index, key or constraint."""
    out: set[tuple[Any, ...]] = set()
    for t in tables:
        indexes = db.execute(f"PRAGMA index_list({t})").fetchall()
        for index in indexes:
            if index["unique"]:
                cols = tuple(c["name"] for c in db.execute(f"PRAGMA index_info({index['name']})"))
                out.add((t, cols, bool(index["partial"])))
        if not any(index["origin"] == "pk" for index in indexes):  # INTEGER PRIMARY KEY: rowid
            key = [c for c in db.execute(f"PRAGMA table_info({t})") if c["pk"]]
            out.add((t, tuple(c["name"] for c in sorted(key, key=lambda c: c["pk"])), False))
    return out


def pg_unique_keys(conn: psycopg.Connection[PgRow]) -> set[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT i.indrelid::regclass::text AS t, i.indpred IS NOT NULL AS partial,"
        " array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(n, o)"
        "  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)"
        "  AS cols"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE i.indisunique AND n.nspname = 'public'"
        " AND i.indrelid <> 'schema_version'::regclass"
    ).fetchall()
    return {(r["t"], tuple(r["cols"]), r["partial"]) for r in rows}


def named_indexes_sqlite(db: sqlite3.Connection) -> dict[str, str]:
    """Index name -> its definition from `CREATE [UNIQUE] INDEX`, whitespace squeezed."""
    rows = db.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND sql NOT NULL")
    return {r["name"]: " ".join(r["sql"].split()) for r in rows}


def named_indexes_pg(conn: psycopg.Connection[PgRow]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
    ).fetchall()
    return {r["indexname"]: r["indexdef"] for r in rows}


def test_both_backends_number_the_same_migrations() -> None:
    assert [v for v, _ in migrations("postgresql")] == [v for v, _ in migrations("sqlite")]
    assert newest_version() == migrations()[-1][0] == 16


def test_the_queues_are_analyzed_after_a_fixed_number_of_changed_rows(pg_url: str) -> None:
    """Migration 0010: a burst of queued steps gets the claim fresh statistics whatever the
    table's size (autovacuum's default waits for 10% of its rows to change)."""
    with connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT relname, reloptions FROM pg_class"
            " WHERE relname IN ('steps', 'outbox') AND relkind = 'r'"
        ).fetchall()
    expected = ["autovacuum_analyze_scale_factor=0", "autovacuum_analyze_threshold=500"]
    assert {r["relname"]: sorted(r["reloptions"] or []) for r in rows} == {
        "steps": expected,
        "outbox": expected,
    }


def test_a_migrated_database_holds_sqlite_s_tables_columns_and_keys(
    pg_url: str, tmp_path: Path
) -> None:
    db = sqlite_ledger(tmp_path)
    with connect(pg_url) as conn:
        assert schema_version(conn) == newest_version()
        lite, pg = sqlite_tables(db), pg_tables(conn)
        assert pg == lite
        assert pg_foreign_keys(conn) == sqlite_foreign_keys(db, list(lite))
        assert pg_unique_keys(conn) == sqlite_unique_keys(db, list(lite))
        # Every index SQLite names is there by the same name, partial ones with their WHERE.
        pg_indexes = named_indexes_pg(conn)
        for name, definition in named_indexes_sqlite(db).items():
            assert name in pg_indexes, name
            assert ("WHERE" in definition) == ("WHERE" in pg_indexes[name]), name
        assert "WHERE (state = 'queued'::text)" in pg_indexes["steps_queued"]
        # The AUTOINCREMENT keys are identities PostgreSQL gives.
        identities = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND is_identity = 'YES' ORDER BY 1"
        ).fetchall()
        assert [tuple(r) for r in identities] == [
            ("effect_decisions", "id"),
            ("events", "seq"),
            ("log_lines", "id"),
            ("rejections", "id"),
        ]
    db.close()


def test_fences_come_from_a_sequence_and_counters_hold_no_fence_row(pg_url: str) -> None:
    with connect(pg_url) as conn:
        assert [value(conn, "SELECT nextval('fences')") for _ in range(3)] == [1, 2, 3]
        assert value(conn, "SELECT count(*) FROM counters") == 0


def test_events_are_numbered_by_the_database_in_increasing_order(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute(
            "INSERT INTO tasks (id, tenant, idempotency_key, state, plan_hash, plan_json,"
            " created_order, created_at) VALUES ('t1', 'acme', 'k', 'QUEUED', 'h', '{}', 1, 0)"
        )
        for kind in ("a", "b", "c"):
            conn.execute(
                "INSERT INTO events (task_id, kind, state, data_json, at)"
                " VALUES ('t1', %s, 'QUEUED', '{}', 0)",
                (kind,),
            )
        rows = conn.execute("SELECT seq, kind FROM events ORDER BY seq").fetchall()
        assert [tuple(r) for r in rows] == [(1, "a"), (2, "b"), (3, "c")]
        with pytest.raises(psycopg.errors.GeneratedAlways):
            conn.execute(
                "INSERT INTO events (seq, task_id, kind, state, data_json, at)"
                " VALUES (9, 't1', 'd', 'QUEUED', '{}', 0)"
            )


def test_migrate_again_changes_nothing(pg_url: str) -> None:
    with connect(pg_url) as conn:
        assert migrate(conn) == newest_version()
        assert value(conn, "SELECT count(*) FROM schema_version") == 1


def test_a_database_newer_than_the_code_is_refused(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("UPDATE schema_version SET version = version + 1")
        with pytest.raises(SchemaTooNew) as caught:
            migrate(conn)
        assert f"{newest_version() + 1} is newer than this tether" in caught.value.detail
        assert schema_version(conn) == newest_version() + 1


def test_a_failing_migration_leaves_nothing_of_itself() -> None:
    with pgdb.fresh_database() as url, connect(url) as conn:
        conn.execute("CREATE TABLE tasks (id text)")  # migration 1 creates it: it fails there
        with pytest.raises(StorageError) as caught:
            migrate(conn)
        detail = caught.value.detail
        assert detail.startswith(f"cannot migrate the ledger database {redact(url)}: ")
        assert "tasks" in detail
        assert "\n" not in detail
        assert schema_version(conn) == 0
        assert value(conn, "SELECT to_regclass('counters')") is None


def test_supervisors_starting_at_once_migrate_once() -> None:
    """Two migrations wait on the lock a third connection holds; once it is let go, one applies
    every migration and the other finds nothing left to do (had both run a migration, the
    second would fail creating a table that exists)."""
    with pgdb.fresh_database() as url, connect(url) as holder:
        results: list[int | BaseException] = []

        def start() -> None:
            try:
                with connect(url) as conn:
                    results.append(migrate(conn))
            except BaseException as exc:  # reported by the assertion below
                results.append(exc)

        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            threads = [threading.Thread(target=start) for _ in range(2)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while waiting_for_the_lock(holder) < 2:
                assert time.monotonic() < deadline, "the migrations did not wait for the lock"
                time.sleep(0.02)
            assert schema_version(holder) == 0
        for t in threads:
            t.join(timeout=30)
        assert results == [newest_version(), newest_version()]
        assert schema_version(holder) == newest_version()


def waiting_for_the_lock(conn: psycopg.Connection[PgRow]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    return 0 if row is None else int(row[0])


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    url = "postgresql://tether:hunter2@127.0.0.1:1/ledger"
    with pytest.raises(StorageError) as caught:
        connect(url)
    detail = caught.value.detail
    assert detail.startswith("cannot connect to postgresql://tether@127.0.0.1:1/ledger: ")
    assert "hunter2" not in detail
    assert "\n" not in detail
    assert not isinstance(caught.value, psycopg.Error)


def test_a_refused_login_does_not_show_the_password_given_as_a_parameter() -> None:
    server = pgdb.pg_server_url()
    with pgdb.fresh_database():  # skips (or fails in CI) where no server is reachable
        url = pgdb.with_database(server, "no_such_database_here") + "?password=hunter2"
        with pytest.raises(StorageError) as caught:
            connect(url)
    detail = caught.value.detail
    assert "no_such_database_here" in detail
    assert "hunter2" not in detail
    assert "password=***" in detail


@pytest.mark.parametrize(
    ("url", "shown"),
    [("mysql://u:secret@h/db", "'mysql://u@h/db'"), ("postgresql://[::1/db", "'<a database")],
)
def test_a_url_of_another_kind_is_refused(url: str, shown: str) -> None:
    with pytest.raises(StorageError, match=rf"^not a PostgreSQL URL: {re.escape(shown)}"):
        connect(url)


def test_rows_read_like_sqlite_rows(pg_url: str) -> None:
    with connect(pg_url) as conn:
        row = conn.execute("SELECT 1 AS one, 'two' AS Two, 3 AS one").fetchone()
    assert row is not None
    assert (row["one"], row["two"], row["TWO"], row[1], row[-1]) == (1, "two", "two", "two", 3)
    assert row.keys() == ["one", "two", "one"]
    assert dict(row) == {"one": 1, "two": "two"}  # as dict(sqlite3.Row): the first of a name
    assert list(row) == [1, "two", 3]
    assert len(row) == 3
    with pytest.raises(IndexError, match="no such column: three"):
        row["three"]


def test_no_server_skips_with_one_line_but_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TETHER_TEST_PG", "postgresql://postgres:hunter2@127.0.0.1:1/test")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped, pgdb.fresh_database():
        pass
    message = str(skipped.value)
    assert message.startswith(
        "PostgreSQL not reachable at postgresql://postgres@127.0.0.1:1/test: set TETHER_TEST_PG"
    )
    assert "hunter2" not in message
    assert "\n" not in message
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed, pgdb.fresh_database():
        pass
    assert str(failed.value) == message
