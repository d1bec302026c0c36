"""Copying a SQLite ledger into PostgreSQL (supervisor/ledger/copy.py and `migrate --from
--to`): a ledger made by the ledger's own rules arrives row for row, fences and event numbers
continue above the copied ones, and a target that is not an empty ledger of the same schema
version is refused without a change."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import pgdb
from tests.conftest import FakeClock, open_ledger, queued_task, raw_db, report_for
from tests.supervisor.ledger.test_ledger_checkpoints import turn
from tests.supervisor.ledger.test_ledger_outbox import approved, gated_effect, http, spec_with
from tests.supervisor.ledger.test_ledger_verification import AT_BASE, ran, repo_task
from tether.supervisor.admin import AdminError, check
from tether.supervisor.ledger import SqliteLedger, invariants, queries
from tether.supervisor.ledger.copy import copy_ledger
from tether.supervisor.ledger.errors import SchemaTooNew, StaleFence, StorageError
from tether.supervisor.ledger.outbox import Delivered
from tether.supervisor.ledger.pg_schema import PgRow, connect, newest_version, schema_version
from tether.supervisor.ledger.postgres import PgConnection
from tether.supervisor.ledger.tokens import Principal, Role
from tether.supervisor.ledger.tx import ReadSession
from tether.supervisor.migrate_command import run
from tether.wire.records import LogLine

pg_url = pgdb.pg_url

# Tables a ledger of this test's making leaves empty (no rule of it writes them).
LEFT_EMPTY = {"artifact_chunks"}  # a SQLite ledger keeps its artifacts in files


async def claim(ledger: SqliteLedger, kinds: tuple[str, ...] = ("chat",)) -> Any:
    [lease] = await ledger.claim("r1", "default", 1, 0, kinds=kinds)
    return lease


async def build(path: Path, clock: FakeClock) -> None:
    """A ledger with a row in every table, each written by the ledger's own rules."""
    async with open_ledger(path, clock) as ledger:
        operator = await ledger.create_token("acme", "operator")
        await ledger.create_token("default", "runner")
        signed = await ledger.authenticate(operator.secret)
        assert signed is not None
        await ledger.start_ui_session(signed, 3600.0)  # a status-page session
        await ledger.set_budget("acme", 10_000)
        # A repository task whose checks pass: check runs, evidence, an effect, artifacts.
        await repo_task(ledger, key="repo-task")
        lease = await claim(ledger, ("chat", "agent"))
        named = {"coverage": hashlib.sha256(b"coverage").hexdigest()}
        await ledger.report(report_for(lease, **ran(), artifacts=named), evidence=AT_BASE)
        await ledger.set_repository_head("acme", "repo", "base2")
        # A lease that checkpoints, expires and is fenced out: a rejection, a second attempt.
        await queued_task(ledger, "expiring", steps=2)
        old = await claim(ledger)
        await ledger.checkpoint(old.step_id, turn(old, 1))
        clock.advance(31)
        assert await ledger.expire() == 1
        [new] = await ledger.claim("r1", "default", 1, 0, token_id="tok")
        shipped = LogLine(
            step_id=new.step_id,
            fence=new.fence,
            level="info",
            event="resuming",
            fields={"turn": 1, "from_fence": old.fence},
        )
        assert (await ledger.keep_log_lines([shipped], "default", "tok")).kept == 1
        with pytest.raises(StaleFence):
            await ledger.report(report_for(old))
        await ledger.report(  # the lease is tok's
            report_for(new, output={"text": "ünïcode ✓", "n": 1.5}), token_id="tok"
        )
        # A keyed effect delivered after a chat step, and a gated one opened by an operator.
        hook = spec_with(("build", "chat", {"cmd": "b"}), ("hook", "http", http()), key="hook")
        await approved(ledger, hook)
        while leases := await ledger.claim("r1", "default", 8, 0):  # its build, expiring's 2nd
            for lease in leases:
                await ledger.report(report_for(lease))
        task_id, digest = await gated_effect(ledger)
        await ledger.open_gate("acme", task_id, "deploy", digest, "alice")
        taken = await ledger.take_effects("d1", 8)
        assert len(taken) == 2
        for out in taken:
            attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
            await ledger.record_attempt(
                out.effect_id, attempt, "d1", Delivered(status=200, detail="ok")
            )
        uploaded = hashlib.sha256(b"log").hexdigest()
        await ledger.record_artifact(
            uploaded, 3, Principal(token_id="tok", scope="default", role=Role.RUNNER)
        )
        cancelled = await queued_task(ledger, "cancelled")
        await ledger.cancel("acme", cancelled, "not wanted")
        clock.advance(5)


