"""`SharedRequests`: items that go to the supervisor together, one request carrying many.

The common half of `RenewalBatcher` (runner.keeper) and `ResultSender` (runner.results): an item
queued while a request is out waits for it and goes in the next one; whoever finds no request
out sends the next. Each subclass says how one request is sent (`_answers`); the shared
`_send_next` hands every item it took an answer or an exception, even when the request is
cancelled with the caller that sent it (the others would otherwise wait for nothing).
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, cast

from tether.broadcast import Broadcast
from tether.runner.errors import SupervisorUnreachable, TokenRejected

AnswerT = TypeVar("AnswerT")


class Queued(Protocol):
    """An item waiting for its request: `answer` is None until the request hands it one."""

    answer: Any


ItemT = TypeVar("ItemT", bound=Queued)


class SharedRequests(Generic[ItemT, AnswerT]):
    """A queue of items whose answers come from requests that carry many of them."""

    # What a failed request's items are told they were ("renewal", "result").
    item_name = "item"

    def __init__(self, per_request: int) -> None:
        self._per_request = per_request
        self._queue: list[ItemT] = []
        self._sending = False
        self._sent = Broadcast()

    async def _answer(self, item: ItemT) -> AnswerT:
        """Queue `item` and return its answer (raise it when it is an exception). An item
        cancelled before its request took it is taken out of the queue, never sent."""
        self._queue.append(item)
        try:
            while item.answer is None:
                if self._sending:
                    await self._sent.armed().wait()
                else:
                    await self._send_next()
        finally:
            if item.answer is None and item in self._queue:  # cancelled before it was sent
                self._queue.remove(item)
        if isinstance(item.answer, Exception):
            raise item.answer
        return cast(AnswerT, item.answer)

    async def _send_next(self) -> None:
        """Send queued items in one request, setting `_sending` while it is out, then firing
        `_sent`. A request with no reply, or one that failed in a way nobody foresaw, fails
        every item in it with `SupervisorUnreachable` (each caller retries on its own)."""
        self._sending = True
        batch: list[ItemT] = []
        try:
            await self._gather()
            batch = self._queue[: self._per_request]
            del self._queue[: self._per_request]
            if not batch:
                return
            answers: list[Any]
            try:
                answers = await self._answers(batch)
            except (SupervisorUnreachable, TokenRejected) as exc:
                answers = [type(exc)(exc.detail) for _ in batch]  # one object per caller
            except Exception as exc:  # the request's fate is unknown
                why = f"sending {self.item_name}s failed: {type(exc).__name__}: {exc}"
                answers = [SupervisorUnreachable(why) for _ in batch]
            for item, answer in zip(batch, answers, strict=True):
                item.answer = answer
        finally:
            for item in batch:
                if item.answer is None:
                    item.answer = SupervisorUnreachable(
                        f"the request carrying this {self.item_name} was cancelled before its"
                        " answer"
                    )
            self._sending = False
            self._sent.fire()

    async def _gather(self) -> None:
        """Wait, if the subclass wants, for items about to be queued to join the request."""

    async def _answers(self, batch: list[ItemT]) -> list[Any]:
        """One answer (or exception) per item of `batch`, in order, from one request."""
        raise NotImplementedError
