"""When the ledger's storage fails under the supervisor: the reaper outlives a failing write,
and a ledger that closed by itself stops the supervisor (exit 1) instead of leaving a process
that answers every call with an error while systemd's watchdog still hears from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from tests.conftest import FakeClock, count, queued_task
from tether.supervisor import server, service
from tether.supervisor.api import create_app
from tether.supervisor.ledger import SqliteLedger, StorageError
from tether.supervisor.settings import SupervisorSettings


async def test_the_reaper_outlives_failing_writes_and_reaps_once_they_pass(
    ledger: SqliteLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await queued_task(ledger)
    [lease] = await ledger.claim("runner-a", "default", 1, 0)
    clock.advance(31)  # past its deadline: the reaper's next turn requeues it
    real_expire = ledger.expire
    failures = []
    reaped = anyio.Event()

    async def expire() -> int:
        if len(failures) < 2:  # say, the disk is full for the reaper's first two turns
            failures.append(1)
            raise StorageError("the ledger could not commit: database or disk is full")
        expired = await real_expire()
        if expired:
            reaped.set()
        return expired

    monkeypatch.setattr(ledger, "expire", expire)
    monkeypatch.setattr(service, "REAP_EVERY_MAX_S", 0.01)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.reap_forever, ledger)
            await reaped.wait()
            tg.cancel_scope.cancel()
    assert len(failures) == 2
    assert ledger.is_open
    assert count(ledger.path, "attempts", "state = 'expired'") == 1
    [again] = await ledger.claim("runner-b", "default", 1, 0)
    assert (again.step_id, again.fence > lease.fence) == (lease.step_id, True)


async def test_is_open_is_true_only_while_the_ledger_is_open(ledger_path: Path) -> None:
    async with SqliteLedger.open(ledger_path) as ledger:
        assert ledger.is_open
    assert not ledger.is_open


@dataclasses.dataclass
class FakeServer:
    started: bool = True
    should_exit: bool = False


@dataclasses.dataclass
class FakeLedger:
    is_open: bool = True


async def test_a_ledger_that_closes_while_serving_stops_the_server_as_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(server, "LEDGER_CHECK_EVERY_S", 0.01)
    app = create_app(SupervisorSettings(db=tmp_path / "l.db"))
    fake_server: Any = FakeServer()
    ledger = FakeLedger()
    app.state.ledger = ledger
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server._stop_if_the_ledger_closes, fake_server, app)
            await anyio.sleep(0.05)
            assert not fake_server.should_exit  # an open ledger: nothing happens
            ledger.is_open = False
    assert fake_server.should_exit
    assert app.state.failed is True


async def test_a_stop_asked_for_is_not_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(server, "LEDGER_CHECK_EVERY_S", 0.01)
    app: Starlette = create_app(SupervisorSettings(db=tmp_path / "l.db"))
    fake_server: Any = FakeServer()
    app.state.ledger = FakeLedger(is_open=False)
    fake_server.should_exit = True  # SIGTERM came first; the lifespan then closes the ledger
    with anyio.fail_after(5):
        await server._stop_if_the_ledger_closes(fake_server, app)
    assert not getattr(app.state, "failed", False)


async def test_healthz_fails_once_the_ledger_has_closed(tmp_path: Path) -> None:
    app = create_app(SupervisorSettings(db=tmp_path / "l.db"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sup") as client:
        app.state.ledger = FakeLedger(is_open=True)
        assert (await client.get("/healthz")).status_code == 200
        app.state.ledger = FakeLedger(is_open=False)
        answer = await client.get("/healthz")
        assert answer.status_code == 503
        assert answer.json()["error"] == "unavailable"


async def test_a_bug_in_the_reapers_rules_is_not_retried_silently(
    ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the storage failing is waited out; a crashed rule ends the reaper (and with it the
    ledger, and `serve` with exit 1), instead of a process that looks alive and expires nothing."""
    from tether.supervisor.ledger.batch import RuleCrashed

    async def expire() -> int:
        raise RuleCrashed("KeyError: 'lease_deadline'")

    monkeypatch.setattr(ledger, "expire", expire)
    with anyio.fail_after(5), pytest.raises(RuleCrashed):
        await service.reap_forever(ledger)
