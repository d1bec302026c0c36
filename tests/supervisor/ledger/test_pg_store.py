"""The ledger store on PostgreSQL, and several stores (supervisors) on one database: fences
from one sequence, claims never granting a step twice, wakeups and event watches across
stores, the reaper and the effect dispatcher never acting twice, token revocation seen by all,
and a lost connection reported as the ledger's `StorageError`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from tests import pgdb
from tests.conftest import FakeClock, make_spec, queued_task, report_for
from tests.plain import plain
from tether.settings import SettingsError
from tether.supervisor.api.auth import TokenCache
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.dispatcher import Dispatcher
from tether.supervisor.effects.registry import EffectKinds
from tether.supervisor.ledger import (
    Created,
    LedgerConfig,
    StepSpec,
    StorageError,
    TaskSpec,
    postgres,
)
from tether.supervisor.ledger.backend_protocol import EVERYTHING, Wakeup
from tether.supervisor.ledger.backends import LedgerUrlError, open_backend
from tether.supervisor.ledger.pg_schema import connect
from tether.supervisor.ledger.postgres import CHANNEL, PostgresBackend
from tether.supervisor.ledger.store import LedgerStore, open_ledger
from tether.supervisor.server import preflight
from tether.supervisor.settings import SupervisorSettings

pytestmark = pytest.mark.anyio

pg_url = pgdb.pg_url

CONFIG = LedgerConfig(lease_ttl_s=30, accept_window_s=10)


@contextlib.asynccontextmanager
async def stores(url: str, clock: FakeClock, n: int = 2) -> AsyncIterator[list[LedgerStore]]:
    """`n` stores on one database, as `n` supervisors would open it."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(open_ledger(url, clock=clock, config=CONFIG))
            for _ in range(n)
        ]


async def test_a_task_runs_end_to_end_on_postgresql(pg_url: str, clock: FakeClock) -> None:
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as ledger:
        spec = make_spec("k1", steps=2)
        created = await ledger.create_task(spec)
        assert created.created
        await ledger.approve(spec.tenant, created.task_id, spec.plan_hash, None)
        for name in ("s0", "s1"):
            [lease] = await ledger.claim("r1", "default", 4, 0)
            assert lease.name == name
            assert await ledger.report(report_for(lease)) == "applied"
        view = plain(await ledger.task(created.task_id))
        assert view["state"] == "SUCCEEDED"
        assert [s["state"] for s in view["steps"]] == ["committed", "committed"]
        assert await ledger.violations() == []
    # Reopened, the same ledger: the task is found by its idempotency key.
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as again:
        assert (await again.create_task(spec)) == Created(task_id=created.task_id, created=False)


async def test_fences_strictly_increase_whichever_store_grants_them(
    pg_url: str, clock: FakeClock
) -> None:
    async with stores(pg_url, clock) as (a, b):
        for i in range(6):
            await queued_task(a if i % 2 else b, key=f"k{i}")
        fences = []
        for i in range(6):
            [lease] = await (a if i % 2 == 0 else b).claim(f"r{i}", "default", 1, 0)
            fences.append(lease.fence)
        assert fences == sorted(set(fences)), fences


async def test_two_stores_claiming_one_queue_never_grant_a_step_twice(
    pg_url: str, clock: FakeClock
) -> None:
    async with stores(pg_url, clock) as (a, b):
        for i in range(24):
            await queued_task(a, key=f"k{i}")
        granted: list[str] = []

        async def claimer(store: LedgerStore, runner: str) -> None:
            while leases := await store.claim(runner, "default", 3, 0):
                granted.extend(lease.step_id for lease in leases)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(claimer, a, f"a{i}")
                tg.start_soon(claimer, b, f"b{i}")
        assert len(granted) == 24
        assert len(set(granted)) == 24


async def test_a_claim_waiting_on_one_store_wakes_when_another_queues_work(
    pg_url: str, clock: FakeClock
) -> None:
    async with stores(pg_url, clock) as (a, b):
        claimed: list[Any] = []
        done = anyio.Event()

        wait_s = 20  # woken within half of it: by the notification, not at the wait's end

        async def wait_on_a() -> None:
            claimed.extend(await a.claim("r1", "default", 1, wait_s))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_on_a)
            await anyio.sleep(0.3)  # the claim found nothing and waits
            started = time.monotonic()
            task_id = await queued_task(b)
            with anyio.fail_after(wait_s / 2):
                await done.wait()
        assert time.monotonic() - started < wait_s / 2
        assert claimed[0].task_id == task_id


