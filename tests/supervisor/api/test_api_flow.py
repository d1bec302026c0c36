"""Whole conversations over HTTP: a two-step task from plan to SUCCEEDED, fifty duplicate
creates racing, and a failure nobody foresaw still answering in the wire's error shape."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import ApiHarness, assert_error, count, task_body


async def test_a_two_step_task_runs_to_success(api: ApiHarness) -> None:
    c, op, rn = api.client, api.operator, api.runner
    created = await c.post("/v1/tasks", headers=op, json=task_body("happy", 2))
    assert created.status_code == 201
    task = created.json()
    approved = await c.post(
        f"/v1/tasks/{task['id']}/approve", headers=op, json={"plan_hash": task["plan_hash"]}
    )
    assert approved.json()["state"] == "QUEUED"

    outputs: list[Any] = []
    for position in range(2):
        claim = await c.post(
            "/v1/leases/claim", headers=rn, json={"runner_id": "r1", "capacity": 2, "wait_s": 0}
        )
        assert claim.status_code == 200
        [lease] = claim.json()["leases"]  # steps run in order: one at a time
        assert lease["step_id"] == task["steps"][position]["id"]
        assert [o["output"] for o in lease["outputs"]] == outputs
        renew = await c.post(
            f"/v1/leases/{lease['step_id']}/renew", headers=rn, json={"fence": lease["fence"]}
        )
        assert renew.json()["cancelled"] is False
        output = {"answer": position}
        result = await c.post(
            f"/v1/steps/{lease['step_id']}/result",
            headers=rn,
            json={
                "fence": lease["fence"],
                "payload_hash": lease["payload_hash"],
                "output": output,
                "usage": {"total_tokens": 10},
            },
        )
        assert result.json() == {"outcome": "applied"}
        outputs.append(output)
    nothing = await c.post("/v1/leases/claim", headers=rn, json={"runner_id": "r1", "capacity": 1})
    assert nothing.status_code == 204

    view = (await c.get(f"/v1/tasks/{task['id']}", headers=op)).json()
    assert view["state"] == "SUCCEEDED"
    assert [s["state"] for s in view["steps"]] == ["committed", "committed"]
    assert all(s["effect_key"] for s in view["steps"])
    fences = [s["attempts"][0]["fence"] for s in view["steps"]]
    assert fences[0] < fences[1]
    assert count(api.path, "effects") == 2

    events = (await c.get(f"/v1/tasks/{task['id']}/events", headers=op)).json()["events"]
    seqs = [e["seq"] for e in events]
    assert all(a < b for a, b in itertools.pairwise(seqs)), seqs
    assert seqs[-1] == view["seq"]
    states = [e["state"] for e in events if e["kind"] == "state"]
    assert states == ["PLANNED", "APPROVED", "QUEUED", "RUNNING", "VERIFYING", "SUCCEEDED"]
    assert [e["kind"] for e in events].count("step_committed") == 2


async def test_fifty_concurrent_duplicate_creates_make_one_task(api: ApiHarness) -> None:
    answers: list[httpx.Response] = []

    async def create() -> None:
        body = task_body("once", 2)
        answers.append(await api.client.post("/v1/tasks", headers=api.operator, json=body))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(create)
    assert len(answers) == 50
    assert sorted(r.status_code for r in answers) == [200] * 49 + [201]
    assert len({r.json()["id"] for r in answers}) == 1
    assert count(api.path, "tasks") == 1
    assert count(api.path, "steps") == 2
    assert count(api.path, "events") == 1


async def test_an_unforeseen_failure_is_a_500_in_the_error_shape(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any) -> dict[str, Any]:
        raise RuntimeError("boom: a bug in a read model")

    task = await api.create("broken-read")
    monkeypatch.setattr(api.app.state.ledger, "task", broken)
    transport = httpx.ASGITransport(app=api.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://supervisor.test") as c:
        response = await c.get(f"/v1/tasks/{task['id']}", headers=api.operator)
    body = assert_error(response, 500, "internal")
    assert "boom" not in body["detail"]  # internals stay in the log, not on the wire
