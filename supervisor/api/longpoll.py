"""Long-polls end early when the supervisor begins to shut down, or their client hangs up.

A runner always has a claim waiting (up to `claim_wait_max_s`) and an operator's `watch` an
events poll, so without this every stop would wait out uvicorn's graceful timeout and then
reply to those polls with a 500. On drain, each poll returns what it would have returned had
nothing happened meanwhile (204 for a claim, no events); clients simply poll again, against
the restarted supervisor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import anyio
from starlette.requests import Request

T = TypeVar("T")


class LongPolls:
    """The cancel scopes of the long-polls in flight."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self.draining = False

    @contextlib.contextmanager
    def until_drained(self) -> Iterator[anyio.CancelScope]:
        """Run the body, or stop it quietly when draining begins. Callers check `draining`
        before entering, so a request that starts after the drain gets its empty reply at once."""
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    def drain(self) -> None:
        """End every long-poll in flight.

        A claim cancelled while its ledger write is in flight may have been granted a lease
        whose reply is lost: the acceptance window covers that case (docs/design.md, Fencing
        and leases).
        """
        self.draining = True
        for scope in list(self._scopes):
            scope.cancel()


async def cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel `scope` once the client hangs up. Run it beside a long-poll whose request body is
    already read (or has none), so that the next ASGI message is the disconnect. A runner that
    went away must not be granted leases it will never see (they would sit out the acceptance
    window), and an operator's `watch` that went away holds nothing for up to a minute."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def unless_disconnected(
    request: Request, scope: anyio.CancelScope, call: Callable[[], Awaitable[T]]
) -> T:
    """`await call()`, with `scope` cancelled should the client hang up meanwhile. An error of
    `call` propagates as itself, not inside an exception group (a task group would wrap it), so
    the app's handlers still turn a ledger error into its wire code."""
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_on_disconnect, request, scope)
        try:
            value = await call()
        except Exception as exc:  # re-raised below, once the watcher has stopped
            failed = exc
        finally:
            tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return value
