"""`Broadcast`: wake every task waiting for something to change, each time it changes.

Hazard: a task that looks at the state, then starts waiting, misses a `fire` that lands between
the two (the look may await: a ledger read, a write in the same batch as the fire). So take
`armed()` *before* looking, and `wait` on the event it returned: a fire after the arming sets
it, however late the wait begins. `wait_for` does exactly that for a condition that is checked
without awaiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio


class Broadcast:
    """An `anyio.Event` that is set once per `fire`, then replaced by a fresh one."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def armed(self) -> anyio.Event:
        """The event the next `fire` sets; take it before looking at what you wait for."""
        return self._event

    def fire(self) -> None:
        """Wake every task waiting on an event armed before this call."""
        self._event.set()
        self._event = anyio.Event()

    async def wait(self, armed: anyio.Event, seconds: float = math.inf) -> None:
        """Wait until `armed` (taken from `armed()` before looking) is set, or `seconds` pass."""
        with anyio.move_on_after(seconds):
            await armed.wait()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once `condition()` holds, checking it again after each `fire`."""
        while True:
            armed = self._event
            if condition():
                return
            await armed.wait()
