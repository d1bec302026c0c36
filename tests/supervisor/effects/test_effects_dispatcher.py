"""The dispatcher (supervisor/effects/dispatcher.py) against an in-memory outbox: the attempt
loop, retries bounded by the deadline, Retry-After, unkeyed effects sent at most once, hand-back
at shutdown, ledger refusals and the concurrency bound."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from examples.processes import child_environment, free_port
from examples.receiver import ReceiverState, create_app
from tests.conftest import LEDGER_CONFIG, FakeClock, count, raw_db, report_for
from tests.effects_fakes import FakeOutbox, Scripted, SlackDeliverer, http_deliverer, outgoing
from tests.plain import plain
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.dispatcher import RECORD_TRIES, Dispatcher
from tether.supervisor.effects.registry import EffectKindError, EffectKinds, RetryLater
from tether.supervisor.ledger import SqliteLedger, StepSpec, TaskSpec
from tether.supervisor.ledger.errors import StorageError
from tether.supervisor.ledger.outbox import Answer, Delivered, Unanswered, Undeliverable
from tether.supervisor.service import running_ledger
from tether.supervisor.settings import SupervisorSettings

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
    refused = Undeliverable(status=404, detail="HTTP 404", code="receiver_refused")
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
    assert outbox.rows["e1"].reason == "still unanswered; last: HTTP 503"
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
    assert outbox.rows["e1"].reason == "no attempt before the deadline"


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


@dataclasses.dataclass
class BusyLedger(FakeOutbox):
    """A ledger file that is locked for the first `busy` writes of an answer."""

    busy: int = 0
    tries: int = 0

    async def record_attempt(
        self, effect_id: str, attempt: int, holder: str, answer: Answer
    ) -> None:
        self.tries += 1
        if self.tries <= self.busy:
            raise StorageError("database is locked")
        await super().record_attempt(effect_id, attempt, holder, answer)


@pytest.mark.parametrize("keyed", [True, False])
async def test_an_answer_the_ledger_fails_to_take_is_written_again_never_sent_again(
    keyed: bool,
) -> None:
    ledger = BusyLedger(clock=time.time, busy=3)
    script = Scripted([OK])
    ledger.add(outgoing(deadline_at=soon(), keyed=keyed))
    async with running(dispatcher(ledger, script, record_backoff_s=0.01)):
        await until(lambda: ledger.rows["e1"].state == "delivered")
    assert script.calls == ["e1"]
    assert ledger.tries == 4
    assert ledger.rows["e1"].attempts == [OK]


async def test_an_answer_the_ledger_never_takes_is_given_up_after_a_few_writes() -> None:
    ledger = BusyLedger(clock=time.time, busy=100)
    script = Scripted([OK])
    ledger.add(outgoing(deadline_at=soon(), keyed=False))
    async with running(dispatcher(ledger, script, record_backoff_s=0.01)):
        await until(lambda: ledger.tries == RECORD_TRIES)
        await anyio.sleep(0.1)
    assert script.calls == ["e1"]  # sent once, however often the write failed
    assert ledger.tries == RECORD_TRIES


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
    assert outbox.rows["e1"].reason == "no deliverer for effect kind 'slack' in this supervisor"


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


# -- against a real SqliteLedger and the local receiver --------------------------------------


RECEIVER = "http://receiver"


def deploy_spec(key: str = "k1") -> TaskSpec:
    body = {"version": "{{ steps.build.output.version }}"}
    return TaskSpec(
        tenant="acme",
        idempotency_key=key,
        steps=(
            StepSpec(name="build", kind="chat", payload={"cmd": "build"}),
            StepSpec(
                name="deploy",
                kind="http",
                payload={"url": f"{RECEIVER}/deploy", "body": body, "keyed": True},
            ),
        ),
    )


async def due_deploy(ledger: SqliteLedger) -> str:
    """A task whose `build` step committed, so that its `deploy` effect is due; its id."""
    spec = deploy_spec()
    task_id = (await ledger.create_task(spec)).task_id
    await ledger.approve("acme", task_id, spec.plan_hash, None)
    [lease] = await ledger.claim("r1", "default", 1, 0, kinds=("chat",))
    await ledger.report(report_for(lease, output={"version": "1.2.3"}))
    return task_id


def ledger_dispatcher(
    ledger: SqliteLedger, script: Scripted, clock: FakeClock, **extra: Any
) -> Dispatcher:
    """A dispatcher on the real ledger with the scripted deliverer, polling every 50 ms."""
    return Dispatcher(
        ledger,
        EffectKinds([script]),
        Credentials(None),
        hold_s=60,
        clock=clock,
        poll_s=0.05,
        **extra,
    )


def real_dispatcher(ledger: Any, receiver: Any, clock: FakeClock, **extra: Any) -> Dispatcher:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver))
    kinds = EffectKinds([http_deliverer(client, clock=clock)])
    return Dispatcher(
        ledger,
        kinds,
        Credentials(None),
        hold_s=LEDGER_CONFIG.effect_hold_s,
        clock=clock,
        poll_s=0.05,
        retry_base_s=0.01,
        **extra,
    )


async def task_state(ledger: SqliteLedger, task_id: str) -> str:
    state: str = plain(await ledger.task(task_id))["state"]
    return state


async def until_task(ledger: SqliteLedger, task_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while await task_state(ledger, task_id) != state:  # noqa: ASYNC110 (another task's write)
            await anyio.sleep(0.01)


async def test_an_http_step_is_delivered_to_the_receiver_exactly_once(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock, tmp_path: Path
) -> None:
    receiver = create_app(tmp_path / "receiver.db")
    task_id = await due_deploy(ledger)
    async with running(real_dispatcher(ledger, receiver, clock)):
        await until_task(ledger, task_id, "SUCCEEDED")
    counts = receiver_counts(tmp_path / "receiver.db")
    assert (counts["requests"], counts["applied"], counts["replayed"]) == (1, 1, 0)
    assert (
        count(
            ledger_path, "effects", "step_id IN (SELECT id FROM steps WHERE name = ?)", ("deploy",)
        )
        == 1
    )
    applied = applied_bodies(tmp_path / "receiver.db")
    assert applied == [{"version": "1.2.3"}]


class Crashing:
    """The ledger as a supervisor that dies after sending sees it: the answer is never
    recorded and nothing is handed back."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.begun = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)

    async def begin_attempt(self, effect_id: str, holder: str, digest: str) -> int:
        attempt = await self.ledger.begin_attempt(effect_id, holder, digest)
        self.begun.set()
        return attempt

    async def record_attempt(self, *args: Any) -> None:
        await anyio.sleep_forever()

    async def release_effect(self, effect_id: str, holder: str) -> None:
        return None


