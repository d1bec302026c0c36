"""The event journal (docs/design.md, Event journal): one strictly increasing sequence, `after`
filtering, and a
long-poll that wakes on a new event."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.conftest import FakeClock, make_spec, queued_task, report_for
from tests.plain import plain
from tether.supervisor.ledger import NotFound, SqliteLedger

pytestmark = pytest.mark.backends


async def test_seq_strictly_increases_across_the_whole_ledger(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    first = await queued_task(ledger, "a", steps=2)
    second = await queued_task(ledger, "b")
    for _ in range(3):
        for lease in await ledger.claim("r1", "default", 5, 0):
            await ledger.report(report_for(lease))
    await ledger.cancel("acme", (await ledger.create_task(make_spec("c"))).task_id, "no")
    # Across tasks, in the order things happened: each task's view after each operation
    # carries a seq above every seq any earlier view carried.
    seen: list[int] = []
    for key in ("d", "e", "f"):
        task_id = await queued_task(ledger, key)
        seen.append(plain(await ledger.task(task_id))["seq"])
        [lease] = await ledger.claim("r1", "default", 1, 0)
        await ledger.report(report_for(lease))
        seen.append(plain(await ledger.task(lease.task_id))["seq"])
    assert seen == sorted(set(seen))
    for task_id in (first, second):
        events = plain(await ledger.events(task_id, None, 0, 0))
        assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
        view = plain(await ledger.task(task_id))
        assert view["seq"] == events[-1]["seq"]
        assert events[-1]["state"] == view["state"] == "SUCCEEDED"


async def test_after_returns_only_later_events(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    everything = plain(await ledger.events(task_id, None, 0, 0))
    assert [e["state"] for e in everything] == ["PLANNED", "APPROVED", "QUEUED"]
    middle = everything[1]["seq"]
    assert plain(await ledger.events(task_id, None, middle, 0)) == everything[2:]
    assert plain(await ledger.events(task_id, None, everything[-1]["seq"], 0)) == []
    # A consumer that replays an older seq gets nothing at or below what it asked for.
    assert all(e["seq"] > middle for e in plain(await ledger.events(task_id, None, middle, 0)))


async def test_events_belong_to_their_tenant(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    assert len(plain(await ledger.events(task_id, "acme", 0, 0))) == 3
    try:
        plain(await ledger.events(task_id, "globex", 0, 0))
    except NotFound:
        pass
    else:
        raise AssertionError("another tenant read the journal")


async def test_the_long_poll_wakes_on_a_new_event(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    last = plain(await ledger.events(task_id, None, 0, 0))[-1]["seq"]
    waiting = anyio.Event()
    original = ledger._events.wait

    async def wait(*args: Any, **kwargs: Any) -> None:
        waiting.set()
        await original(*args, **kwargs)

    ledger._events.wait = wait  # type: ignore[method-assign]
    got: list[dict[str, Any]] = []

    async def poll() -> None:
        got.extend(plain(await ledger.events(task_id, None, last, 60)))

    with anyio.fail_after(10):  # far below the 60 s wait: only the wake-up can end it in time
        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await waiting.wait()
            await ledger.claim("r1", "default", 1, 0)
    assert [e["kind"] for e in got][:1] == ["state"]
    assert got[0]["state"] == "RUNNING"
    assert all(e["seq"] > last for e in got)


async def test_a_commit_between_the_look_and_the_sleep_still_wakes_the_long_poll(
    ledger: SqliteLedger,
) -> None:
    """The poller reads nothing; before it goes to sleep a commit lands (and fires its wake-up).
    It must not then sleep through that event for the whole wait."""
    task_id = await queued_task(ledger)
    last = plain(await ledger.events(task_id, None, 0, 0))[-1]["seq"]
    original = ledger.read
    interfered = False

    async def read_then_commit(query: Any) -> Any:
        nonlocal interfered
        found = await original(query)
        if not interfered and found == []:
            interfered = True
            await ledger.cancel("acme", task_id, "stop")
        return found

    ledger.read = read_then_commit  # type: ignore[method-assign]
    with anyio.fail_after(10):  # far below the 60 s wait
        got = plain(await ledger.events(task_id, None, last, 60))
    assert interfered
    assert [e["state"] for e in got] == ["CANCELLED"]


async def test_the_long_poll_answers_empty_after_wait_s(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    last = plain(await ledger.events(task_id, None, 0, 0))[-1]["seq"]
    started = anyio.current_time()
    with anyio.fail_after(10):
        assert plain(await ledger.events(task_id, None, last, 0.05)) == []
    assert anyio.current_time() - started >= 0.05  # it did wait, then answered empty
