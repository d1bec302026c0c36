"""The `http` deliverer (supervisor/effects/http.py): the key on every try, credentials only at
send time, and how each kind of answer is classified."""

from __future__ import annotations

import base64
import http.server
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from examples.receiver import create_app
from tests.effects_fakes import http_deliverer, loopback_resolver, outgoing
from tether.supervisor.effects.credentials import Credentials
from tether.supervisor.effects.http import HttpDeliverer, retry_after
from tether.supervisor.effects.registry import RetryLater
from tether.supervisor.ledger.outbox import Delivered, Unanswered, Undeliverable

NOW = 1_000_000.0
TOKEN = "s3cret-token-value"


@pytest.fixture
def secrets(tmp_path: Path) -> Credentials:
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "hook").write_text(TOKEN + "\n")
    return Credentials(folder)


def mocked(handler: Callable[[httpx.Request], httpx.Response]) -> HttpDeliverer:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return http_deliverer(client, clock=lambda: NOW)


def request(**extra: Any) -> dict[str, Any]:
    return {"method": "POST", "url": "http://receiver/deploy", "body": {"v": 1}, **extra}


async def test_delivered_to_the_receiver_once_then_replayed(
    tmp_path: Path, secrets: Credentials
) -> None:
    app = create_app(tmp_path / "r.db")
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    deliverer = http_deliverer(client)
    out = outgoing(request())
    first = await deliverer.deliver(out, secrets)
    again = await deliverer.deliver(out, secrets)
    assert first == Delivered(status=201, detail=first.detail, replayed=False)
    assert isinstance(again, Delivered)
    assert again.replayed
    assert '"applied":1' in again.detail.replace(" ", "")
    counts = (await client.get("http://receiver/counts")).json()
    assert (counts["applied"], counts["requests"], counts["by_key"]) == (1, 2, {"key-e1": 2})


async def test_the_key_and_the_credential_go_with_the_request_and_are_masked_in_the_answer(
    secrets: Credentials,
) -> None:
    seen: list[httpx.Request] = []

    def echo(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(422, text=f"bad token {req.headers['Authorization']}")

    headers = {"Authorization": "Bearer {{ credential.hook }}", "idempotency-key": "mine"}
    answer = await mocked(echo).deliver(outgoing(request(headers=headers)), secrets)
    assert seen[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert seen[0].headers.get_list("Idempotency-Key") == ["key-e1"]
    assert seen[0].read() == b'{"v":1}'
    assert answer == Undeliverable(
        status=422, detail="HTTP 422: bad token Bearer ****", code="receiver_refused"
    )


async def test_a_missing_credential_refuses_without_sending(secrets: Credentials) -> None:
    sent: list[httpx.Request] = []

    def never(req: httpx.Request) -> httpx.Response:
        sent.append(req)
        return httpx.Response(200)

    headers = {"Authorization": "{{ credential.absent }}"}
    answer = await mocked(never).deliver(outgoing(request(headers=headers)), secrets)
    assert isinstance(answer, Undeliverable)
    assert answer.code == "credential_missing"
    assert sent == []


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (200, {}, Delivered(status=200, detail="HTTP 200: ok")),
        (
            204,
            {"Idempotent-Replayed": "true"},
            Delivered(status=204, detail="HTTP 204: ok", replayed=True),
        ),
        (408, {}, Unanswered(detail="HTTP 408: ok", sent=True, status=408)),
        (
            429,
            {"Retry-After": "7"},
            RetryLater(detail="HTTP 429: ok", sent=True, status=429, retry_after_s=7.0),
        ),
        (503, {}, Unanswered(detail="HTTP 503: ok", sent=True, status=503)),
        (301, {}, Undeliverable(status=301, detail="HTTP 301: ok", code="receiver_refused")),
        (404, {}, Undeliverable(status=404, detail="HTTP 404: ok", code="receiver_refused")),
    ],
)
async def test_answers_are_classified(
    secrets: Credentials, status: int, headers: dict[str, str], expected: Any
) -> None:
    deliverer = mocked(lambda _: httpx.Response(status, headers=headers, text="ok"))
    assert await deliverer.deliver(outgoing(request()), secrets) == expected


@pytest.mark.parametrize(
    ("error", "sent"),
    [
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("slow"), False),
        (httpx.ReadTimeout("slow"), True),
        (httpx.WriteTimeout("slow"), True),
        (httpx.RemoteProtocolError("cut"), True),
        (httpx.ReadError("reset"), True),
    ],
)
async def test_transport_failures_are_unanswered(
    secrets: Credentials, error: Exception, sent: bool
) -> None:
    def fail(req: httpx.Request) -> httpx.Response:
        raise error

    answer = await mocked(fail).deliver(outgoing(request()), secrets)
    assert isinstance(answer, Unanswered)
    assert answer.sent is sent
    assert type(error).__name__ in answer.detail


