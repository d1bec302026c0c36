"""The task page's live updates: the task's event journal as server-sent events.

Each event goes out with its `seq` as the SSE id, so a browser that reconnects sends
`Last-Event-ID` and resumes after it; the page's script applies only a seq above the highest
it applied (docs/design.md, Event journal). A stream lasts at most `STREAM_S` (the browser
reconnects), ends when the supervisor begins to shut down, and sends a comment when a poll
finds nothing, so a client that went away is noticed within one poll.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tether.supervisor.api import requests as rq
from tether.supervisor.api.longpoll import LongPolls
from tether.supervisor.ledger import Principal
from tether.supervisor.ui import pages
from tether.supervisor.ui.guard import signed
from tether.wire.codec import encode
from tether.wire.records import Event

STREAM_S: Final = 300.0
POLL_S: Final = 15.0
RETRY_MS: Final = 2000


def frame(event: Event) -> bytes:
    """One event as an SSE message: its seq as the id, the event as JSON data (one line)."""
    return b"id: %d\ndata: %b\n\n" % (event.seq, encode(event))


def _resume_after(request: Request) -> int:
    """Where to start: past `Last-Event-ID` when the browser reconnects, else `?after=`."""
    after = rq.query_int(request, "after", default=0, low=0, high=2**62)
    last = request.headers.get("last-event-id", "")
    if last.isascii() and last.isdigit() and len(last) <= 18:
        after = max(after, int(last))
    return after


async def _events(request: Request, who: Principal) -> Response:
    ledger = pages.ledger_of(request)
    task_id = request.path_params["task_id"]
    after = _resume_after(request)
    # Read once before the stream starts, so an unknown task is a 404 page, not an empty stream.
    first = await ledger.events(task_id, who.scope, after, 0.0)
    polls: LongPolls = request.app.state.long_polls
    wait = min(POLL_S, request.app.state.settings.events_wait_max_s)

    async def stream() -> AsyncIterator[bytes]:
        nonlocal after
        yield f"retry: {RETRY_MS}\n\n".encode()
        deadline = anyio.current_time() + STREAM_S
        found = first
        while True:
            for event in found:
                after = max(after, event.seq)
                yield frame(event)
            if not found:
                yield b": idle\n\n"
            if polls.draining or anyio.current_time() >= deadline:
                return
            found = []
            with polls.until_drained():
                found = await ledger.events(task_id, who.scope, after, wait)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


events = signed(_events, redirect=False)