async def test_a_supervisor_killed_after_sending_sends_again_with_the_same_key(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock, tmp_path: Path
) -> None:
    receiver = create_app(tmp_path / "receiver.db")
    task_id = await due_deploy(ledger)
    crashing = Crashing(ledger)
    first = real_dispatcher(crashing, receiver, clock)
    async with running(first):
        await crashing.begun.wait()
        await until(lambda: receiver_counts(tmp_path / "receiver.db")["applied"] == 1)
    assert await task_state(ledger, task_id) == "RUNNING"
    assert outbox_state(ledger_path) == "sending"

    clock.advance(LEDGER_CONFIG.effect_hold_s + 1)  # the dead holder's hold lapses
    second = real_dispatcher(ledger, receiver, clock)
    assert second.holder != first.holder
    async with running(second):
        await until_task(ledger, task_id, "SUCCEEDED")

    counts = receiver_counts(tmp_path / "receiver.db")
    assert (counts["requests"], counts["applied"], counts["replayed"]) == (2, 1, 1)
    assert list(counts["by_key"].values()) == [2]  # one key, sent twice
    deploy = next(s for s in plain(await ledger.task(task_id))["steps"] if s["name"] == "deploy")
    assert deploy["output"]["replayed"] is True
    assert count(ledger_path, "deliveries") == 2
    assert count(ledger_path, "effects", "step_id = ?", (deploy["id"],)) == 1


def receiver_counts(state: Path) -> dict[str, Any]:
    return ReceiverState(state).counts()


def applied_bodies(state: Path) -> list[Any]:
    db = raw_db(state)
    try:
        return [json.loads(row["body"]) for row in db.execute("SELECT body FROM applied")]
    finally:
        db.close()


def outbox_state(path: Path) -> str:
    db = raw_db(path)
    try:
        state: str = db.execute("SELECT state FROM outbox").fetchone()["state"]
        return state
    finally:
        db.close()


# -- the registry of effect kinds ------------------------------------------------------------


def entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group="tether.effects")


