"""`SharedRequests`: items that go to the supervisor together, one request carrying many.

The common half of `RenewalBatcher` (runner.keeper) and `ResultSender` (runner.results): an item
queued while a request is out waits for it and goes in the next one; whoever finds no request
out sends the next. Each subclass says how a request is sent (`_send_next`), and hands every
item it took its own answer or exception.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, cast

from tether.broadcast import Broadcast

AnswerT = TypeVar("AnswerT")


class Queued(Protocol):
    """An item waiting for its request: `answer` is None until the request hands it one."""

    answer: Any


ItemT = TypeVar("ItemT", bound=Queued)


class SharedRequests(Generic[ItemT, AnswerT]):
    """A queue of items whose answers come from requests that carry many of them."""

    def __init__(self) -> None:
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
        `_sent`; every item taken gets an answer."""
        raise NotImplementedError