async def test_an_event_watch_on_one_store_sees_commits_made_through_another(
    pg_url: str, clock: FakeClock
) -> None:
    async with stores(pg_url, clock) as (a, b):
        task_id = await queued_task(a)
        seen = plain(await a.events(task_id, None, 0, 0))
        after = seen[-1]["seq"]
        found: list[dict[str, Any]] = []

        async def watch_on_a() -> None:
            found.extend(plain(await a.events(task_id, None, after, 20)))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_on_a)
                await anyio.sleep(0.3)
                [lease] = await b.claim("r1", "default", 1, 0)
                await b.report(report_for(lease))
        assert found
        assert all(event["seq"] > after for event in found)


async def test_the_reapers_of_two_stores_expire_each_lease_once(
    pg_url: str, clock: FakeClock
) -> None:
    async with stores(pg_url, clock) as (a, b):
        for i in range(10):
            await queued_task(a, key=f"k{i}")
        leases = await a.claim("r1", "default", 10, 0)
        assert len(leases) == 10
        clock.advance(CONFIG.lease_ttl_s + 1)
        reaped: list[int] = []

        async def reap(store: LedgerStore) -> None:
            reaped.append(await store.expire())

        async with anyio.create_task_group() as tg:
            for store in (a, b, a, b):
                tg.start_soon(reap, store)
        assert sum(reaped) == 10
        again = await b.claim("r2", "default", 10, 0)
        assert sorted(lease.step_id for lease in again) == sorted(lease.step_id for lease in leases)
        assert all(lease.attempt == 2 for lease in again)


def effect_task(key: str) -> TaskSpec:
    deploy = {"url": "https://deploy.example/hook", "keyed": True, "deadline_s": 300}
    return TaskSpec(
        tenant="acme",
        idempotency_key=key,
        steps=(StepSpec(name="deploy", kind="http", payload=deploy),),
    )


async def test_the_dispatchers_of_two_stores_never_take_one_effect_twice(
    pg_url: str, clock: FakeClock
) -> None:
    kinds = EffectKinds(())
    holders = {
        Dispatcher(a_ledger, kinds, Credentials(None), hold_s=60).holder
        for a_ledger in (None, None)  # type: ignore[arg-type]
    }
    assert len(holders) == 2  # each process's dispatcher holds under its own id
    async with stores(pg_url, clock) as (a, b):
        for i in range(12):
            spec = effect_task(f"e{i}")
            task_id = (await a.create_task(spec)).task_id
            await a.approve("acme", task_id, spec.plan_hash, None)
        taken: dict[str, list[str]] = {"dA": [], "dB": []}

        async def take(store: LedgerStore, holder: str) -> None:
            while outs := await store.take_effects(holder, 2):
                taken[holder].extend(out.effect_id for out in outs)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, a, "dA")
            tg.start_soon(take, b, "dB")
        both = taken["dA"] + taken["dB"]
        assert len(both) == 12
        assert len(set(both)) == 12


async def test_a_token_revoked_through_one_store_is_refused_by_another_within_the_cache_ttl(
    pg_url: str, clock: FakeClock
) -> None:
    timer = FakeClock(0.0)
    async with stores(pg_url, clock) as (a, b):
        new = await a.create_token("acme", "operator")
        on_a = TokenCache(a, lifetime_s=1.0, timer=timer)
        assert (await on_a.principal(new.secret)) is not None
        await b.revoke_token(new.id)
        assert (await on_a.principal(new.secret)) is not None  # cached, for at most 1 s
        timer.advance(1.01)
        assert (await on_a.principal(new.secret)) is None


async def test_after_every_session_is_lost_reads_and_the_next_write_reconnect_unseen(
    pg_url: str, clock: FakeClock
) -> None:
    """Review finding 2: a server restart or failover ends every session. The read pool,
    grown by concurrent reads, hands out no dead connection, and the next write batch, whose
    BEGIN meets the lost connection before any rule ran, runs again on a new one."""
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as ledger:
        task_id = await queued_task(ledger)
        async with anyio.create_task_group() as tg:
            for _ in range(8):  # the pool grows to its largest
                tg.start_soon(ledger.queue_depth)
        with connect(pg_url) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert killed is not None
        assert killed[0] >= 4  # the writer, the listener, two readers at least
        for _ in range(postgres.READ_CONNECTIONS + 1):
            assert plain(await ledger.task(task_id))["state"] == "QUEUED"
        await ledger.cancel("acme", task_id, "no longer wanted")
        assert plain(await ledger.task(task_id))["state"] == "CANCELLED"
        assert ledger.is_open


