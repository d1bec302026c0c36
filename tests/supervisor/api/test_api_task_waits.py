"""Why work waits, over HTTP in process (issue 16, findings 5 and 8): the task view says what a
task waits for (approval, a runner of its pool, the tenant's budget), shows attempts' times as
ISO 8601 and a failed or cancelled task's unrun steps as `skipped`; `GET /v1/tasks` lists each
task with its progress; `GET /v1/pools` and `/metrics` give each pool's queue and runners."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from tests.conftest import ApiHarness, raw_db
from tether.wire.records import PoolsAnswer, TaskDetail, TaskPage

NOW_ISO = "1970-01-12T13:46:40.000Z"  # FakeClock's start, 1_000_000.0


def plant_runner(api: ApiHarness, pool: str, runner_id: str, kinds: list[str], ago: float) -> None:
    """A row of `runners` as the claim rule writes it, seen `ago` seconds before now."""
    db = raw_db(api.path)
    try:
        seen = api.clock.now - ago
        db.execute(
            "INSERT INTO runners (pool, runner_id, token_id, kinds_json, first_seen, last_seen)"
            " VALUES (?, ?, NULL, ?, ?, ?)",
            (pool, runner_id, json.dumps(sorted(kinds)), seen, seen),
        )
    finally:
        db.close()


async def view(api: ApiHarness, task_id: str) -> dict[str, Any]:
    response = await api.client.get(f"/v1/tasks/{task_id}", headers=api.operator)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_planned_task_waits_for_approval(api: ApiHarness) -> None:
    task = await api.create("k")
    assert task["waiting_for"] == {"reason": "approval"}


async def test_a_queued_task_in_a_pool_no_runner_ever_claimed_in_says_so(
    api: ApiHarness,
) -> None:
    task = await api.queued("k")
    assert task["state"] == "QUEUED"
    assert task["waiting_for"] == {
        "reason": "runner",
        "pool": "default",
        "kind": "chat",
        "last_seen_s": None,
        "pool_last_seen_s": None,
    }


async def test_a_queued_task_says_how_long_ago_its_pools_runners_claimed(
    api: ApiHarness,
) -> None:
    task = await api.queued("k")
    plant_runner(api, "default", "gpu-box", ["agent"], ago=5)
    waiting = (await view(api, task["id"]))["waiting_for"]
    assert (waiting["last_seen_s"], waiting["pool_last_seen_s"]) == (None, 5.0)
    plant_runner(api, "default", "old-box", ["chat"], ago=400)
    waiting = (await view(api, task["id"]))["waiting_for"]
    assert (waiting["last_seen_s"], waiting["pool_last_seen_s"]) == (400.0, 5.0)


async def test_a_task_of_a_tenant_past_its_budget_waits_for_budget(api: ApiHarness) -> None:
    await api.app.state.ledger.set_budget("acme", 0)
    task = await api.queued("k")
    assert task["waiting_for"] == {"reason": "budget", "tenant": "acme", "spent": 0, "budget": 0}
    assert await api.claim() == []  # the claim rule agrees: nothing is granted


async def test_a_running_task_waits_for_nothing_and_shows_iso_times(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    shown = await view(api, task["id"])
    assert shown["waiting_for"] is None
    [attempt] = shown["steps"][0]["attempts"]
    assert (attempt["granted_at"], attempt["ended_at"]) == (NOW_ISO, None)
    api.clock.advance(1.5)
    assert (await api.report(lease)).status_code == 200
    [attempt] = (await view(api, task["id"]))["steps"][0]["attempts"]
    assert attempt["ended_at"] == "1970-01-12T13:46:41.500Z"


async def metric(api: ApiHarness, name: str) -> float | None:
    text = (await api.client.get("/metrics", headers=api.auth("metrics"))).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


async def test_a_failed_tasks_unrun_steps_are_skipped_and_not_counted_as_waiting(
    api: ApiHarness,
) -> None:
    task = await api.queued("k", steps=3)
    [lease] = await api.claim()
    released = await api.client.post(
        f"/v1/leases/{lease['step_id']}/release",
        headers=api.runner,
        json={"fence": lease["fence"], "reason": "invalid", "retryable": False},
    )
    assert released.status_code == 200, released.text
    shown = await view(api, task["id"])
    assert shown["state"] == "FAILED"
    assert [s["state"] for s in shown["steps"]] == ["failed", "skipped", "skipped"]
    assert await metric(api, 'tether_steps{state="skipped"}') == 2
    assert await metric(api, 'tether_steps{state="waiting"}') is None


async def test_a_cancelled_tasks_unrun_steps_are_skipped(api: ApiHarness) -> None:
    task = await api.queued("k", steps=2)
    [lease] = await api.claim()
    cancelled = await api.client.post(
        f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={"reason": "no"}
    )
    assert cancelled.status_code == 200
    steps = cancelled.json()["steps"]
    assert [s["state"] for s in steps] == ["cancelled", "skipped"]  # the first one ran
    assert lease["step_id"] == steps[0]["id"]
    assert await metric(api, 'tether_steps{state="queued"}') is None


async def test_the_list_gives_each_tasks_progress_and_wait(api: ApiHarness) -> None:
    first = await api.queued("a", steps=2)
    [lease] = await api.claim()
    assert (await api.report(lease)).status_code == 200
    await api.create("b")
    response = await api.client.get("/v1/tasks", headers=api.operator)
    page = msgspec.convert(response.json(), TaskPage)
    assert page.tasks[1].id == first["id"]
    newest, oldest = page.tasks
    assert (newest.steps_committed, newest.steps_total) == (0, 1)
    assert newest.waiting_for is not None
    assert newest.waiting_for.reason == "approval"
    assert (oldest.steps_committed, oldest.steps_total) == (1, 2)
    assert oldest.waiting_for is not None
    assert oldest.waiting_for.reason == "runner"


async def test_the_task_view_is_the_operators_record(api: ApiHarness) -> None:
    task = await api.queued("k", steps=2)
    record = msgspec.convert(await view(api, task["id"]), TaskDetail)
    assert [s.name for s in record.steps] == ["s0", "s1"]
    assert record.waiting_for is not None
    assert record.waiting_for.pool == "default"


async def test_pools_show_the_tenants_queues_and_recent_runners_only(api: ApiHarness) -> None:
    await api.queued("k1")
    api.clock.advance(30)
    await api.queued("k2")
    plant_runner(api, "default", "box-1", ["chat", "agent"], ago=3)
    plant_runner(api, "default", "gone", ["chat"], ago=3600)
    plant_runner(api, "rival", "theirs", ["chat"], ago=1)  # another tenant's pool
    response = await api.client.get("/v1/pools", headers=api.operator)
    assert response.status_code == 200, response.text
    answer = msgspec.json.decode(response.content, type=PoolsAnswer)
    by_pool = {p.pool: p for p in answer.pools}
    assert set(by_pool) == {"default", "acme"}  # shared and its own, even empty
    default = by_pool["default"]
    assert (default.queued, default.in_flight, default.oldest_queued_s) == (2, 0, 30.0)
    assert [(r.runner_id, r.kinds, r.last_seen_s) for r in default.runners] == [
        ("box-1", ("agent", "chat"), 3.0)
    ]
    assert (by_pool["acme"].queued, by_pool["acme"].runners) == (0, ())
    await api.claim()
    default = msgspec.json.decode(
        (await api.client.get("/v1/pools", headers=api.operator)).content, type=PoolsAnswer
    ).pools[1]
    assert (default.pool, default.queued, default.in_flight) == ("default", 1, 1)


async def test_pools_need_an_operator_token(api: ApiHarness) -> None:
    response = await api.client.get("/v1/pools", headers=api.runner)
    assert response.status_code == 403


async def test_metrics_give_each_pools_queue_and_runners(api: ApiHarness) -> None:
    await api.queued("k1")
    api.clock.advance(12)
    plant_runner(api, "gpu", "box-1", ["chat"], ago=2)
    assert await metric(api, 'tether_pool_queued{pool="default"}') == 1
    assert await metric(api, 'tether_pool_in_flight{pool="default"}') == 0
    assert await metric(api, 'tether_pool_oldest_queued_seconds{pool="default"}') == 12
    assert await metric(api, 'tether_pool_runners_seen{pool="default"}') == 0
    assert await metric(api, 'tether_pool_runners_seen{pool="gpu"}') == 1
