"""The dispatcher (supervisor/effects/dispatcher.py) against an in-memory outbox: the attempt
loop, retries bounded by the deadline, Retry-After, unkeyed effects sent at most once, hand-back
at shutdown, ledger refusals and the concurrency bound."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from supervisor.effects.credentials import Credentials
from supervisor.effects.dispatcher import DEADLINE_REASON, UNKNOWN_KIND_REASON, Dispatcher
from supervisor.effects.registry import EffectKinds, RetryLater
from supervisor.ledger.outbox import Delivered, Refused, Unanswered

from .effects_fakes import FakeOutbox, Scripted, outgoing

OK = Delivered(status=200, detail="HTTP 200")
BUSY = Unanswered(detail="HTTP 503", sent=True, status=503)
DOWN = Unanswered(detail="not connected", sent=False)


def dispatcher(outbox: FakeOutbox, *deliverers: Scripted, **extra: Any) -> Dispatcher:
    extra.setdefault("retry_base_s", 0.01)
    extra.setdefault("poll_s", 0.05)
    return Dispatcher(
        outbox,
        EffectKinds(deliverers),
        Credentials(None),
        hold_s=extra.pop("hold_s", 60.0),
        clock=time.time,
        **extra,
    )


@asynccontextmanager
async def running(d: Dispatcher) -> AsyncIterator[anyio.CancelScope]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.run)
        yield tg.cancel_scope
        tg.cancel_scope.cancel()


async def until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    with anyio.fail_after(within_s):
        while not condition():  # noqa: ASYNC110 (plain state, no event)
            await anyio.sleep(0.005)


def soon(seconds: float = 60.0) -> float:
    return time.time() + seconds


@pytest.fixture
def outbox() -> FakeOutbox:
    return FakeOutbox(clock=time.time)


async def test_a_delivered_effect_is_sent_once_and_recorded(outbox: FakeOutbox) -> None:
    script = Scripted([OK])
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "delivered")
    assert script.calls == ["e1"]
    assert outbox.log == [("take", "e1"), ("begin", "e1"), ("record", "e1")]
    assert outbox.rows["e1"].attempts == [OK]


async def test_unanswered_is_tried_again_until_an_answer(outbox: FakeOutbox) -> None:
    script = Scripted([BUSY, DOWN, OK])
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "delivered")
    assert outbox.rows["e1"].attempts == [BUSY, DOWN, OK]


async def test_a_refusal_fails_the_effect_at_once(outbox: FakeOutbox) -> None:
    refused = Refused(status=404, detail="HTTP 404", code="receiver_refused")
    script = Scripted([refused])
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "failed")
    assert (script.calls, outbox.rows["e1"].reason) == (["e1"], "receiver_refused")


async def test_the_deadline_bounds_the_retries(outbox: FakeOutbox) -> None:
    script = Scripted([BUSY])
    outbox.add(outgoing(deadline_at=soon(0.4)))
    started = time.monotonic()
    async with running(dispatcher(outbox, script, retry_base_s=0.05)):
        await until(lambda: outbox.rows["e1"].state == "failed")
    assert outbox.rows["e1"].reason == DEADLINE_REASON
    assert 2 <= len(script.calls) <= 12
    assert time.monotonic() - started < 1.0  # given up before any attempt after the deadline
    assert outbox.log[-1] == ("give_up", "e1")


async def test_an_effect_past_its_deadline_is_never_attempted(outbox: FakeOutbox) -> None:
    script = Scripted([OK])
    outbox.add(outgoing(deadline_at=time.time() - 1))
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "failed")
    assert script.calls == []
    assert outbox.rows["e1"].attempts == []


async def test_retry_after_is_honoured_and_recorded_as_unanswered(outbox: FakeOutbox) -> None:
    later = RetryLater(detail="HTTP 429", sent=True, status=429, retry_after_s=0.4)
    script = Scripted([later, OK])
    outbox.add(outgoing(deadline_at=soon()))
    started = time.monotonic()
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "delivered")
    assert time.monotonic() - started >= 0.4
    first = outbox.rows["e1"].attempts[0]
    assert type(first) is Unanswered
    assert first == Unanswered(detail="HTTP 429", sent=True, status=429)


async def test_retry_after_is_honoured_only_up_to_a_quarter_of_the_hold(
    outbox: FakeOutbox,
) -> None:
    later = RetryLater(detail="HTTP 429", sent=True, status=429, retry_after_s=600)
    script = Scripted([later, OK])
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script, hold_s=0.8)):
        await until(lambda: outbox.rows["e1"].state == "delivered", within_s=2)


async def test_an_unkeyed_effect_that_may_have_sent_is_never_sent_again(
    outbox: FakeOutbox,
) -> None:
    script = Scripted([BUSY, OK])
    outbox.add(outgoing(keyed=False, deadline_at=soon()))
    d = dispatcher(outbox, script)
    async with running(d):
        await until(lambda: len(outbox.rows["e1"].attempts) == 1 and not d.in_flight)
        await anyio.sleep(0.1)
    assert script.calls == ["e1"]
    assert ("give_up", "e1") not in outbox.log


async def test_an_unkeyed_effect_that_never_connected_is_tried_again(outbox: FakeOutbox) -> None:
    script = Scripted([DOWN, OK])
    outbox.add(outgoing(keyed=False, deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "delivered")
    assert outbox.rows["e1"].attempts == [DOWN, OK]


async def test_a_deliverer_that_raises_counts_as_unanswered_and_sent(outbox: FakeOutbox) -> None:
    script = Scripted([RuntimeError("bug"), OK])
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: outbox.rows["e1"].state == "delivered")
    first = outbox.rows["e1"].attempts[0]
    assert isinstance(first, Unanswered)
    assert first.sent
    assert "RuntimeError" in first.detail


async def test_shutdown_hands_back_the_effect_in_hand(outbox: FakeOutbox) -> None:
    script = Scripted([OK], hang=anyio.Event())
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: script.calls == ["e1"])
    assert outbox.rows["e1"].state == "due"
    assert outbox.log[-1] == ("release", "e1")


async def test_an_effect_no_longer_held_ends_quietly_and_the_rest_go_on(
    outbox: FakeOutbox,
) -> None:
    gate = anyio.Event()
    script = Scripted([OK], hang=gate)
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script)):
        await until(lambda: script.calls == ["e1"])
        outbox.rows["e1"].ended = True  # the task was cancelled while the send was in flight
        gate.set()
        outbox.add(outgoing(effect_id="e2", deadline_at=soon()))
        await until(lambda: outbox.rows["e2"].state == "delivered")
    assert outbox.rows["e1"].state == "sending"  # left to the ledger's rules
    assert ("record", "e1") not in outbox.log


async def test_an_effect_of_a_kind_nobody_delivers_is_given_up(outbox: FakeOutbox) -> None:
    outbox.add(outgoing(kind="slack", deadline_at=soon()))
    async with running(dispatcher(outbox, Scripted([OK]))):
        await until(lambda: outbox.rows["e1"].state == "failed")
    assert outbox.rows["e1"].reason == UNKNOWN_KIND_REASON


async def test_concurrency_bounds_the_effects_in_delivery(outbox: FakeOutbox) -> None:
    gate = anyio.Event()
    script = Scripted([OK], hang=gate)
    for i in range(12):
        outbox.add(outgoing(effect_id=f"e{i}", deadline_at=soon()))
    async with running(dispatcher(outbox, script, concurrency=5)):
        await until(lambda: len(script.calls) == 5)
        await anyio.sleep(0.1)
        assert len(script.calls) == 5
        assert sum(row.state == "due" for row in outbox.rows.values()) == 7
        gate.set()
        await until(lambda: all(row.state == "delivered" for row in outbox.rows.values()))
    assert sorted(script.calls) == sorted(f"e{i}" for i in range(12))


async def test_a_held_effect_taken_again_by_its_own_holder_is_not_sent_twice(
    outbox: FakeOutbox,
) -> None:
    """A hold that lapsed while the attempt was slow is taken again by the same dispatcher:
    the delivery already in hand goes on, no second one starts."""
    gate = anyio.Event()
    script = Scripted([OK], hang=gate)
    outbox.hold_s = 0.05
    outbox.add(outgoing(deadline_at=soon()))
    async with running(dispatcher(outbox, script, hold_s=10.0)):
        await until(lambda: outbox.log.count(("take", "e1")) >= 2)
        gate.set()
        await until(lambda: outbox.rows["e1"].state == "delivered")
    assert script.calls == ["e1"]


async def test_a_ledger_without_effects_stays_idle(outbox: FakeOutbox) -> None:
    script = Scripted([OK])
    async with running(dispatcher(outbox, script)):
        await anyio.sleep(0.2)
    assert script.calls == []
    assert outbox.log == []
