"""A claim whose runner hung up is never granted a lease: the step stays queued for a runner
that is listening, instead of sitting out the acceptance window on a dead connection."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from tests.conftest import ApiHarness, count


class Client:
    """One ASGI request from a client that sends `body`, then hangs up when `hung_up` is set;
    what the app sends back lands in `sent`."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.hung_up = anyio.Event()
        self.sent: list[dict[str, Any]] = []
        self._delivered = False

    async def receive(self) -> dict[str, Any]:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def test_a_disconnected_claim_grants_nothing_and_the_step_stays_queued(
    api: ApiHarness,
) -> None:
    body = json.dumps({"runner_id": "gone", "capacity": 1, "wait_s": 20}).encode()
    client = Client(body)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/leases/claim",
        "raw_path": b"/v1/leases/claim",
        "query_string": b"",
        "root_path": "",
        "server": ("test", 80),
        "client": ("test", 1),
        "headers": [
            (b"authorization", api.runner["Authorization"].encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "state": dict(api.app.state._state) if hasattr(api.app.state, "_state") else {},
    }

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(api.app, scope, client.receive, client.send)
            await anyio.wait_all_tasks_blocked()
            client.hung_up.set()  # the runner goes away while its claim waits for work
            await anyio.wait_all_tasks_blocked()
            task = await api.queued("after-hangup")  # work arrives after the hang-up

    assert client.sent[0]["status"] == 204
    assert count(api.path, "attempts") == 0
    leases = await api.claim(runner_id="listening")
    assert [lease["task_id"] for lease in leases] == [task["id"]]


async def test_an_events_poll_whose_client_hung_up_ends_at_once(api: ApiHarness) -> None:
    """An operator's `watch` that went away does not hold its handler for the whole wait."""
    task = await api.create("watched")
    client = Client(b"")

    after = task["seq"]
    query = f"after={after}&wait=60".encode()
    path = f"/v1/tasks/{task['id']}/events"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "server": ("test", 80),
        "client": ("test", 1),
        "headers": [(b"authorization", api.operator["Authorization"].encode())],
        "state": dict(api.app.state._state) if hasattr(api.app.state, "_state") else {},
    }

    with anyio.fail_after(5):  # well within the 60 s the poll asked for
        async with anyio.create_task_group() as tg:
            tg.start_soon(api.app, scope, client.receive, client.send)
            await anyio.wait_all_tasks_blocked()
            assert client.sent == []  # still waiting for an event
            client.hung_up.set()
    assert client.sent[0]["status"] == 200


async def test_a_ledger_error_in_a_long_poll_keeps_its_wire_code(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims and event polls run beside a hang-up watcher; a ledger error inside them still
    reaches the client as its own code (503 for storage), not as a 500 for an exception group."""
    from tests.conftest import assert_error
    from tether.supervisor.ledger import StorageError

    task = await api.create("watched")

    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise StorageError("disk I/O error")

    monkeypatch.setattr(api.app.state.ledger, "claim", broken)
    monkeypatch.setattr(api.app.state.ledger, "events", broken)
    claim = await api.client.post(
        "/v1/leases/claim", headers=api.runner, json={"runner_id": "r", "capacity": 1}
    )
    assert_error(claim, 503, "unavailable")
    events = await api.client.get(f"/v1/tasks/{task['id']}/events", headers=api.operator)
    assert_error(events, 503, "unavailable")
