"""systemd notify without a dependency, one notifier for both programs: datagrams to a socket
path or an abstract name, and watchdog pings only when systemd asked this process for them."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.runner.test_runner_fakes import make_lease, make_rig
from tether.sdnotify import Notifier
from tether.supervisor import server


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        yield sock, path
    finally:
        sock.close()


def test_messages_reach_a_socket_path(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    notifier.ready()
    notifier.status("2 steps in flight")
    notifier.status("2 steps in flight")  # unchanged: not sent again
    notifier.stopping()
    got = [sock.recv(4096).decode() for _ in range(3)]
    assert got == ["READY=1", "STATUS=2 steps in flight", "STOPPING=1"]
    with pytest.raises(BlockingIOError):
        sock.recv(4096)


def test_an_abstract_socket_name_is_understood() -> None:
    name = f"tether-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).send("READY=1")
        assert sock.recv(64) == b"READY=1"


def test_without_a_socket_nothing_is_sent_and_nothing_fails(tmp_path: Path) -> None:
    assert not Notifier({}).send("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent")}).send("READY=1")


def test_the_watchdog_interval_is_half_of_watchdog_usec_for_this_process() -> None:
    assert Notifier({"WATCHDOG_USEC": "10000000"}).watchdog_interval_s == 5.0
    mine = {"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(mine).watchdog_interval_s == 5.0
    other = {"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}
    assert Notifier(other).watchdog_interval_s is None
    assert Notifier({"WATCHDOG_USEC": "junk"}).watchdog_interval_s is None


async def test_the_runner_says_ready_status_watchdog_and_stopping(
    tmp_path: Path, listener: tuple[socket.socket, str]
) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "40000"})
    rig = make_rig(tmp_path, notifier=notifier)
    got: list[str] = []
    arrived = anyio.Event()

    async def read() -> None:
        nonlocal arrived
        while True:
            await anyio.wait_readable(sock)
            got.append(sock.recv(4096).decode())
            arrived.set()
            arrived = anyio.Event()

    async def until(condition: object) -> None:
        with anyio.fail_after(5):
            while not condition():  # type: ignore[operator]
                await arrived.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        async with anyio.create_task_group() as runner_tg:
            runner_tg.start_soon(rig.serve)
            await until(lambda: "READY=1" in got)
            rig.supervisor.offer(make_lease("s1"))
            await until(lambda: any(m.startswith("STATUS=1 steps in flight") for m in got))
            await until(lambda: got.count("WATCHDOG=1") >= 3)
            rig.runner.request_shutdown()
        await until(lambda: "STOPPING=1" in got)
        tg.cancel_scope.cancel()
    assert got.index("READY=1") < got.index("STOPPING=1")
    assert "STATUS=0 steps in flight; stopping" in got


class _StartedServer:
    """What `_notify_when_started` reads of uvicorn's server: started, not yet stopping."""

    started = True
    should_exit = False


@pytest.mark.parametrize(("pid", "pings"), [("own", True), ("1", False)])
async def test_the_supervisor_pings_the_watchdog_only_for_its_own_pid(
    listener: tuple[socket.socket, str], pid: str, pings: bool
) -> None:
    sock, path = listener
    watchdog_pid = str(os.getpid()) if pid == "own" else pid
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "40000", "WATCHDOG_PID": watchdog_pid}
    started = _StartedServer()
    async with anyio.create_task_group() as tg:
        tg.start_soon(server._notify_when_started, started, Notifier(env))
        await anyio.sleep(0.2)  # ten watchdog intervals
        started.should_exit = True
    got: list[str] = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recv(4096).decode())
    assert got[:2] == ["READY=1", "STATUS=serving"]
    assert (got.count("WATCHDOG=1") >= 3) is pings, got
