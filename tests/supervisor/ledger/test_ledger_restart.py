"""Restart and storage (issue 2): nothing committed is lost, the fence counter stays above every
fence ever issued, open leases keep the time they had left when no supervisor served, and a
damaged or too-new file is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import FakeClock, ledger_rows, open_ledger, queued_task, raw_db, report_for
from tests.plain import plain
from tether.supervisor.ledger import (
    IntegrityCheckFailed,
    NotFound,
    SchemaTooNew,
    SqliteLedger,
    StorageError,
    schema,
)
from tether.supervisor.ledger.reaper import ALIVE_GRACE_S
from tether.supervisor.ledger.schema import migrations, open_ledger_file
from tether.wire import Outcome

pytestmark = pytest.mark.backends


async def test_a_reopened_ledger_has_lost_nothing(ledger_db: Path | str, clock: FakeClock) -> None:
    async with open_ledger(ledger_db, clock) as ledger:
        done = await queued_task(ledger, "done", steps=2)
        for _ in range(2):
            [lease] = await ledger.claim("r1", "default", 1, 0)
            await ledger.report(report_for(lease, output=f"out-{lease.step_id}"))
        midway = await queued_task(ledger, "midway", steps=2)
        [lease] = await ledger.claim("r1", "default", 1, 0)
        await ledger.report(report_for(lease))
        before = {t: plain(await ledger.task(t)) for t in (done, midway)}
        events = {t: plain(await ledger.events(t, None, 0, 0)) for t in (done, midway)}
    async with open_ledger(ledger_db, clock) as ledger:
        assert {t: plain(await ledger.task(t)) for t in (done, midway)} == before
        assert {t: plain(await ledger.events(t, None, 0, 0)) for t in (done, midway)} == events
        assert before[done]["state"] == "SUCCEEDED"
        # The committed step replays; the next step is still there to run.
        assert await ledger.report(report_for(lease)) is Outcome.REPLAYED
        [nxt] = await ledger.claim("r1", "default", 1, 0)
        assert nxt.step_id == f"{midway}.1"
        assert nxt.outputs[0].output == "done"
        assert await ledger.violations() == []


@pytest.mark.parametrize("counter", [0, 1, None], ids=["reset", "behind", "normal"])
async def test_the_fence_counter_continues_above_every_fence_ever_issued(
    ledger_db: Path | str, clock: FakeClock, counter: int | None
) -> None:
    async with open_ledger(ledger_db, clock) as ledger:
        for i in range(3):
            await queued_task(ledger, f"k{i}")
        leases = await ledger.claim("r1", "default", 3, 0)
        await ledger.report(report_for(leases[0]))
    issued = max(lease.fence for lease in leases)
    if counter is not None and isinstance(ledger_db, Path):
        ledger_rows(ledger_db, "UPDATE counters SET value = ? WHERE name = 'fence'", (counter,))
    elif counter is not None:  # the sequence's next value is what the counter's would be
        ledger_rows(ledger_db, "SELECT setval('fences', ?, false)", (counter + 1,))
    clock.advance(3600)
    async with open_ledger(ledger_db, clock) as ledger:
        await queued_task(ledger, "after")
        [fresh] = await ledger.claim("r1", "default", 1, 0)
        assert fresh.fence > issued
        assert await ledger.violations() == []


@pytest.mark.sqlite_only("a backup copied as a file (PostgreSQL's is pg_dump, the operator's)")
async def test_a_ledger_restored_from_a_backup_never_hands_out_a_fence_again(
    ledger_path: Path, tmp_path: Path, clock: FakeClock
) -> None:
    """The backup knows nothing of the grants after it; a runner may still hold one of them.
    The same step, granted again after the restore, gets another fence, so that runner's
    renew and result are refused: `not_found`, since the restored ledger holds no attempt
    under that fence (a lease it never granted is no lease), and the runner drops the step."""
    backup = tmp_path / "backup.db"
    async with open_ledger(ledger_path, clock) as ledger:
        await queued_task(ledger, "k")
    shutil.copyfile(ledger_path, backup)  # closed: the file holds everything
    clock.advance(60)  # a restart after the backup, then a grant, then the file is lost
    async with open_ledger(ledger_path, clock) as ledger:
        [after_backup] = await ledger.claim("r1", "default", 1, 0)
    clock.advance(0.001)  # restored and started again, however soon
    shutil.copyfile(backup, ledger_path)
    async with open_ledger(ledger_path, clock) as ledger:
        [again] = await ledger.claim("r2", "default", 1, 0)
        assert again.step_id == after_backup.step_id
        assert again.fence > after_backup.fence
        with pytest.raises(NotFound):
            await ledger.renew(after_backup.step_id, after_backup.fence)
        with pytest.raises(NotFound):
            await ledger.report(report_for(after_backup))
        assert await ledger.report(report_for(again)) is Outcome.APPLIED


async def test_open_leases_are_moved_later_by_the_time_no_supervisor_served(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    """The supervisor was down far longer than any TTL: each lease keeps the time it had left
    when the last stamp of 'alive' was made (less the grace), from the new clock."""
    async with open_ledger(ledger_db, clock) as ledger:  # its start stamps 'alive'
        task_id = await queued_task(ledger)
        [lease] = await ledger.claim("r1", "default", 1, 0)
        await ledger.renew(lease.step_id, lease.fence)
        left = await ledger.next_deadline() - clock.now
    clock.advance(10_000)
    async with open_ledger(ledger_db, clock) as ledger:
        assert await ledger.expire() == 0
        assert await ledger.next_deadline() == pytest.approx(clock.now + left - ALIVE_GRACE_S)
        clock.advance(left - ALIVE_GRACE_S - 1)
        assert await ledger.expire() == 0
        assert (await ledger.renew(lease.step_id, lease.fence)).cancelled is False
        assert await ledger.report(report_for(lease)) is Outcome.APPLIED
        assert plain(await ledger.task(task_id))["state"] == "SUCCEEDED"


async def test_an_unacknowledged_lease_keeps_its_acceptance_window_across_an_outage(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    async with open_ledger(ledger_db, clock) as ledger:
        await queued_task(ledger)
        await ledger.claim("r1", "default", 1, 0)
    clock.advance(10_000)
    async with open_ledger(ledger_db, clock) as ledger:
        assert await ledger.expire() == 0
        clock.advance(10 - ALIVE_GRACE_S)
        assert await ledger.expire() == 1


async def test_a_crash_looping_supervisor_never_keeps_a_lost_runners_lease_alive(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    """Review finding 1: a restart once gave every open lease a fresh TTL, so a supervisor
    restarting more often than once a TTL kept a dead runner's step leased for ever. Its
    reaper stamped 'alive' each second up to the crash: a restart 1 s later moves nothing."""
    async with open_ledger(ledger_db, clock) as ledger:
        await queued_task(ledger)
        [lease] = await ledger.claim("r1", "default", 1, 0)
        await ledger.renew(lease.step_id, lease.fence)  # then the runner dies
    deadline = clock.now + 30
    reaped = 0
    while reaped == 0 and clock.now < deadline + 60:
        clock.advance(1)  # down for a second, then up for 20 s of reaper turns
        async with open_ledger(ledger_db, clock) as ledger:
            for _ in range(20):
                reaped += await ledger.expire()
                if reaped:
                    break
                clock.advance(1)
    assert reaped == 1
    assert clock.now <= deadline + 10  # each restart moved it by at most a second


async def test_a_ledger_never_stamped_alive_gives_open_leases_a_fresh_ttl(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    """A ledger from before the stamp cannot tell how long it was unattended: as then, each
    open lease gets a fresh TTL."""
    async with open_ledger(ledger_db, clock) as ledger:
        await queued_task(ledger)
        [lease] = await ledger.claim("r1", "default", 1, 0)
        await ledger.renew(lease.step_id, lease.fence)
    ledger_rows(ledger_db, "DELETE FROM counters WHERE name = 'alive'")
    clock.advance(10_000)
    async with open_ledger(ledger_db, clock) as ledger:
        assert await ledger.next_deadline() == clock.now + 30
    assert ledger_rows(ledger_db, "SELECT value FROM counters WHERE name = 'alive'") == [
        (int(clock.now * 1_000_000),)
    ]


async def closed_ledger_with_data(path: Path, clock: FakeClock) -> None:
    async with open_ledger(path, clock) as ledger:
        for i in range(40):
            spec_key = f"task-{i}-" + "x" * 150
            await queued_task(ledger, spec_key, steps=4)


def overwrite(path: Path, offset: int, length: int) -> None:
    assert path.stat().st_size > offset + length  # garbage over pages, not past the end
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(bytes((i * 37 + 11) % 256 for i in range(length)))


@pytest.mark.sqlite_only("bytes of the file overwritten")
@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 100), (4096, 8192), (4096 * 5, 4096 * 3)],
    ids=["header", "pages-2-3", "pages-6-8"],
)
async def test_a_corrupted_file_is_refused_with_a_storage_error(
    ledger_path: Path, clock: FakeClock, offset: int, length: int
) -> None:
    await closed_ledger_with_data(ledger_path, clock)
    overwrite(ledger_path, offset, length)
    with pytest.raises(StorageError) as caught:
        async with open_ledger(ledger_path, clock):
            pass
    assert isinstance(caught.value, IntegrityCheckFailed)
    assert caught.value.detail
    assert "\n" not in caught.value.detail


@pytest.mark.sqlite_only("bytes of the file overwritten")
async def test_open_ledger_file_itself_refuses_a_damaged_file(
    ledger_path: Path, clock: FakeClock
) -> None:
    await closed_ledger_with_data(ledger_path, clock)
    overwrite(ledger_path, 4096, 8192)
    with pytest.raises(IntegrityCheckFailed):
        open_ledger_file(ledger_path)


@pytest.mark.sqlite_only(
    "the file's user_version (PostgreSQL's: tests/supervisor/ledger/test_pg_schema.py)"
)
async def test_a_schema_newer_than_the_code_is_refused(ledger_path: Path, clock: FakeClock) -> None:
    async with open_ledger(ledger_path, clock):
        pass
    newest = migrations()[-1][0]
    db = raw_db(ledger_path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == newest
    db.execute(f"PRAGMA user_version = {newest + 1}")
    db.close()
    with pytest.raises(SchemaTooNew):
        async with open_ledger(ledger_path, clock):
            pass
    db = raw_db(ledger_path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == newest + 1
    db.close()


@pytest.mark.sqlite_only("the file's user_version and WAL journal (pg_schema's tests: PostgreSQL)")
async def test_a_fresh_file_is_migrated_to_the_newest_schema(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    db = raw_db(ledger_path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == migrations()[-1][0]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


@pytest.mark.sqlite_only("SQLite's writable_schema and integrity check")
@pytest.mark.parametrize(
    "sql",
    ["CREATE garbage", "CAST(X'435245415445d3d3' AS TEXT)"],
    ids=["malformed-schema", "schema-not-utf8"],
)
async def test_a_damaged_schema_is_refused_with_integrity_check_failed(
    ledger_path: Path, clock: FakeClock, sql: str
) -> None:
    async with open_ledger(ledger_path, clock):
        pass
    db = raw_db(ledger_path)
    db.execute("PRAGMA writable_schema = ON")
    value = sql if sql.startswith("CAST") else f"'{sql}'"
    db.execute(f"UPDATE sqlite_schema SET sql = {value} WHERE name = 'tasks_by_state'")
    db.close()
    with pytest.raises(IntegrityCheckFailed) as caught:
        open_ledger_file(ledger_path)
    assert "damaged" in caught.value.detail


@pytest.mark.sqlite_only("a file path")
async def test_a_file_that_cannot_be_opened_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as caught:
        open_ledger_file(tmp_path)  # a directory
    assert str(tmp_path) in caught.value.detail


@pytest.mark.sqlite_only("SQLite's integrity check")
def test_integrity_problems_are_reported_on_one_line(
    ledger_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        schema,
        "integrity_problems",
        lambda db: ["*** in database main ***\nOn tree page 36 cell 24: Rowid 43 out of order"],
    )
    with pytest.raises(IntegrityCheckFailed) as caught:
        open_ledger_file(ledger_path)
    assert "\n" not in caught.value.detail
    assert "Rowid 43 out of order" in caught.value.detail