def test_an_entry_point_adds_an_effect_kind() -> None:
    kinds = EffectKinds.with_entry_points(
        [Scripted([OK])], [entry_point("slack", "tests.effects_fakes:SlackDeliverer")]
    )
    assert kinds.names() == {"http", "slack"}
    assert isinstance(kinds.get("slack"), SlackDeliverer)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("http", "tests.effects_fakes:SlackDeliverer", "'http' (entry point http = tests"),
        ("slack", "tests.effects_fakes:ClashingDeliverer", "delivers kind 'http' instead"),
        ("slack", "tests.effects_fakes:Nothing", "cannot be loaded"),
        ("slack", "tests.effects_fakes:outgoing", "is not a Deliverer"),
    ],
)
def test_a_bad_entry_point_is_refused_in_one_line(name: str, value: str, message: str) -> None:
    with pytest.raises(EffectKindError) as caught:
        EffectKinds.with_entry_points([Scripted([OK])], [entry_point(name, value)])
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_clash_with_a_built_in_names_it() -> None:
    with pytest.raises(EffectKindError, match="clashes with a built-in kind"):
        EffectKinds.with_entry_points(
            [Scripted([OK])], [entry_point("http", "tests.effects_fakes:SlackDeliverer")]
        )


async def test_a_cancel_during_the_send_ends_cancelled_with_the_effect_delivered(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    gate = anyio.Event()
    script = Scripted([OK], hang=gate)
    task_id = await due_deploy(ledger)
    d = ledger_dispatcher(ledger, script, clock)
    async with running(d):
        await until(lambda: script.calls != [])
        await ledger.cancel("acme", task_id, "stop")
        gate.set()
        await until(lambda: outbox_state(ledger_path) == "delivered")
    assert await task_state(ledger, task_id) == "CANCELLED"
    assert count(ledger_path, "effects", "step_id IN (SELECT step_id FROM outbox)") == 1


async def test_a_keyed_effect_never_connected_past_its_deadline_fails_the_task(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    script = Scripted([DOWN])
    task_id = await due_deploy(ledger)
    d = ledger_dispatcher(ledger, script, clock, retry_base_s=0.01)
    async with running(d):
        await until(lambda: len(script.calls) >= 2)
        clock.advance(301)  # past the step's deadline_s (300 by default)
        await until_task(ledger, task_id, "FAILED")
    assert outbox_state(ledger_path) == "failed"
    view = plain(await ledger.task(task_id))
    assert "delivery_deadline" in json.dumps(view)


async def test_a_keyed_effect_that_may_have_reached_its_receiver_by_the_deadline_is_uncertain(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    # A 503 (or a read timeout) may come after the receiver applied it: not `failed`.
    script = Scripted([BUSY])
    task_id = await due_deploy(ledger)
    d = ledger_dispatcher(ledger, script, clock, retry_base_s=0.01)
    async with running(d):
        await until(lambda: len(script.calls) >= 2)
        clock.advance(301)
        await until(lambda: outbox_state(ledger_path) == "uncertain")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "RUNNING"
    assert view["waiting_for"]["reason"] == "uncertain"
    await ledger.resolve_effect("acme", task_id, "deploy", False, "alice")
    view = plain(await ledger.task(task_id))
    assert view["state"] == "FAILED"
    assert view["reason"] == "delivery_deadline: an operator (alice) said it did not happen"


def start_receiver(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "examples.receiver", "--port", str(port)]
    command += ["--state", str(tmp_path / "receiver.db")]
    with (tmp_path / "receiver.log").open("wb") as out:
        return subprocess.Popen(command, env=child_environment(), stdout=out, stderr=out)


async def test_the_running_supervisor_delivers_effects_by_itself(tmp_path: Path) -> None:
    """`running_ledger` starts the dispatcher (with its own httpx client) beside the reaper:
    an http step reaches a receiver process on 127.0.0.1."""
    port = free_port()
    process = start_receiver(tmp_path, port)
    try:
        spec = TaskSpec(
            tenant="acme",
            idempotency_key="k1",
            steps=(
                StepSpec(name="ping", kind="http", payload={"url": f"http://127.0.0.1:{port}/p"}),
            ),
        )
        settings = SupervisorSettings(
            db=tmp_path / "l.db", effect_allowed_hosts=f"127.0.0.1:{port}"
        )
        async with running_ledger(settings) as ledger:
            task_id = (await ledger.create_task(spec)).task_id
            await ledger.approve("acme", task_id, spec.plan_hash, None)
            await until_task(ledger, task_id, "SUCCEEDED")
        assert receiver_counts(tmp_path / "receiver.db")["applied"] == 1
    finally:
        process.terminate()
        process.wait(timeout=10)
