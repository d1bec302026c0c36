"""Unauthenticated clients against a real supervisor (docs/design.md, Threat model: The owned
side; issue 23, finding 4).

- 300 connections that each send part of a request head, and no token, are all closed within
  `header_read_timeout_s` (plus slack for a loaded machine), while an operator's reads are
  answered throughout; so is a keep-alive connection that stalls in its second request's head.
  Without the bound (supervisor/head_timeout.py) uvicorn keeps them open for as long as the
  client likes.
- A flood of made-up tokens writes at most `refusal_log.PER_SECOND` log lines a second; the
  rest are counted in `tether_auth_refusals_suppressed_total`. So do malformed requests, which
  uvicorn itself would log one warning each.
- Past the head: 300 sign-in forms whose body never comes are answered 400 within
  `body_read_timeout_s` (the form is read before any token is checked), and clients that
  hang up mid-body leave no traceback in the log.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runner.test_runner_processes import Cluster
from tether.supervisor.api.refusal_log import PER_SECOND

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BOUND_S = 2.0
SLACK_S = 10.0  # a loaded machine's scheduling, not the bound itself
CONNECTIONS = 300
HALF_HEAD = b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_supervisor(
            TETHER_HEADER_READ_TIMEOUT_S=str(BOUND_S), TETHER_BODY_READ_TIMEOUT_S=str(BOUND_S)
        )
        yield cluster
    finally:
        cluster.stop_all()


def half_sent(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(HALF_HEAD)
    sock.setblocking(False)
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the supervisor closed `sock` (end of stream or a reset), without blocking."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_half_sent_heads_are_closed_while_operators_are_served(supervisor: Cluster) -> None:
    opened_at = time.monotonic()
    open_socks = [half_sent(supervisor.sup_port) for _ in range(CONNECTIONS)]
    opened_s = time.monotonic() - opened_at
    try:
        reads: list[float] = []
        closed_at: dict[int, float] = {}
        deadline = time.monotonic() + BOUND_S + SLACK_S
        while len(closed_at) < CONNECTIONS and time.monotonic() < deadline:
            started = time.monotonic()
            answer = supervisor.http.get("/v1/tasks")
            assert answer.status_code == 200, answer.text
            reads.append(time.monotonic() - started)
            for n, sock in enumerate(open_socks):
                if n not in closed_at and closed_by_peer(sock):
                    closed_at[n] = time.monotonic() - opened_at
            time.sleep(0.05)
        print(
            f"\n{CONNECTIONS} half-sent heads opened in {opened_s:.2f} s; {len(closed_at)} closed,"
            f" the last {max(closed_at.values(), default=float('nan')):.2f} s after the first"
            f" opened (bound {BOUND_S:g} s); {len(reads)} operator reads, slowest"
            f" {max(reads) * 1000:.0f} ms"
        )
        assert len(closed_at) == CONNECTIONS, "half-sent connections left open past the bound"
        assert reads, "no operator read was served"
        metrics = supervisor.scrape()
        assert f"tether_http_head_timeouts_total {CONNECTIONS:.1f}" in metrics
    finally:
        for sock in open_socks:
            with contextlib.suppress(OSError):
                sock.close()


def test_a_stalled_second_head_is_closed(supervisor: Cluster) -> None:
    sock = socket.create_connection(("127.0.0.1", supervisor.sup_port), timeout=10)
    with sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b'{"status":"ok"}' not in first:  # the answer may come in more than one piece
            piece = sock.recv(4096)
            assert piece, f"closed before the first answer was whole: {first!r}"
            first += piece
        assert first.startswith(b"HTTP/1.1 200"), first
        sock.sendall(HALF_HEAD)
        sock.settimeout(BOUND_S + SLACK_S)
        started = time.monotonic()
        assert sock.recv(4096) == b"", "the stalled head got an answer instead of a close"
        took = time.monotonic() - started
        print(f"\nclosed {took:.2f} s into the second head (bound {BOUND_S:g} s)")


def test_refused_tokens_write_a_bounded_number_of_lines(supervisor: Cluster) -> None:
    flood = 300
    started = time.monotonic()
    with httpx.Client(base_url=supervisor.url, trust_env=False, timeout=10) as client:
        for n in range(flood):
            answer = client.get("/v1/tasks", headers={"Authorization": f"Bearer made-up-{n}"})
            assert answer.status_code == 401
    elapsed = time.monotonic() - started
    proc = supervisor.procs[0]
    logged = len(proc.events("access refused"))
    suppressed = supervisor.scrape()
    counted = next(
        float(line.split()[1])
        for line in suppressed.splitlines()
        if line.startswith("tether_auth_refusals_suppressed_total ")
    )
    print(f"\n{flood} refused in {elapsed:.2f} s: {logged} lines logged, {counted:.0f} counted")
    assert logged <= PER_SECOND * (int(elapsed) + 2)
    assert logged + counted == flood


LOGIN_HEAD = (
    b"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken="
)


def answered_or_closed(sock: socket.socket) -> bool:
    """Whether the supervisor answered `sock` or closed it, without blocking."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def test_bodies_that_never_come_are_refused_within_the_bound(supervisor: Cluster) -> None:
    opened_at = time.monotonic()
    socks = []
    for _ in range(CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", supervisor.sup_port), timeout=10)
        sock.sendall(LOGIN_HEAD)
        sock.setblocking(False)
        socks.append(sock)
    try:
        done: set[int] = set()
        deadline = time.monotonic() + BOUND_S + SLACK_S
        while len(done) < CONNECTIONS and time.monotonic() < deadline:
            assert supervisor.http.get("/v1/tasks").status_code == 200
            done |= {
                n for n, sock in enumerate(socks) if n not in done and answered_or_closed(sock)
            }
            time.sleep(0.05)
        took = time.monotonic() - opened_at
        print(f"\n{len(done)} of {CONNECTIONS} withheld bodies answered in {took:.2f} s")
        assert len(done) == CONNECTIONS
        socks[0].setblocking(True)
        assert socks[0].recv(4096).startswith(b"HTTP/1.1 400"), "not refused as a bad request"
    finally:
        for sock in socks:
            sock.close()


def test_hang_ups_and_malformed_requests_write_a_bounded_number_of_lines(
    supervisor: Cluster,
) -> None:
    for _ in range(50):  # a body begun, then the connection closed
        with socket.create_connection(("127.0.0.1", supervisor.sup_port), timeout=10) as sock:
            sock.sendall(LOGIN_HEAD + b"abc")
    started = time.monotonic()
    for _ in range(100):  # not HTTP at all
        with socket.create_connection(("127.0.0.1", supervisor.sup_port), timeout=10) as sock:
            sock.sendall(b"GARBAGE\x00\r\n\r\n")
            with contextlib.suppress(OSError):
                sock.recv(4096)
    elapsed = time.monotonic() - started
    assert supervisor.http.get("/v1/tasks").status_code == 200
    text = supervisor.procs[0].log_path.read_text(errors="replace")
    assert "Traceback" not in text
    assert "Exception in ASGI application" not in text
    invalid = text.count("Invalid HTTP request received")
    print(f"\n100 malformed requests in {elapsed:.2f} s: {invalid} lines")
    assert 0 < invalid <= PER_SECOND * (int(elapsed) + 2)
