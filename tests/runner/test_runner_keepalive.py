"""The idle keep-alive race (issue 16, finding 9): `renew got no answer; retrying` with an
empty `ReadError` while the supervisor was healthy.

A server closes a connection left idle past its keep-alive timeout; a client that reuses it
just then (the close still on its way) gets no answer. On a network with a few milliseconds of
latency that window is real; here a small TCP relay delays every byte by `DELAY_S` each way,
so that the race shows on 127.0.0.1 too. The server is a real uvicorn with a short keep-alive;
the client is the runner's own `SupervisorClient` over its pooled transport.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.clocks import LoopClock
from tether.runner.errors import SupervisorUnreachable
from tether.runner.http import SUPERVISOR_KEEPALIVE_EXPIRY_S, ShardedPools, pooled_transport
from tether.runner.supervisor_client import SupervisorClient
from tether.supervisor.api.refusal_log import RefusalLog
from tether.supervisor.head_timeout import HeadTimeouts
from tether.supervisor.server import TIMEOUT_KEEP_ALIVE_S, server_config
from tether.supervisor.settings import SupervisorSettings
from tether.wire.codec import encode
from tether.wire.records import RunnerIdentity

KEEP_ALIVE_S = 1.0  # the server's, scaled down from TIMEOUT_KEEP_ALIVE_S
DELAY_S = 0.05  # one way, so a request on a closing connection has a 0.1 s window
# Idle times swept across the window (KEEP_ALIVE_S - 2 * DELAY_S, KEEP_ALIVE_S) and around it.
# Scaled, the fix's margin is a third of the keep-alive (0.33 s here), what a busy test machine
# can add to the relay's delays; in production it is 10 s against a round trip.
IDLES = [0.60 + 0.03 * n for n in range(16)]


async def _identity(_request: Request) -> Response:
    body = encode(RunnerIdentity(pool="default", token_id="t1"))
    return Response(body, media_type="application/json")


async def _relay_one(client: anyio.abc.SocketStream, port: int) -> None:
    """Forward both ways, each chunk and the close `DELAY_S` late, in order."""
    try:
        server = await anyio.connect_tcp("127.0.0.1", port)
    except OSError:
        await client.aclose()
        return

    async def pipe(src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream) -> None:
        send, receive = anyio.create_memory_object_stream[tuple[float, bytes]](math.inf)

        async def read() -> None:
            with send:
                with contextlib.suppress(
                    anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
                ):
                    async for chunk in src:
                        send.send_nowait((anyio.current_time() + DELAY_S, chunk))
                send.send_nowait((anyio.current_time() + DELAY_S, b""))  # the close

        async def write() -> None:
            broken = False
            with receive:
                async for due, chunk in receive:  # drained to the end, even once broken
                    await anyio.sleep(due - anyio.current_time())
                    if broken:
                        continue
                    try:
                        await (dst.send(chunk) if chunk else dst.send_eof())
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        broken = True

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(write)

    # A connection's end, however abrupt, is the relay's own business: never the fixture's,
    # whose task group would otherwise cancel the test mid-sweep. A task group raises an
    # ExceptionGroup, which `contextlib.suppress` matches only from Python 3.12: `except*`.
    try:
        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(pipe, client, server)
            tg.start_soon(pipe, server, client)
    except* (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


@pytest.fixture
async def relayed_uvicorn() -> AsyncIterator[str]:
    """A real uvicorn (keep-alive `KEEP_ALIVE_S`) behind the delaying relay; yields its URL."""
    app = Starlette(routes=[Route("/v1/runner", _identity)])
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=KEEP_ALIVE_S
    )  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: server.serve(sockets=[sock]))
            async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
                relay_port = listener.extra(anyio.abc.SocketAttribute.local_port)
                async with anyio.create_task_group() as relay:
                    relay.start_soon(listener.serve, lambda client: _relay_one(client, port))
                    while not server.started:  # noqa: ASYNC110 (uvicorn has no event for it)
                        await anyio.sleep(0.01)
                    yield f"http://127.0.0.1:{relay_port}"
                    relay.cancel_scope.cancel()
            server.should_exit = True


async def _failures(url: str, keepalive_expiry_s: float) -> list[str]:
    """One client per idle time: ask, stay idle that long, ask again on the kept connection."""
    failures: list[str] = []

    async def one(idle_s: float) -> None:
        transport = ShardedPools(1, keepalive_expiry_s=keepalive_expiry_s)
        client = SupervisorClient(base_url=url, token="t", clock=LoopClock(), transport=transport)
        try:
            await client.whoami()
            await anyio.sleep(idle_s)
            try:
                await client.whoami()
            except SupervisorUnreachable as exc:
                failures.append(f"idle {idle_s:.2f} s: {exc.detail}")
        finally:
            await client.aclose()

    async with anyio.create_task_group() as tg:
        for idle_s in IDLES:
            tg.start_soon(one, idle_s)
    return failures


async def test_a_client_idle_past_the_servers_keep_alive_reproduces_the_race(
    relayed_uvicorn: str,
) -> None:
    """Before the fix: httpx's default expiry (5 s) above the server's keep-alive."""
    failures = await _failures(relayed_uvicorn, keepalive_expiry_s=5.0)
    assert failures, "the race did not show: the reproduction itself is broken"
    assert all("/v1/runner" in f and "GET " in f for f in failures)


async def test_a_client_expiry_below_the_servers_keep_alive_never_meets_the_race(
    relayed_uvicorn: str,
) -> None:
    """After the fix, scaled: the client lets go first, in the production pair's proportion."""
    expiry = KEEP_ALIVE_S * SUPERVISOR_KEEPALIVE_EXPIRY_S / TIMEOUT_KEEP_ALIVE_S
    assert await _failures(relayed_uvicorn, keepalive_expiry_s=expiry) == []


def test_the_runner_lets_go_of_idle_supervisor_connections_well_before_the_supervisor() -> None:
    app = Starlette()
    app.state.head_timeouts = HeadTimeouts()  # as create_app gives every app
    app.state.refusal_log = RefusalLog()
    config = server_config(app, SupervisorSettings())
    assert config.timeout_keep_alive == TIMEOUT_KEEP_ALIVE_S
    # Margin for the round trip and a slow answer: the client's idle clock starts later.
    assert SUPERVISOR_KEEPALIVE_EXPIRY_S <= TIMEOUT_KEEP_ALIVE_S - 5
    transport = pooled_transport(4, keepalive_expiry_s=SUPERVISOR_KEEPALIVE_EXPIRY_S)
    assert isinstance(transport, ShardedPools)
    for pool in transport._pools:
        assert isinstance(pool, httpx.AsyncHTTPTransport)
        assert pool._pool._keepalive_expiry == SUPERVISOR_KEEPALIVE_EXPIRY_S
