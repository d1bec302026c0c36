"""The runner's connections send a request's head and its body in one write
(`tether.runner.http.OneWriteStream`), on the pooled transport the runner uses for the
supervisor and the model; a large body still arrives whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
from httpcore._backends.anyio import AnyIOStream  # the streams httpcore's pools open

from tether.runner.http import JOINED_BODY_MAX, make_client, pooled_transport

REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


async def _read_request(stream: anyio.abc.SocketStream) -> bytes | None:
    """One HTTP/1.1 request with a Content-Length (or none), as the bytes received."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return None
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += await stream.receive()
    return head + b"\r\n\r\n" + body


@asynccontextmanager
async def _server(received: list[bytes]) -> AsyncIterator[int]:
    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            while (request := await _read_request(stream)) is not None:
                received.append(request)
                await stream.send(REPLY)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write httpcore's own connections make (the sends to the socket)."""
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    seen: list[bytes] = []
    real = AnyIOStream.write

    async def counted(self: AnyIOStream, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        seen.append(buffer)
        await real(self, buffer, timeout)

    monkeypatch.setattr(AnyIOStream, "write", counted)
    return seen


async def test_a_request_with_a_body_is_one_write(writes: list[bytes]) -> None:
    received: list[bytes] = []
    async with _server(received) as port:
        transport = pooled_transport(4)
        async with make_client(transport=transport, base_url=f"http://127.0.0.1:{port}") as c:
            for n in range(3):
                answer = await c.post("/v1/chat/completions", json={"n": n, "text": "x" * 300})
                assert answer.text == "ok"
            assert (await c.get("/healthz")).text == "ok"
    assert len(writes) == 4, [w[:40] for w in writes]
    assert writes[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert writes[0].endswith(b'{"n":0,"text":"' + b"x" * 300 + b'"}')
    assert writes[3].startswith(b"GET /healthz HTTP/1.1\r\n")
    assert received == writes


async def test_a_large_body_is_sent_as_it_is_not_copied_into_the_head(
    writes: list[bytes],
) -> None:
    received: list[bytes] = []
    body = b"y" * (JOINED_BODY_MAX + 1)
    async with _server(received) as port:
        transport = pooled_transport(1)
        async with make_client(transport=transport, base_url=f"http://127.0.0.1:{port}") as c:
            assert (await c.post("/upload", content=body)).text == "ok"
    assert len(writes) == 2
    assert writes[1] == body
    assert received == [writes[0] + writes[1]]
