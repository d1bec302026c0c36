"""Preemption notices on the runner (issue 27), in process: each cloud's source read against
the stand-in metadata service (examples/standin_metadata.py) and against answers it would
never give, the deadline taken from the provider's own clock, the watch riding out an
unreadable source, and the runner's response to a notice against the fake supervisor: claiming
stops, a step in flight is released `preempted` (`shutdown` for a supervisor that predates
that reason), a step of another kind may finish within the window."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog.testing

from examples.standin_metadata import create_app
from tests.runner.test_runner_fakes import (
    FakeSupervisor,
    VirtualClock,
    completion,
    error,
    make_lease,
    make_rig,
)
from tether.clocks import LoopClock
from tether.runner.daemon import PREEMPTION_RESERVE_S
from tether.runner.lease import Lease
from tether.runner.preemption import (
    Notice,
    NoticeUnreadable,
    PreemptionWatch,
    metadata_client,
    source_for,
)
from tether.runner.preemption import aws as aws_source
from tether.wire import records
from tether.wire.codec import decode

BASE = "http://metadata.test"


def metadata(vm_name: str = "spot-vm-1") -> tuple[Any, httpx.AsyncClient]:
    app = create_app(vm_name)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), trust_env=False)
    return app, http


async def announce(http: httpx.AsyncClient, **notice: Any) -> None:
    answer = await http.post(f"{BASE}/_admin/notice", json=notice)
    assert answer.status_code == 200, answer.text


# -- the sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
async def test_each_cloud_says_nothing_until_its_notice_then_says_so(provider: str) -> None:
    app, http = metadata()
    async with http:
        source = source_for(provider, BASE, http=http, clock=LoopClock())
        assert await source.poll() is None
        assert await source.poll() is None
        await announce(http, in_s=90, action="terminate")
        notice = await source.poll()
    assert notice is not None
    assert notice.provider == provider
    assert app.state.metadata.refused == 0  # every request in its documented shape
    if provider == "gcp":  # the answer names no time: the documented 30 s
        assert (notice.action, notice.deadline, notice.left_s) == ("preempt", None, 30.0)
        return
    # The time left is the provider's deadline against its own answer's Date: 90 s (less
    # what a loaded machine took between the announcement and the poll), not the 120 s or
    # 30 s documented.
    assert notice.deadline is not None
    assert notice.left_s is not None
    assert 30 < notice.left_s <= 90
    assert notice.action == ("terminate" if provider == "aws" else "Preempt")


async def test_aws_asks_for_one_token_and_again_when_it_is_refused() -> None:
    app, http = metadata()
    async with http:
        source = source_for("aws", BASE, http=http, clock=LoopClock())
        for _ in range(3):
            assert await source.poll() is None
        state = app.state.metadata
        assert state.requests["aws_token"] == 1
        state.tokens.clear()  # the metadata service forgot it (a restart)
        assert await source.poll() is None
    assert state.requests["aws_token"] == 2
    assert state.refused == 1  # the one 401 that made it ask again


async def test_azure_ignores_a_preempt_of_another_vm() -> None:
    _app, http = metadata("spot-vm-1")
    async with http:
        source = source_for("azure", BASE, http=http, clock=LoopClock())
        await announce(http, vm="spot-vm-2")
        assert await source.poll() is None
        await announce(http)
        assert await source.poll() is not None


async def test_the_deadline_is_read_on_the_providers_clock_not_this_servers() -> None:
    """The answer's time and its Date header are a day away from this machine's clock: the
    time left is still what the provider meant."""

    async def imds(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            return httpx.Response(200, text="token")
        return httpx.Response(
            200,
            json={"action": "stop", "time": "2031-01-02T03:04:50Z"},
            headers={"Date": "Thu, 02 Jan 2031 03:04:05 GMT"},
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(imds)) as http:
        notice = await source_for("aws", BASE, http=http, clock=LoopClock()).poll()
    assert notice == Notice(
        provider="aws", action="stop", deadline="2031-01-02T03:04:50Z", left_s=45.0
    )


async def test_without_a_date_the_documented_notice_counts() -> None:
    async def imds(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            return httpx.Response(200, text="token")
        return httpx.Response(200, json={"action": "terminate", "time": "2031-01-02T03:04:50Z"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(imds)) as http:
        notice = await source_for("aws", BASE, http=http, clock=LoopClock()).poll()
    assert notice is not None
    assert notice.left_s == aws_source.DOCUMENTED_NOTICE_S


@pytest.mark.parametrize(
    ("provider", "answer"),
    [
        ("gcp", httpx.Response(200, text="TRUE")),  # not the metadata server: no flavor header
        ("gcp", httpx.Response(200, text="maybe", headers={"Metadata-Flavor": "Google"})),
        ("aws", httpx.Response(200, json={"action": "terminate"})),
        ("aws", httpx.Response(200, text="<html>captive portal</html>")),
        ("azure", httpx.Response(200, json={"Events": "none"})),
        ("azure", httpx.Response(500, text="oops")),
    ],
)
async def test_an_answer_in_another_shape_is_unreadable_not_a_notice(
    provider: str, answer: httpx.Response
) -> None:
    async def serve(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT" or "compute/name" in str(request.url):
            return httpx.Response(200, text="spot-vm-1")
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as http:
        with pytest.raises(NoticeUnreadable):
            await source_for(provider, BASE, http=http, clock=LoopClock()).poll()


async def test_a_file_is_a_notice_once_it_exists(tmp_path: Path) -> None:
    path = tmp_path / "preempted"
    async with httpx.AsyncClient() as http:
        source = source_for("file", str(path), http=http, clock=LoopClock())
        assert await source.poll() is None
        path.touch()
        assert await source.poll() == Notice(
            provider="file", action="file", deadline=None, left_s=None
        )


# -- the watch -----------------------------------------------------------------------------------


class Flaky:
    """A source that fails `failures` times, answers nothing `quiet` times, then a notice."""

    provider = "aws"

    def __init__(self, failures: int, quiet: int, error: Exception) -> None:
        self.failures, self.quiet, self.error = failures, quiet, error
        self.polls = 0

    async def poll(self) -> Notice | None:
        self.polls += 1
        if self.failures:
            self.failures -= 1
            raise self.error
        if self.quiet:
            self.quiet -= 1
            return None
        return Notice(provider="aws", action="terminate", deadline="then", left_s=100.0)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("connection refused"),
        NoticeUnreadable("spot/instance-action answered 500"),
        RuntimeError("a bug in a source"),
    ],
)
async def test_an_unreadable_source_is_logged_once_and_polled_with_backoff(
    failure: Exception,
) -> None:
    clock = VirtualClock()
    source = Flaky(failures=6, quiet=2, error=failure)
    heard: list[tuple[Notice, float]] = []
    watch = PreemptionWatch(
        source, poll_s=2.0, clock=clock, on_notice=lambda n, at: heard.append((n, at)), where="x"
    )
    with structlog.testing.capture_logs() as logs:
        await watch.run()
    events = [line["event"] for line in logs]
    assert events.count("preemption notices cannot be read; serving on, polling with backoff") == 1
    assert events.count("preemption notices readable again") == 1
    assert clock.sleeps == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 2.0, 2.0]
    assert source.polls == 9
    assert [n.action for n, _ in heard] == ["terminate"]
    assert heard[0][1] == clock.now()


# -- the runner ----------------------------------------------------------------------------------


def notice(left_s: float | None) -> Notice:
    return Notice(
        provider="aws", action="terminate", deadline="2031-01-02T03:04:50Z", left_s=left_s
    )


async def test_a_notice_stops_claiming_and_releases_a_step_past_its_window_preempted(
    tmp_path: Path,
) -> None:
    """A chat step (it saves nothing on its way) may finish inside the window; one whose
    model call outlasts it is cancelled there and released `preempted`, retryable."""
    sup = FakeSupervisor()
    sup.requeue_released = False
    rig = make_rig(tmp_path, supervisor=sup, concurrency=1)
    held = anyio.Event()

    async def slow(_request: httpx.Request) -> httpx.Response:
        held.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    rig.model.script(slow)
    sup.offer(make_lease("step-1"))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await held.wait()
            claims = len(sup.of("claim"))
            rig.runner.preempt(notice(PREEMPTION_RESERVE_S + 0.2), LoopClock().now())
            await sup.until(lambda: bool(sup.of("release")))
            sup.offer(make_lease("step-2"))  # never claimed: claiming stopped for good
            await anyio.sleep(0.5)
            assert rig.runner.in_flight == 0
            rig.runner.request_shutdown()
    [release] = sup.of("release")
    assert (release.body["reason"], release.body["retryable"]) == ("preempted", True)
    assert "aws reclaims the server (terminate)" in release.body["detail"]
    assert len(sup.of("claim")) == claims
    assert rig.exit_code == 0


async def test_a_notice_while_the_supervisor_is_unreachable_means_no_claim_after(
    tmp_path: Path,
) -> None:
    """The notice comes while the runner still waits for the supervisor's first answer (or
    sits out a pause): that wait is cancelled with the claim, so nothing is claimed after."""
    sup = FakeSupervisor()
    sup.down = True
    sup.offer(make_lease("step-1"))
    rig = make_rig(tmp_path, supervisor=sup)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: len(sup.of("whoami")) >= 2)  # retrying with backoff
            rig.runner.preempt(notice(100.0), LoopClock().now())
            asked = len(sup.of("whoami"))
            sup.down = False
            await anyio.sleep(0.5)  # backoff_max_s is 0.05: it would have asked again
            rig.runner.request_shutdown()
    assert len(sup.of("whoami")) == asked
    assert sup.of("claim") == []
    assert rig.exit_code == 0


async def test_a_chat_step_whose_answer_comes_inside_the_window_reports_it(
    tmp_path: Path,
) -> None:
    sup = FakeSupervisor()
    rig = make_rig(tmp_path, supervisor=sup, concurrency=1)
    held, answer = anyio.Event(), anyio.Event()

    async def later(_request: httpx.Request) -> httpx.Response:
        held.set()
        await answer.wait()
        return completion("kept")

    rig.model.script(later)
    sup.offer(make_lease("step-1"))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await held.wait()
            rig.runner.preempt(notice(None), LoopClock().now())  # the window: the grace, 2 s
            answer.set()
            await sup.until(lambda: bool(sup.of("result")))
            rig.runner.request_shutdown()
    assert sup.of("release") == []
    assert sup.of("result")[0].body["output"]["text"] == "kept"


async def test_a_lease_that_comes_after_the_notice_is_released_without_work(
    tmp_path: Path,
) -> None:
    sup = FakeSupervisor()
    sup.requeue_released = False
    rig = make_rig(tmp_path, supervisor=sup, concurrency=2)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: bool(sup.of("claim")))
            rig.runner.preempt(notice(100.0), LoopClock().now())
            # A lease already granted (a claim answer, or one riding on a result) arrives.
            rig.runner._start_eager([_lease(sup, "late")])
            await sup.until(lambda: bool(sup.of("release")))
            rig.runner.request_shutdown()
    assert [c.body["reason"] for c in sup.of("release")] == ["preempted"]
    assert rig.model.requests == []


async def test_a_supervisor_older_than_preempted_gets_shutdown_instead(tmp_path: Path) -> None:
    sup = FakeSupervisor()
    sup.requeue_released = False
    rig = make_rig(tmp_path, supervisor=sup, concurrency=1)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: bool(sup.of("claim")))
            rig.runner.preempt(notice(100.0), LoopClock().now())
            sup.script("release", error(422, "invalid_field", "reason: not a valid value"))
            rig.runner._start_eager([_lease(sup, "late")])
            await sup.until(lambda: len(sup.of("release")) == 2)
            rig.runner.request_shutdown()
    assert [c.body["reason"] for c in sup.of("release")] == ["preempted", "shutdown"]


def _lease(sup: FakeSupervisor, step_id: str) -> Lease:
    """A lease the fake supervisor granted, as the runner holds it."""
    raw = make_lease(step_id, fence=7)
    sup.fences[step_id] = 7
    sup.leases[step_id] = raw
    granted = decode(httpx.Response(200, json=raw).content, records.Lease)
    return Lease.held(granted, answered_at=LoopClock().now())


async def test_the_metadata_service_is_never_asked_through_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The environment names a proxy (here one that refuses every connection): the runner's
    metadata requests go straight to the metadata address all the same."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refusing = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, refusing)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    asked: list[bytes] = []

    async def metadata_server(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive()
            asked.append(request)
            await stream.send(
                b"HTTP/1.1 200 OK\r\nMetadata-Flavor: Google\r\nContent-Length: 5\r\n"
                b"Connection: close\r\n\r\nFALSE"
            )

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    with anyio.fail_after(10):
        async with listener, anyio.create_task_group() as tg, metadata_client() as http:
            tg.start_soon(listener.serve, metadata_server)
            source = source_for("gcp", f"http://127.0.0.1:{port}", http=http, clock=LoopClock())
            assert await source.poll() is None
            tg.cancel_scope.cancel()
    [request] = asked
    assert request.startswith(b"GET /computeMetadata/v1/instance/preempted HTTP/1.1")