def sqlite_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = raw_db(path)
    try:
        tables = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {t: sorted_rows(db.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}
    finally:
        db.close()


def pg_rows(url: str, tables: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    with connect(url) as conn:
        return {
            t: sorted_rows(conn.execute(f"SELECT * FROM {t}".encode()).fetchall()) for t in tables
        }


def sorted_rows(rows: list[sqlite3.Row] | list[PgRow]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in rows), key=repr)


def one(url: str, query: str) -> Any:
    with connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
    assert row is not None
    return row[0]


def source_value(path: Path, query: str) -> Any:
    db = raw_db(path)
    try:
        return db.execute(query).fetchone()[0]
    finally:
        db.close()


@pytest.fixture
async def source(ledger_path: Path, clock: FakeClock) -> Path:
    await build(ledger_path, clock)
    return ledger_path


async def test_every_table_arrives_row_for_row(source: Path, pg_url: str) -> None:
    before = sqlite_rows(source)
    assert {t for t, rows in before.items() if not rows} == LEFT_EMPTY
    report = copy_ledger(source, pg_url)
    after = pg_rows(pg_url, list(before))
    fence = [r for r in before["counters"] if r[0] == "fence"]
    expected = {**before, "counters": [r for r in before["counters"] if r[0] != "fence"]}
    assert after == expected
    assert report.rows == {t: len(rows) for t, rows in expected.items()}
    assert report.fence == fence[0][1]
    assert report.version == newest_version()
    assert sqlite_rows(source) == before  # the source is only read
    assert check(source) == []
    with connect(pg_url) as conn:
        on_pg = ReadSession(PgConnection(conn), queries.load("postgresql"))
        assert invariants.find_violations(on_pg) == []
        conn.execute("SELECT setval('fences', 1)")  # the check is live: a fence behind is seen
        assert [v.split(":")[0] for v in invariants.find_violations(on_pg)] == [
            "fence-counter-ahead"
        ]
    assert report.summary().startswith(
        f"copied {source} to {pg_url} (schema version {newest_version()}):"
        f" {sum(report.rows.values())} rows in {len(before)} tables ("
        f"{len(before['tasks'])} tasks, {len(before['steps'])} steps,"
    )


async def test_fences_and_numbers_continue_above_the_copied_ones(source: Path, pg_url: str) -> None:
    counter = source_value(source, "SELECT value FROM counters WHERE name = 'fence'")
    assert counter >= source_value(source, "SELECT MAX(fence) FROM attempts") > 0
    top_event = source_value(source, "SELECT MAX(seq) FROM events")
    top_decision = source_value(source, "SELECT MAX(id) FROM effect_decisions")
    top_rejection = source_value(source, "SELECT MAX(id) FROM rejections")
    copy_ledger(source, pg_url)
    with connect(pg_url) as conn:
        assert one(pg_url, "SELECT nextval('fences')") == counter + 1
        [task_id] = [r[0] for r in conn.execute("SELECT id FROM tasks LIMIT 1").fetchall()]
        seq = conn.execute(
            "INSERT INTO events (task_id, kind, state, data_json, at)"
            " VALUES (%s, 'x', 'QUEUED', '{}', 0) RETURNING seq",
            (task_id,),
        ).fetchone()
        assert seq is not None
        assert seq[0] == top_event + 1
        rejection = conn.execute(
            "INSERT INTO rejections (code, detail, at) VALUES ('x', 'x', 0) RETURNING id"
        ).fetchone()
        assert rejection is not None
        assert rejection[0] == top_rejection + 1
        step_id = one(pg_url, "SELECT step_id FROM effect_decisions LIMIT 1")
        decision = conn.execute(
            "INSERT INTO effect_decisions (step_id, action, by, at)"
            " VALUES (%s, 'open', 'x', 0) RETURNING id",
            (step_id,),
        ).fetchone()
        assert decision is not None
        assert decision[0] == top_decision + 1


async def test_a_target_that_holds_anything_is_refused_unchanged(source: Path, pg_url: str) -> None:
    copy_ledger(source, pg_url)
    tables = list(sqlite_rows(source))
    before = pg_rows(pg_url, tables)
    with pytest.raises(StorageError, match=r"is not an empty ledger \(.*tasks.*\): copy into a"):
        copy_ledger(source, pg_url)
    assert pg_rows(pg_url, tables) == before


async def test_a_target_with_only_a_token_is_not_empty(
    source: Path, pg_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    other = tmp_path / "tokens-only.db"
    async with open_ledger(other, clock) as ledger:
        await ledger.create_token("acme", "operator")
    copy_ledger(other, pg_url)
    with pytest.raises(StorageError, match=r"not an empty ledger \(tokens hold rows\)"):
        copy_ledger(source, pg_url)
    assert one(pg_url, "SELECT count(*) FROM tasks") == 0


async def test_a_target_a_supervisor_has_run_on_is_empty_and_takes_the_sources_stamp(
    source: Path, pg_url: str, clock: FakeClock
) -> None:
    """A supervisor started on the new database stamps 'alive' (reaper.refresh_after_restart):
    not data. The copy carries the source's stamp, so the first start on PostgreSQL moves open
    leases by the time no supervisor served either ledger."""
    stamped = source_value(source, "SELECT value FROM counters WHERE name = 'alive'")
    clock.advance(60)
    async with open_ledger(pg_url, clock):
        pass
    assert one(pg_url, "SELECT value FROM counters WHERE name = 'alive'") > stamped
    copy_ledger(source, pg_url)
    assert one(pg_url, "SELECT value FROM counters WHERE name = 'alive'") == stamped


async def test_a_row_postgresql_cannot_hold_fails_the_copy_and_leaves_the_target_empty(
    source: Path, pg_url: str
) -> None:
    db = raw_db(source)
    planted = db.execute("UPDATE tasks SET reason = ? WHERE state = 'CANCELLED'", ("a\x00b",))
    assert planted.rowcount == 1
    db.close()
    with pytest.raises(StorageError) as caught:
        copy_ledger(source, pg_url)
    assert caught.value.detail.startswith(f"cannot copy into {pg_url}: ")
    assert "\n" not in caught.value.detail
    tables = list(sqlite_rows(source))
    assert all(rows == [] for rows in pg_rows(pg_url, tables).values())
    assert one(pg_url, "SELECT is_called FROM fences") is False


async def test_a_source_at_another_schema_version_is_refused(source: Path, pg_url: str) -> None:
    db = raw_db(source)
    db.execute(f"PRAGMA user_version = {newest_version() - 1}")
    db.close()
    with pytest.raises(StorageError, match=f"at schema version {newest_version() - 1} and"):
        copy_ledger(source, pg_url)
    assert one(pg_url, "SELECT count(*) FROM tasks") == 0


async def test_a_target_newer_than_the_code_is_refused(source: Path, pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(SchemaTooNew):
        copy_ledger(source, pg_url)


async def test_the_command_migrates_a_new_database_and_answers_one_line(source: Path) -> None:
    with pgdb.fresh_database() as url:
        line = run(f"sqlite:///{source}", url)
        assert line.startswith(f"copied {source} to {url} ")
        assert "\n" not in line
        with connect(url) as conn:
            assert schema_version(conn) == newest_version()
        assert one(url, "SELECT count(*) FROM tasks") == source_value(
            source, "SELECT count(*) FROM tasks"
        )
        with pytest.raises(AdminError, match="is not an empty ledger"):
            run(str(source), url)


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        ("mysql://x/db", "postgresql://h/db", "--from must be a SQLite ledger"),
        ("ledger.db", "sqlite:///other.db", "--to must be a postgresql:// URL"),
        ("ledger.db", "mysql://u:hunter2@h/db", "not 'mysql://u@h/db'"),
    ],
)
def test_the_command_refuses_arguments_of_the_wrong_kind(
    source: str, target: str, message: str
) -> None:
    with pytest.raises(AdminError, match=message) as caught:
        run(source, target)
    assert "hunter2" not in str(caught.value)


def test_a_missing_source_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(AdminError, match=r"^no ledger file at .*nothing\.db$"):
        run(str(tmp_path / "nothing.db"), "postgresql://u:hunter2@127.0.0.1:1/db")


def test_an_unreachable_target_is_one_line_without_the_password(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    sqlite3.connect(path).close()
    with pytest.raises(AdminError) as caught:
        run(str(path), "postgresql://u:hunter2@127.0.0.1:1/db")
    assert str(caught.value).startswith("cannot connect to postgresql://u@127.0.0.1:1/db: ")
    assert "hunter2" not in str(caught.value)
    assert not isinstance(caught.value.__cause__, psycopg.Error)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether.supervisor.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_the_cli_copies_then_check_passes_on_the_copy(source: Path) -> None:
    """The form scripts use: `tether-supervisor migrate --from ... --to ...`, then `check --db`
    on the result (issue 14: "`check` passes on the result")."""
    with pgdb.fresh_database() as url:
        copied = _cli("migrate", "--from", f"sqlite:///{source}", "--to", url)
        assert copied.returncode == 0, copied.stderr
        assert copied.stdout.startswith(f"copied {source} to {url} ")
        checked = _cli("check", "--db", url)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.startswith("ok: ")
        again = _cli("migrate", "--from", str(source), "--to", url)
        assert again.returncode == 1
        assert again.stdout == ""
        assert len(again.stderr.strip().splitlines()) == 1
        assert "is not an empty ledger" in again.stderr


def test_the_cli_refuses_a_postgresql_source_in_one_line() -> None:
    refused = _cli("migrate", "--from", "postgresql://u:hunter2@h/db", "--to", "postgresql://h/d")
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "--from must be a SQLite ledger" in refused.stderr
    assert "hunter2" not in refused.stderr


async def test_the_cli_reads_the_artifacts_from_the_folder_given(
    source: Path, tmp_path: Path
) -> None:
    """`--artifact-dir` for a supervisor that kept its artifacts elsewhere: the summary counts
    the files of that folder, and a folder that is not there copies none."""
    data = b"an artifact kept elsewhere"
    digest = hashlib.sha256(data).hexdigest()
    folder = tmp_path / "elsewhere"
    (folder / "sha256" / digest[:2]).mkdir(parents=True)
    (folder / "sha256" / digest[:2] / digest).write_bytes(data)
    with pgdb.fresh_database() as url:
        copied = _cli("migrate", "--from", str(source), "--to", url, "--artifact-dir", str(folder))
        assert copied.returncode == 0, copied.stderr
        assert copied.stdout.rstrip().endswith(f"; 1 artifacts ({len(data)} bytes)")
        # (the digest is 64 hex digits: safe to write into the statement)
        assert one(url, f"SELECT data FROM artifact_chunks WHERE digest = '{digest}'") == data
