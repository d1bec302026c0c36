"""`tether.broadcast.Broadcast`: one fire wakes every waiter armed before it, and only those."""

from __future__ import annotations

import anyio

from tether.broadcast import Broadcast


async def test_a_fire_wakes_every_waiter_armed_before_it() -> None:
    signal = Broadcast()
    woken: list[int] = []

    async def waiter(n: int) -> None:
        await signal.armed().wait()
        woken.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(waiter, n)
        await anyio.wait_all_tasks_blocked()
        signal.fire()
    assert sorted(woken) == [0, 1, 2]


async def test_a_fire_between_the_look_and_the_wait_is_not_lost() -> None:
    signal = Broadcast()
    armed = signal.armed()  # before looking
    signal.fire()  # lands while the waiter is still looking
    with anyio.fail_after(1):
        await signal.wait(armed, 5)
    assert armed.is_set()
    assert not signal.armed().is_set()  # armed after the fire: waits for the next one


async def test_wait_gives_up_after_its_seconds() -> None:
    signal = Broadcast()
    armed = signal.armed()
    with anyio.fail_after(1):
        await signal.wait(armed, 0.01)
    assert not armed.is_set()


async def test_wait_for_returns_once_the_condition_holds() -> None:
    signal = Broadcast()
    state = {"n": 0}
    done = anyio.Event()

    async def waiter() -> None:
        await signal.wait_for(lambda: state["n"] >= 2)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        for n in (1, 2):
            await anyio.wait_all_tasks_blocked()
            assert not done.is_set()
            state["n"] = n
            signal.fire()
        with anyio.fail_after(1):
            await done.wait()
    assert state["n"] == 2