async def test_a_write_that_cannot_reconnect_is_a_storage_error_and_the_next_one_reconnects(
    pg_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as ledger:
        task_id = await queued_task(ledger)
        backend = ledger.backend
        assert isinstance(backend, PostgresBackend)
        reconnect = backend.live
        refused = psycopg.OperationalError("the server is still starting")

        def not_yet(db: Any) -> Any:
            if db.conn.closed:
                raise refused
            return db

        monkeypatch.setattr(backend, "live", not_yet)
        with connect(pg_url) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        with pytest.raises(StorageError) as lost:
            await ledger.cancel("acme", task_id, "no longer wanted")
        assert lost.value.__cause__ is refused
        assert ledger.is_open  # a storage error fails the batch, not the writer
        monkeypatch.setattr(backend, "live", reconnect)
        await ledger.cancel("acme", task_id, "no longer wanted")  # on a new connection
        assert plain(await ledger.task(task_id))["state"] == "CANCELLED"


async def test_a_lost_listener_reconnects_and_wakes_its_waiting_claims(
    pg_url: str, clock: FakeClock
) -> None:
    async with stores(pg_url, clock) as (a, b):
        claimed: list[Any] = []
        done = anyio.Event()

        async def wait_on_a() -> None:
            claimed.extend(await a.claim("r1", "default", 1, 20))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_on_a)
            await anyio.sleep(0.3)
            with connect(pg_url) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
                )
            # Queued while A hears nothing: A's claim finds it once its listener is back.
            await queued_task(b)
            with anyio.fail_after(5):
                await done.wait()
        assert len(claimed) == 1


async def test_a_listener_back_from_a_lost_connection_wakes_everything_once(
    pg_url: str,
) -> None:
    backend = PostgresBackend(pg_url)
    heard, hearing = anyio.create_memory_object_stream[Wakeup](8)
    async with backend.listen(heard.send_nowait):
        with connect(pg_url) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
            )
        with anyio.fail_after(5):
            # A notification may have been missed while it was gone.
            assert await hearing.receive() == EVERYTHING
        payload = '{"origin":"x","pools":["p"],"events":false}'
        with connect(pg_url) as other:  # another process's commit is heard again
            other.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
        with anyio.fail_after(5):
            assert await hearing.receive() == Wakeup(frozenset({"p"}), events=False)
    heard.close()
    hearing.close()


async def test_a_batch_waiting_too_long_for_the_lock_fails_alone(
    pg_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor stuck holding the write lock never blocks the others for good."""
    monkeypatch.setattr(postgres, "LOCK_TIMEOUT_S", 0.3)
    async with open_ledger(pg_url, clock=clock, config=CONFIG) as ledger:
        with connect(pg_url) as stuck:
            stuck.execute("SELECT pg_advisory_lock(%s)", (postgres.LEDGER_LOCK,))
            with pytest.raises(StorageError, match="lock timeout"):
                await queued_task(ledger)
        await queued_task(ledger)  # the lock is free again: so is the ledger


async def test_a_database_that_cannot_be_reached_is_one_storage_error(clock: FakeClock) -> None:
    url = "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2"
    with pytest.raises(StorageError, match="cannot connect"):
        async with open_ledger(url, clock=clock):
            pass


@pytest.mark.parametrize(
    ("db", "message"),
    [
        ("mysql://x/y", "scheme 'mysql' is not supported"),
        ("sqlite:///", "names no file"),
        ("", "empty"),
    ],
)
def test_a_db_that_names_no_storage_is_one_clear_line(db: str, message: str) -> None:
    with pytest.raises(LedgerUrlError, match=message):
        open_backend(db)


def test_settings_keep_a_database_url_and_read_a_sqlite_url_as_its_file() -> None:
    url = "postgresql://tether:pw@db.internal:5432/ledger"
    on_pg = SupervisorSettings(db=url)
    assert on_pg.db == url  # a Path would fold its '//'
    assert on_pg.artifact_root == Path("artifacts")
    on_file = SupervisorSettings(db="sqlite:///var/tether/l.db")
    assert on_file.db == Path("var/tether/l.db")
    assert on_file.artifact_root == Path("var/tether/artifacts")
    with pytest.raises(SettingsError, match="setting 'db': ledger URL scheme 'mysql'"):
        SupervisorSettings(db="mysql://x/y")


def test_serve_preflight_migrates_a_database_and_names_it_without_its_password(
    pg_url: str,
) -> None:
    assert preflight(SupervisorSettings(db=pg_url)) is None
    refused = preflight(SupervisorSettings(db="postgresql://postgres:s3cret@127.0.0.1:1/x"))
    assert refused is not None
    assert "refused" in refused
    assert "s3cret" not in refused
