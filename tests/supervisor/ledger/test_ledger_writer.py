"""The ledger's writer (`supervisor/ledger/writer.py`): rules queued while a batch commits go
into the next batch, a caller hears back only once its batch has committed, shutdown commits
everything queued, and a writer that dies answers every waiting caller and closes the ledger.
The kill drills (tests/sim/test_chaos_supervisor_kill.py) show the same of a real process."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.conftest import FakeClock, count, ledger_rows, make_spec, open_ledger
from tether.supervisor.ledger import NotFound, StorageError, Tx
from tether.supervisor.ledger.batch import BatchResult, Rule, RuleOutcome, Transactions
from tether.supervisor.ledger.identity import create_task
from tether.supervisor.ledger.store import LedgerStore
from tether.supervisor.ledger.writer import Writer

pytestmark = pytest.mark.backends


class Thread:
    """A stand-in for `Transactions.run`: records each batch, and holds a batch open until
    the test lets it finish when `hold` is set."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.hold = threading.Event()  # set: the next batch waits for `release`
        self.entered = threading.Event()
        self.release = threading.Event()
        self.crash: BaseException | None = None

    def run(self, rules: Sequence[Rule]) -> BatchResult:
        self.batches.append([rule(None) for rule in rules])  # type: ignore[arg-type]
        if self.hold.is_set():
            self.hold.clear()
            self.entered.set()
            self.release.wait(10)
        if self.crash is not None:
            raise self.crash
        outcomes = [RuleOutcome(value=v) for v in self.batches[-1]]
        return BatchResult(outcomes, set(), set())


def value(v: object) -> Rule:
    return lambda tx: v


@pytest.fixture
def thread() -> Thread:
    return Thread()


async def wait_for(event: threading.Event) -> None:
    await anyio.to_thread.run_sync(event.wait, 10)


async def test_rules_queued_while_a_batch_commits_go_into_the_next_one(thread: Thread) -> None:
    committed: list[int] = []
    writer = Writer(thread.run, lambda outcomes, _: committed.append(len(outcomes)), max_batch=64)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        thread.hold.set()
        first = writer.submit(value(1))
        await wait_for(thread.entered)  # batch [1] is committing
        later = [writer.submit(value(n)) for n in (2, 3, 4)]
        await anyio.sleep(0.05)
        assert not first.done()  # not answered before its batch returned
        assert thread.batches == [[1]]
        thread.release.set()
        assert (await first).value == 1
        assert [(await f).value for f in later] == [2, 3, 4]
        writer.close()
    assert thread.batches == [[1], [2, 3, 4]]
    assert committed == [1, 3]


async def test_a_batch_holds_at_most_max_batch_rules(thread: Thread) -> None:
    writer = Writer(thread.run, lambda *_: None, max_batch=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        futures = [writer.submit(value(n)) for n in range(5)]
        assert [(await f).value for f in futures] == list(range(5))
        writer.close()
    assert thread.batches == [[0, 1], [2, 3], [4]]


async def test_closing_commits_every_queued_rule_then_refuses_new_ones(thread: Thread) -> None:
    writer = Writer(thread.run, lambda *_: None, max_batch=64)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        thread.hold.set()
        first = writer.submit(value(0))
        await wait_for(thread.entered)
        queued = [writer.submit(value(n)) for n in (1, 2)]
        writer.close()
        with pytest.raises(RuntimeError, match="not open"):
            writer.submit(value(3))
        thread.release.set()
    assert [f.result().value for f in [first, *queued]] == [0, 1, 2]
    assert thread.batches == [[0], [1, 2]]


async def test_a_caller_cancelled_while_waiting_leaves_its_rule_and_neighbours_be(
    thread: Thread,
) -> None:
    writer = Writer(thread.run, lambda *_: None, max_batch=64)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        thread.hold.set()
        first = writer.submit(value(0))
        await wait_for(thread.entered)
        with anyio.move_on_after(0.01):
            await writer.submit(value(1))  # cancelled while its rule waits
        neighbour = writer.submit(value(2))
        thread.release.set()
        assert (await neighbour).value == 2
        assert (await first).value == 0
        writer.close()
    assert thread.batches == [[0], [1, 2]]  # a rule once submitted runs


async def test_a_writer_that_dies_answers_every_caller_and_raises(thread: Thread) -> None:
    writer = Writer(thread.run, lambda *_: None, max_batch=64)
    with pytest.raises(BaseExceptionGroup) as raised:  # noqa: PT012 - the group is the writer's
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run)
            thread.hold.set()
            thread.crash = RuntimeError("the writer broke")
            first = writer.submit(value(0))
            await wait_for(thread.entered)
            queued = writer.submit(value(1))
            thread.release.set()
            await anyio.sleep_forever()  # the writer's error cancels this
    assert raised.group_contains(RuntimeError, match="the writer broke")
    for future in (first, queued):  # both answered, the batch that failed and the one waiting
        error = future.result().error
        assert isinstance(error, StorageError)
        assert "the writer broke" in str(error)
    assert not writer.accepting
    assert thread.batches == [[0]]


