"""Readiness means a supervisor (issue 16, finding 2), and the runner's lines about it name
what they are about (finding 9): its pool and kinds at start, the method and URL of every
HTTP error, and `claiming resumed` only when claiming did.

The runner's first call is `GET /v1/runner`. Only a runner identity, or a refusal of the token
in the contract's error shape, is a supervisor's answer: anything else stops the runner at
start with one line naming the URL, exit 2, and no READY=1.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog.testing

from tests.conftest import ApiHarness
from tests.runner.test_runner_fakes import (
    TOKEN,
    FakeSupervisor,
    JumpClock,
    error,
    hang,
    json_response,
    make_lease,
    make_rig,
)
from tests.runner.test_runner_processes import Cluster, environment, program, wait_for
from tests.runner.test_runner_steps import step_outcomes, until
from tether.clocks import LoopClock
from tether.runner.daemon import NOT_A_SUPERVISOR_EXIT
from tether.runner.errors import LeaseLost, SupervisorRefused, SupervisorUnreachable
from tether.runner.supervisor_client import SupervisorClient
from tether.sdnotify import Notifier


class RecordingNotifier(Notifier):
    """What the runner tells systemd, kept in a list."""

    def __init__(self) -> None:
        super().__init__({})
        self.sent: list[str] = []

    def send(self, message: str) -> bool:
        self.sent.append(message)
        return True


def html(status: int) -> httpx.Response:
    return httpx.Response(status, html="<html><body>Not the page you want</body></html>")


NOT_TETHER = {
    "an HTML page": html(200),
    "an HTML 404": html(404),
    "the model server's 404": json_response(404, {"detail": "Not Found"}),
    "the model server's 401": json_response(
        401, {"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}
    ),
    "JSON that is not an identity": json_response(200, {"status": "ok"}),
    "an error code tether does not have": error(401, "who_are_you"),
}


@pytest.mark.parametrize("answer", NOT_TETHER.values(), ids=NOT_TETHER.keys())
async def test_an_answer_that_is_not_a_supervisors_stops_the_runner_before_ready(
    tmp_path: Path, answer: httpx.Response
) -> None:
    notifier = RecordingNotifier()
    rig = make_rig(tmp_path, notifier=notifier)
    rig.supervisor.script("whoami", answer)
    with structlog.testing.capture_logs() as logs, anyio.fail_after(5):
        await rig.serve()
    assert rig.exit_code == NOT_A_SUPERVISOR_EXIT
    assert "READY=1" not in notifier.sent
    assert rig.supervisor.of("claim") == []
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert line["event"].startswith("cannot start: http://supervisor.test is not a tether")
    assert "GET http://supervisor.test/v1/runner answered" in line["event"]


async def test_a_supervisor_url_ending_in_v1_is_named_with_the_fix(tmp_path: Path) -> None:
    """The supervisor's own 404 (`/v1/v1/runner`) is in the contract's shape, yet not an
    identity: the line says to drop /v1."""
    notifier = RecordingNotifier()
    rig = make_rig(tmp_path, notifier=notifier, supervisor_url="http://supervisor.test/v1")
    rig.supervisor.script("whoami", error(404, "not_found", "no route /v1/v1/runner"))
    with structlog.testing.capture_logs() as logs, anyio.fail_after(5):
        await rig.serve()
    assert rig.exit_code == NOT_A_SUPERVISOR_EXIT
    assert "READY=1" not in notifier.sent
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert "GET http://supervisor.test/v1/v1/runner answered 404 not_found" in line["event"]
    assert "without /v1" in line["event"]


async def test_a_proxys_502_while_the_supervisor_restarts_is_waited_out(tmp_path: Path) -> None:
    notifier = RecordingNotifier()
    rig = make_rig(tmp_path, notifier=notifier)
    rig.supervisor.script("whoami", html(502), html(502))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await rig.supervisor.until(lambda: bool(rig.supervisor.of("claim")))
            rig.runner.request_shutdown()
    assert rig.exit_code == 0
    assert len(rig.supervisor.of("whoami")) == 3
    assert notifier.sent.count("READY=1") == 1
    (down,) = [e for e in logs if e["event"] == "supervisor unreachable; retrying with backoff"]
    assert "GET http://supervisor.test/v1/runner answered 502" in down["error"]


async def test_ready_once_after_the_supervisor_answers_and_the_line_names_pool_and_kinds(
    tmp_path: Path,
) -> None:
    notifier = RecordingNotifier()
    rig = make_rig(tmp_path, notifier=notifier, supervisor=FakeSupervisor(pool="acme/gpu"))
    rig.supervisor.offer(make_lease("s1"))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await until(rig, lambda: step_outcomes(rig) == ["applied"])
            await rig.supervisor.until(lambda: len(rig.supervisor.of("claim")) >= 3)
            rig.runner.request_shutdown()
    assert notifier.sent.count("READY=1") == 1
    (line,) = [e for e in logs if e["event"] == "supervisor answered; claiming"]
    assert (line["pool"], line["kinds"], line["runner_id"]) == (
        "acme/gpu",
        ["agent", "chat", "verify"],
        "test-runner",
    )
    assert not any(e["log_level"] == "error" for e in logs)


async def test_claiming_resumed_is_logged_only_once_the_supervisor_takes_the_token(
    tmp_path: Path,
) -> None:
    """A token refused at start: READY (a supervisor answered) and a pause. When the pause ends
    on the same bad token, claiming pauses again with no `claiming resumed`; once the operator
    writes a good token, it is logged once, naming the pool."""
    clock = JumpClock()
    notifier = RecordingNotifier()
    rig = make_rig(tmp_path, clock=clock, notifier=notifier, pause_initial_s=60.0)
    sup = rig.supervisor
    sup.token = "the-new-token-4d5e6f"  # the runner's token was revoked and replaced
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await sup.until(lambda: len(sup.of("whoami")) == 1)
            await until(rig, lambda: rig.runner.paused)
            assert notifier.sent.count("READY=1") == 1
            clock.jump(60.0)  # the pause ends; the token file still holds the old token
            await sup.until(lambda: len(sup.of("whoami")) == 2)
            await until(rig, lambda: rig.runner.paused)
            assert not any(e["event"] == "claiming resumed" for e in logs)
            (tmp_path / "runner-token").write_text(sup.token + "\n")  # the operator's fix
            clock.jump(120.0)
            await sup.until(lambda: bool(sup.of("claim")))
            with anyio.fail_after(5):  # logged right after the claim's answer
                while not any(e["event"] == "claiming resumed" for e in logs):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            rig.runner.request_shutdown()
    paused = [e for e in logs if str(e["event"]).startswith("claiming paused")]
    assert len(paused) == 2
    assert "GET http://supervisor.test/v1/runner answered 401 unauthorized" in paused[0]["event"]
    (resumed,) = [e for e in logs if e["event"] == "claiming resumed"]
    assert resumed["pool"] == "default"
    assert sup.of("claim")[0].body["wait_s"] == 0.0  # the first claim after a pause: at once
    assert notifier.sent.count("READY=1") == 1


# -- every HTTP error names its method and URL -----------------------------------------------


def client_for(sup: FakeSupervisor) -> SupervisorClient:
    return SupervisorClient(
        base_url="http://supervisor.test", token=TOKEN, clock=LoopClock(), transport=sup.transport
    )


async def test_error_details_name_the_method_and_url() -> None:
    sup = FakeSupervisor()
    client = client_for(sup)
    sup.script("renew", html(404))
    with pytest.raises(LeaseLost) as lost:
        await client.renew("s1", 1)
    assert "POST http://supervisor.test/v1/leases/s1/renew answered 404" in lost.value.detail
    sup.script("claim", error(422, "invalid_field", "'wait_s' must be in 0.0..30.0"))
    with pytest.raises(SupervisorRefused) as refused:
        await client.claim("r1", 1, 60.0)
    assert str(refused.value) == (
        "POST http://supervisor.test/v1/leases/claim answered 422 invalid_field:"
        " 'wait_s' must be in 0.0..30.0"
    )
    sup.script("renew", httpx.ReadError(""))
    with pytest.raises(SupervisorUnreachable) as unreachable:
        await client.renew("s1", 1)
    assert unreachable.value.detail == (
        "POST http://supervisor.test/v1/leases/s1/renew: ReadError:"
        " no answer: the connection was closed or reset"
    )
    await client.aclose()


async def test_the_runners_lines_about_a_404_name_the_call(tmp_path: Path) -> None:
    """A renew answered 404 (here a proxy's page: the route is not there) drops the step;
    its line says which request met the 404, where."""
    rig = make_rig(tmp_path)
    rig.supervisor.renewals_route_missing = True  # the single route, where the proxy answers
    rig.supervisor.script("renew", html(404))
    rig.model.script(hang)
    rig.supervisor.offer(make_lease("s1", renew_every_s=0.02))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.serve)
            await until(rig, lambda: step_outcomes(rig) == ["dropped: not_found"])
            rig.runner.request_shutdown()
    (line,) = [e for e in logs if e["event"] == "renew refused; dropping the step"]
    assert "POST http://supervisor.test/v1/leases/s1/renew answered 404" in line["error"]


async def test_a_batch_items_error_names_the_request_and_its_step() -> None:
    sup = FakeSupervisor()
    client = client_for(sup)
    answers = await client.report_many(
        [("s9", b'{"step_id":"s9","fence":1,"payload_hash":"h","output":1}')]
    )
    (lost,) = answers
    assert isinstance(lost, Exception)
    assert "POST http://supervisor.test/v1/steps/results (step s9) answered" in str(lost)
    await client.aclose()


# -- the route ---------------------------------------------------------------------------------


async def test_get_runner_returns_the_tokens_pool_and_id(api: ApiHarness) -> None:
    mine = await api.client.get("/v1/runner", headers=api.runner)
    assert mine.status_code == 200
    body: dict[str, Any] = mine.json()
    assert body["pool"] == "default"
    assert body["token_id"]
    assert body["token_id"] not in api.secrets["runner"]
    other = await api.client.get("/v1/runner", headers=api.auth("stranger"))
    assert other.json()["pool"] != "default"
    operator = await api.client.get("/v1/runner", headers=api.operator)
    assert (operator.status_code, operator.json()["error"]) == (403, "forbidden")
    nobody = await api.client.get("/v1/runner")
    assert (nobody.status_code, nobody.json()["error"]) == (401, "unauthorized")


# -- as real processes, with systemd's notify socket -------------------------------------------


def _notify_socket() -> tuple[socket.socket, str]:
    """An abstract datagram socket standing in for systemd's; `@name` for NOTIFY_SOCKET."""
    name = f"tether-readiness-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(0.05)
    return sock, "@" + name


def _received(sock: socket.socket, got: list[str]) -> list[str]:
    with contextlib.suppress(TimeoutError, BlockingIOError):
        while True:
            got.extend(sock.recv(4096).decode().splitlines())
    return got


def _runner_argv(cluster: Cluster, supervisor_url: str) -> list[str]:
    argv = [*program("tether-runner"), "run", "--supervisor", supervisor_url]
    argv += ["--token-file", str(cluster.runner_token_file), "--model", "stand-in"]
    return [*argv, "--model-url", f"{cluster.model_url}/v1", "--runner-id", "r-ready"]


@pytest.mark.slow
@pytest.mark.parametrize("aim", ["the model", "the supervisor's /v1"])
def test_a_runner_process_aimed_elsewhere_exits_2_with_one_line_and_no_ready(
    tmp_path: Path, aim: str
) -> None:
    cluster = Cluster(tmp_path)
    sock, address = _notify_socket()
    try:
        cluster.start_supervisor()
        cluster.start_model()
        url = cluster.model_url if aim == "the model" else f"{cluster.url}/v1"
        env = environment(TETHER_LOG_FORMAT="json", NOTIFY_SOCKET=address)
        runner = cluster.start("runner", _runner_argv(cluster, url), env)
        assert runner.popen.wait(20) == NOT_A_SUPERVISOR_EXIT, cluster.report()
        (line,) = [e for e in runner.lines() if e.get("level") == "error"]
        assert f"{url} is not a tether supervisor" in line["event"]
        assert f"GET {url}/v1/runner answered 404" in line["event"]
        assert "READY=1" not in _received(sock, [])
    finally:
        sock.close()
        cluster.stop_all()


@pytest.mark.slow
def test_a_runner_process_aimed_at_the_supervisor_is_ready_once_naming_its_pool(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path)
    sock, address = _notify_socket()
    try:
        cluster.start_supervisor()
        cluster.start_model()
        env = environment(TETHER_LOG_FORMAT="json", TETHER_CLAIM_WAIT_S="1", NOTIFY_SOCKET=address)
        runner = cluster.start("runner", _runner_argv(cluster, cluster.url), env)
        got: list[str] = []
        wait_for(lambda: "READY=1" in _received(sock, got), "READY=1", 20, cluster)
        (line,) = wait_for(lambda: runner.events("supervisor answered"), "its line", 5, cluster)
        assert (line["pool"], line["runner_id"]) == ("default", "r-ready")
        assert "chat" in line["kinds"]
        task_id = cluster.submit()
        wait_for(lambda: cluster.state(task_id) == "SUCCEEDED", "the task", 20, cluster)
        assert runner.stop() == 0
        assert _received(sock, got).count("READY=1") == 1
    finally:
        sock.close()
        cluster.stop_all()