async def test_the_answer_kept_is_at_most_2_kib(secrets: Credentials) -> None:
    deliverer = mocked(lambda _: httpx.Response(400, text="é" * 10_000))
    answer = await deliverer.deliver(outgoing(request()), secrets)
    assert len(answer.detail.encode()) <= 2048 + len("HTTP 400: ")


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("12", NOW) == 12.0
    assert retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 0.0) == 10.0
    assert retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 100.0) == 0.0
    assert retry_after("soon", NOW) is None
    assert retry_after(None, NOW) is None


# -- where a request goes, and what it may carry ---------------------------------------------


def recording(
    seen: list[httpx.Request], status: int = 200, text: str = "ok"
) -> Callable[[httpx.Request], httpx.Response]:
    def record(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(status, text=text)

    return record


async def test_the_request_goes_to_the_checked_address_under_its_name(
    secrets: Credentials,
) -> None:
    seen: list[httpx.Request] = []
    deliverer = mocked(recording(seen))
    answer = await deliverer.deliver(outgoing(request(url="https://hooks.test:8443/d")), secrets)
    assert isinstance(answer, Delivered)
    [sent] = seen
    assert (sent.url.host, sent.url.port, sent.url.path) == ("127.0.0.1", 8443, "/d")
    assert sent.headers["Host"] == "hooks.test:8443"
    assert sent.extensions["sni_hostname"] == "hooks.test"  # TLS verifies the name


async def test_a_destination_refused_at_send_sends_nothing(secrets: Credentials) -> None:
    """The settings changed after create, or the plan predates them: judged again."""
    seen: list[httpx.Request] = []
    client = httpx.AsyncClient(transport=httpx.MockTransport(recording(seen)))
    deliverer = HttpDeliverer(client, resolver=loopback_resolver)  # 127.0.0.1 not listed
    answer = await deliverer.deliver(outgoing(request(url="http://hooks.test/d")), secrets)
    assert isinstance(answer, Undeliverable)
    assert answer.code == "destination_refused"
    assert "hooks.test resolved to 127.0.0.1" in answer.detail
    assert seen == []


@pytest.mark.parametrize("value", ["tok\r\nX-Injected: 1", "tok\nx", "tok\x00", "tök"])
async def test_a_credential_http_cannot_carry_is_refused_unsent_and_unnamed(
    tmp_path: Path, value: str
) -> None:
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "bad").write_text(value)
    seen: list[httpx.Request] = []
    headers = {"Authorization": "Bearer {{ credential.bad }}"}
    answer = await mocked(recording(seen)).deliver(
        outgoing(request(headers=headers), keyed=False), Credentials(folder)
    )
    assert isinstance(answer, Undeliverable)  # not Unanswered(sent=True): never `uncertain`
    assert answer.code == "effect_render_failed"
    assert "header Authorization" in answer.detail
    assert "tok" not in answer.detail
    assert seen == []


async def test_encoded_echoes_of_a_credential_are_masked(secrets: Credentials) -> None:
    raw = TOKEN.encode()
    echoes = [
        TOKEN.upper(),
        raw.hex(),
        raw.hex().upper(),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        base64.b64encode(b"Bearer " + raw).decode(),
        quote(TOKEN, safe=""),
    ]
    headers = {"Authorization": "Bearer {{ credential.hook }}"}
    deliverer = mocked(lambda _: httpx.Response(400, text=" | ".join(echoes)))
    answer = await deliverer.deliver(outgoing(request(headers=headers)), secrets)
    assert isinstance(answer, Undeliverable)
    for echo in echoes:
        assert echo not in answer.detail, echo
    assert answer.detail.count("****") == len(echoes)


@pytest.fixture
def tls_hook(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """An HTTPS server on 127.0.0.1 whose certificate names `hooks.test` only (made by
    `openssl`); its port and the certificate, which the client trusts."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=hooks.test",
            "-addext",
            "subjectAltName=DNS:hooks.test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], cert
    finally:
        server.shutdown()
        server.server_close()


async def test_tls_is_verified_for_the_name_while_connecting_to_the_address(
    tls_hook: tuple[int, Path], secrets: Credentials
) -> None:
    port, cert = tls_hook
    client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=cert), trust_env=False)
    async with client:
        deliverer = http_deliverer(client)  # every name answers 127.0.0.1, allowed
        named = await deliverer.deliver(
            outgoing(request(url=f"https://hooks.test:{port}/d")), secrets
        )
        assert isinstance(named, Delivered), named
        # The same address under a name the certificate does not hold: refused by TLS.
        other = await deliverer.deliver(
            outgoing(request(url=f"https://other.test:{port}/d")), secrets
        )
        assert isinstance(other, Unanswered)
        assert not other.sent
        assert "certificate is not valid for 'other.test'" in other.detail