# -- through the store ---------------------------------------------------------------------


async def test_a_write_returns_once_its_row_is_committed(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    """When `write` returns, another connection sees the rule's row: its batch committed."""
    async with open_ledger(ledger_db, clock) as ledger:
        inside = threading.Event()
        go_on = threading.Event()

        def slow_create(tx: Tx) -> str:
            created = create_task(tx, make_spec("slow"))
            inside.set()
            go_on.wait(10)
            return created.task_id

        async with anyio.create_task_group() as tg:
            done: list[str] = []

            async def write() -> None:
                done.append(await ledger.write(slow_create))

            tg.start_soon(write)
            await wait_for(inside)
            await anyio.sleep(0.05)
            assert done == []
            assert count(ledger_db, "tasks") == 0  # not committed yet, not answered yet
            go_on.set()
        [(task_id,)] = ledger_rows(ledger_db, "SELECT id FROM tasks")  # another connection
        assert done == [task_id]


async def test_a_rules_own_error_is_raised_in_its_caller(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    refusal = NotFound("no such thing")

    def refuse(tx: Tx) -> None:
        raise refusal

    async with open_ledger(ledger_db, clock) as ledger:
        with pytest.raises(NotFound) as raised:
            await ledger.write(refuse)
        assert raised.value is refusal
        assert (await ledger.create_task(make_spec("after"))).created


async def test_closing_the_ledger_commits_the_writes_already_queued(
    ledger_db: Path | str, clock: FakeClock
) -> None:
    answers: list[object] = []

    async def create(ledger: LedgerStore, n: int) -> None:
        answers.append(await ledger.create_task(make_spec(f"k{n}")))

    async with anyio.create_task_group() as tg:
        async with open_ledger(ledger_db, clock) as ledger:
            for n in range(20):
                tg.start_soon(create, ledger, n)
            await anyio.lowlevel.checkpoint()  # each has queued its rule; none answered yet
            assert answers == []
        assert not ledger.is_open
    assert len(answers) == 20
    assert count(ledger_db, "tasks") == 20
    with pytest.raises(RuntimeError, match="not open"):
        await ledger.create_task(make_spec("late"))


async def test_a_writer_that_dies_closes_the_ledger(
    ledger_db: Path | str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = Transactions.run

    def run(self: Transactions, rules: Sequence[Rule], *, commit: bool = True) -> BatchResult:
        if len(rules) == 1 and getattr(rules[0], "breaks", False):
            raise MemoryError("out of memory in the writer")
        return real_run(self, rules, commit=commit)

    def breaking(tx: Tx) -> None:
        return None

    breaking.breaks = True  # type: ignore[attr-defined]
    monkeypatch.setattr(Transactions, "run", run)
    seen: list[bool] = []
    with pytest.raises(BaseExceptionGroup) as raised:  # noqa: PT012 - raised as the block ends
        async with open_ledger(ledger_db, clock) as ledger:
            with pytest.raises(StorageError):
                await ledger.write(breaking)
            seen.append(ledger.is_open)
            await anyio.sleep_forever()  # the writer's death cancels the block
    assert raised.group_contains(MemoryError)
    assert seen == [False]
    assert not ledger.is_open
