"""Every route of docs/design.md, Wire protocol v1, over HTTP, in process: what each one answers,
and each of its 409s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import (
    ApiHarness,
    FakeClock,
    assert_error,
    chat_payload,
    count,
    ledger_snapshot,
    open_api,
    task_body,
)
from tests.supervisor.api.test_api_repository_tasks import add_app, make_remote, work
from tether.supervisor.api import drain

# -- POST /v1/tasks ----------------------------------------------------------------------------


async def test_create_answers_201_then_200_for_the_same_task(api: ApiHarness) -> None:
    first = await api.client.post("/v1/tasks", headers=api.operator, json=task_body("k", 2))
    assert first.status_code == 201
    task = first.json()
    assert task["state"] == "PLANNED"
    assert task["tenant"] == "acme"
    assert task["idempotency_key"] == "k"
    assert [s["name"] for s in task["steps"]] == ["s0", "s1"]
    again = await api.client.post("/v1/tasks", headers=api.operator, json=task_body("k", 2))
    assert again.status_code == 200
    assert again.json()["id"] == task["id"]
    assert count(api.path, "tasks") == 1


async def test_create_with_another_plan_under_the_same_key_is_a_conflict(api: ApiHarness) -> None:
    await api.create("k", 1)
    before = ledger_snapshot(api.path)
    response = await api.client.post("/v1/tasks", headers=api.operator, json=task_body("k", 2))
    assert_error(response, 409, "idempotency_conflict")
    assert ledger_snapshot(api.path) == before


async def test_the_same_key_in_two_tenants_names_two_tasks(api: ApiHarness) -> None:
    ours = await api.create("k")
    theirs = await api.client.post("/v1/tasks", headers=api.auth("rival"), json=task_body("k"))
    assert theirs.status_code == 201
    assert theirs.json()["id"] != ours["id"]
    assert theirs.json()["tenant"] == "rival"


# -- GET /v1/tasks -----------------------------------------------------------------------------


async def test_list_is_newest_first_and_pages_with_the_next_cursor(api: ApiHarness) -> None:
    created = [(await api.create(f"k{i}"))["id"] for i in range(5)]
    await api.client.post("/v1/tasks", headers=api.auth("rival"), json=task_body("theirs"))
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"limit": "2"} if cursor is None else {"limit": "2", "cursor": cursor}
        response = await api.client.get("/v1/tasks", headers=api.operator, params=params)
        assert response.status_code == 200
        page = response.json()
        assert set(page) == {"tasks", "next"}
        assert len(page["tasks"]) <= 2
        seen += [t["id"] for t in page["tasks"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == created[::-1]  # newest first, each once, none of the other tenant's
    assert pages == 3


async def test_list_filters_by_state(api: ApiHarness) -> None:
    planned = await api.create("a")
    queued = [(await api.queued(k))["id"] for k in ("b", "c")]
    response = await api.client.get("/v1/tasks?state=QUEUED", headers=api.operator)
    assert [t["id"] for t in response.json()["tasks"]] == queued[::-1]
    response = await api.client.get("/v1/tasks?state=PLANNED", headers=api.operator)
    assert [t["id"] for t in response.json()["tasks"]] == [planned["id"]]
    response = await api.client.get("/v1/tasks?state=SUCCEEDED", headers=api.operator)
    assert response.json() == {"tasks": [], "next": None}


# -- GET /v1/tasks/{id} ------------------------------------------------------------------------


async def test_get_shows_steps_attempts_fences_and_seq(api: ApiHarness) -> None:
    task = await api.queued("k", 2)
    [lease] = await api.claim()
    response = await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)
    assert response.status_code == 200
    view = response.json()
    for key in ("id", "tenant", "idempotency_key", "state", "plan_hash", "base_sha", "seq"):
        assert key in view
    assert view["state"] == "RUNNING"
    first = view["steps"][0]
    for key in ("id", "name", "kind", "state", "payload_hash", "effect_key", "attempts"):
        assert key in first
    assert first["id"] == lease["step_id"]
    # The token that claimed (issue 16, finding 4: attempts named only the runner's own id),
    # as the runner learns it (the pool has a second runner token, the harness's `intruder`).
    runner_token = {
        "id": (await api.client.get("/v1/runner", headers=api.runner)).json()["token_id"]
    }
    assert first["attempts"] == [
        {
            "attempt": 1,
            "fence": lease["fence"],
            "runner_id": "r1",
            "token_id": runner_token["id"],
            "state": "leased",
            "reason": None,
            "granted_at": "1970-01-12T13:46:40.000Z",  # the FakeClock's start, ISO 8601
            "ended_at": None,
            "usage": None,  # no result or release has counted any tokens yet
        }
    ]
    assert view["steps"][1]["attempts"] == []
    assert view["seq"] > task["seq"]


# -- POST /v1/tasks/{id}/approve ---------------------------------------------------------------


async def test_approve_binds_the_plan_and_queues(api: ApiHarness) -> None:
    task = await api.create("k")
    response = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"]},
    )
    assert response.status_code == 200
    assert response.json()["state"] == "QUEUED"
    events = (await api.client.get(f"/v1/tasks/{task['id']}/events", headers=api.operator)).json()
    assert [e["state"] for e in events["events"] if e["kind"] == "state"][-2:] == [
        "APPROVED",
        "QUEUED",
    ]


async def test_approve_with_another_plan_hash_is_a_plan_mismatch(api: ApiHarness) -> None:
    task = await api.create("k")
    before = ledger_snapshot(api.path)
    response = await api.client.post(
        f"/v1/tasks/{task['id']}/approve", headers=api.operator, json={"plan_hash": "0" * 64}
    )
    assert_error(response, 409, "plan_mismatch")
    assert ledger_snapshot(api.path) == before


async def test_approving_again_on_another_base_is_stale_and_changes_nothing(
    api: ApiHarness, tmp_path: Path
) -> None:
    origin = make_remote(tmp_path)
    await add_app(api, origin)
    task = await api.queued("k", repository="app", base_sha=origin.base)
    before = ledger_snapshot(api.path)
    response = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"], "base_sha": "b" * 40},
    )
    body = assert_error(response, 409, "stale_base")
    assert origin.base in body["detail"]
    assert ledger_snapshot(api.path) == before
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "QUEUED"
    assert view["base_sha"] == origin.base


# -- POST /v1/tasks/{id}/cancel ----------------------------------------------------------------


async def test_cancel_then_cancel_again_is_terminal(api: ApiHarness) -> None:
    task = await api.queued("k")
    response = await api.client.post(
        f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={"reason": "changed my mind"}
    )
    assert response.status_code == 200
    assert response.json()["state"] == "CANCELLED"
    assert response.json()["reason"] == "changed my mind"
    again = await api.client.post(
        f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={"reason": "twice"}
    )
    assert_error(again, 409, "terminal")
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "CANCELLED"
    assert view["reason"] == "changed my mind"


# -- GET /v1/tasks/{id}/events -----------------------------------------------------------------


async def test_events_after_a_sequence_number(api: ApiHarness) -> None:
    task = await api.queued("k")
    url = f"/v1/tasks/{task['id']}/events"
    every = (await api.client.get(url, headers=api.operator)).json()["events"]
    assert [e["state"] for e in every] == ["PLANNED", "APPROVED", "QUEUED"]
    for event in every:
        assert {"seq", "task_id", "kind", "state", "data"} <= set(event)
        assert event["task_id"] == task["id"]
    seqs = [e["seq"] for e in every]
    assert seqs == sorted(set(seqs))
    later = (await api.client.get(url, headers=api.operator, params={"after": seqs[0]})).json()
    assert [e["seq"] for e in later["events"]] == seqs[1:]
    none = await api.client.get(url, headers=api.operator, params={"after": seqs[-1]})
    assert none.json() == {"events": []}
    for wait in ("0", "0.05", ".05", "1."):  # the decimal forms a person or a script writes
        polled = await api.client.get(url, headers=api.operator, params={"after": 0, "wait": wait})
        assert polled.status_code == 200, (wait, polled.text)


async def test_events_long_poll_returns_when_an_event_is_appended(api: ApiHarness) -> None:
    task = await api.create("k")
    url = f"/v1/tasks/{task['id']}/events"
    answers: list[Any] = []

    async def wait_for_events() -> None:
        params = {"after": task["seq"], "wait": "20"}
        answers.append(await api.client.get(url, headers=api.operator, params=params))

    with anyio.fail_after(5):  # far below the 20 s the poll would wait for nothing
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_events)
            await anyio.sleep(0.2)  # proving an absence: the poll is still waiting
            assert answers == []
            approved = await api.client.post(
                f"/v1/tasks/{task['id']}/approve",
                headers=api.operator,
                json={"plan_hash": task["plan_hash"]},
            )
            assert approved.status_code == 200
    [response] = answers
    assert response.status_code == 200
    events = response.json()["events"]
    assert events, "the long-poll returned without the appended event"
    assert events[0]["seq"] > task["seq"]
    assert events[0]["state"] == "APPROVED"


# -- GET /v1/tasks/{id}/review -----------------------------------------------------------------

EXPECTATIONS = {
    "owner",
    "repository",
    "base_commit",
    "requirement_revision",
    "allowed_paths",
    "expected_checks",
    "verify_pool",
}
OBSERVATIONS = {
    "repository_head",
    "candidate_sha",
    "start_time",
    "stop_time",
    "observed_checks",
    "checks",
    "observed_terminal_state",
    "reviewer_decision",
    "cleanup_proof",
    "effects",
    "unresolved_questions",
}


async def test_review_marks_every_field_expectation_or_observation(
    api: ApiHarness, tmp_path: Path
) -> None:
    origin = make_remote(tmp_path)
    await add_app(api, origin)
    task = await api.queued(
        "k",
        repository="app",
        base_sha=origin.base,
        owner="ana",
        requirement_revision="req-7",
        allowed_paths=["src/"],
        checks={"tests": "python -m pytest -q"},
    )
    [lease] = await api.claim()
    fields = await work(api, origin, lease)
    result = await api.report(lease, **fields)
    assert result.json() == {"outcome": "applied"}
    response = await api.client.get(f"/v1/tasks/{task['id']}/review", headers=api.operator)
    assert response.status_code == 200
    review = response.json()
    fields_shown = {k: v for k, v in review.items() if k not in {"task_id", "verdict"}}
    assert set(fields_shown) == EXPECTATIONS | OBSERVATIONS
    for name, field in fields_shown.items():
        assert set(field) == {"value", "kind"}, name
        expected = "expectation" if name in EXPECTATIONS else "observation"
        assert field["kind"] == expected, name
    assert review["owner"]["value"] == "ana"
    assert review["allowed_paths"]["value"] == ["src/"]
    assert review["base_commit"]["value"] == origin.base
    assert review["expected_checks"]["value"] == ["tests"]
    assert review["candidate_sha"]["value"] == fields["candidate_sha"]
    log = fields["checks"]["tests"]["log"]
    assert review["observed_checks"]["value"] == {"tests": {"log": log, "exit_code": 0}}
    assert review["repository_head"]["value"] == origin.base
    assert review["observed_terminal_state"]["value"] == "SUCCEEDED"
    assert review["cleanup_proof"]["value"]["live_leases"] == 0
    assert review["stop_time"]["value"] is not None
    assert review["verdict"] == {"acceptable": True, "reasons": []}


async def test_review_of_an_unfinished_task_is_not_acceptable(api: ApiHarness) -> None:
    task = await api.create("k")
    review = (await api.client.get(f"/v1/tasks/{task['id']}/review", headers=api.operator)).json()
    assert review["observed_terminal_state"] == {"value": None, "kind": "observation"}
    assert review["verdict"]["acceptable"] is False


# -- PUT /v1/repositories/{name}/head ----------------------------------------------------------


async def test_repository_head_moving_off_the_base_fails_the_task(
    api: ApiHarness, tmp_path: Path
) -> None:
    """The forge's webhook says the head moved: the approved task fails `stale_base` at once,
    and the runner still holding its step can no longer commit it."""
    origin = make_remote(tmp_path)
    await add_app(api, origin)
    task = await api.queued("k", repository="app", base_sha=origin.base)
    [lease] = await api.claim()
    response = await api.client.put(
        "/v1/repositories/app/head", headers=api.operator, json={"sha": "f" * 40}
    )
    assert response.status_code == 200
    assert response.json() == {"repository": "app", "head_sha": "f" * 40}
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "FAILED"
    assert view["reason"].startswith("stale_base: ")
    assert_error(await api.report(lease, **await work(api, origin, lease)), 409, "terminal")
    review = (await api.client.get(f"/v1/tasks/{task['id']}/review", headers=api.operator)).json()
    assert review["repository_head"] == {"value": "f" * 40, "kind": "observation"}


async def test_repository_heads_are_per_tenant(api: ApiHarness, tmp_path: Path) -> None:
    origin = make_remote(tmp_path)
    await add_app(api, origin)
    await add_app(api, origin, tenant="rival")
    task = await api.queued("k", repository="app", base_sha=origin.base, allowed_paths=["src/"])
    [lease] = await api.claim()
    moved = await api.client.put(
        "/v1/repositories/app/head", headers=api.auth("rival"), json={"sha": "f" * 40}
    )
    assert moved.status_code == 200
    result = await api.report(lease, **await work(api, origin, lease))
    assert result.json() == {"outcome": "applied"}
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "SUCCEEDED"


# -- POST /v1/leases/claim ---------------------------------------------------------------------


async def test_claim_grants_a_lease_with_every_promised_field(api: ApiHarness) -> None:
    task = await api.queued("k")
    response = await api.client.post(
        "/v1/leases/claim", headers=api.runner, json={"runner_id": "r1", "capacity": 4}
    )
    assert response.status_code == 200
    [lease] = response.json()["leases"]
    for key in (
        "step_id",
        "task_id",
        "attempt",
        "fence",
        "payload",
        "payload_hash",
        "ttl_s",
        "renew_every_s",
        "outputs",
    ):
        assert key in lease
    assert lease["task_id"] == task["id"]
    assert lease["attempt"] == 1
    assert lease["payload"] == chat_payload("apply patch 0")
    assert lease["ttl_s"] == 30.0
    assert 0 < lease["renew_every_s"] < lease["ttl_s"]
    assert lease["outputs"] == []


async def test_claim_with_nothing_queued_answers_204(api: ApiHarness) -> None:
    await api.create("k")  # planned, not approved: nothing to lease
    response = await api.client.post(
        "/v1/leases/claim", headers=api.runner, json={"runner_id": "r1", "capacity": 1, "wait_s": 0}
    )
    assert response.status_code == 204
    assert response.content == b""


async def test_claim_long_poll_returns_when_work_is_queued(api: ApiHarness) -> None:
    task = await api.create("k")
    answers: list[Any] = []

    async def claim() -> None:
        body = {"runner_id": "r1", "capacity": 1, "wait_s": 20}
        answers.append(await api.client.post("/v1/leases/claim", headers=api.runner, json=body))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await anyio.sleep(0.2)  # proving an absence: the claim is still waiting
            assert answers == []
            await api.client.post(
                f"/v1/tasks/{task['id']}/approve",
                headers=api.operator,
                json={"plan_hash": task["plan_hash"]},
            )
    [response] = answers
    assert response.status_code == 200
    assert response.json()["leases"][0]["task_id"] == task["id"]


async def test_a_runner_claims_only_from_its_own_pool(api: ApiHarness) -> None:
    await api.queued("k")
    response = await api.client.post(
        "/v1/leases/claim", headers=api.auth("stranger"), json={"runner_id": "r9", "capacity": 1}
    )
    assert response.status_code == 204
    assert len(await api.claim()) == 1


# -- POST /v1/leases/{step_id}/renew -----------------------------------------------------------


async def test_renew_answers_ttl_and_refuses_a_fence_the_step_never_had(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    url = f"/v1/leases/{lease['step_id']}/renew"
    response = await api.client.post(url, headers=api.runner, json={"fence": lease["fence"]})
    assert response.status_code == 200
    assert response.json() == {
        "ttl_s": 30.0,
        "renew_every_s": lease["renew_every_s"],
        "cancelled": False,
        "budget_exhausted": False,
    }
    # A fence never granted to the step is no lease: `not_found`, as an unknown step, and not
    # recorded (it was a recorded `stale_fence` before leases belonged to their token).
    guessed = await api.client.post(url, headers=api.runner, json={"fence": lease["fence"] + 1})
    assert_error(guessed, 404, "not_found")
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "RUNNING"  # a refused call, never a new state
    assert view["rejections"] == []


async def test_renew_tells_a_running_step_its_task_was_cancelled(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    await api.client.post(f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={})
    response = await api.client.post(
        f"/v1/leases/{lease['step_id']}/renew", headers=api.runner, json={"fence": lease["fence"]}
    )
    assert response.status_code == 200
    assert response.json()["cancelled"] is True


async def test_renew_after_the_lease_expired_is_stale(api: ApiHarness) -> None:
    await api.queued("k")
    [lease] = await api.claim()
    api.clock.advance(31)
    ledger = api.app.state.ledger
    assert await ledger.expire() == 1
    response = await api.client.post(
        f"/v1/leases/{lease['step_id']}/renew", headers=api.runner, json={"fence": lease["fence"]}
    )
    assert_error(response, 409, "stale_fence")
    [again] = await api.claim()
    assert again["step_id"] == lease["step_id"]
    assert again["attempt"] == 2
    assert again["fence"] > lease["fence"]


# -- POST /v1/leases/{step_id}/release ---------------------------------------------------------


def release_body(lease: dict[str, Any], reason: str, retryable: bool = True) -> dict[str, Any]:
    return {"fence": lease["fence"], "reason": reason, "retryable": retryable, "detail": "why"}


@pytest.mark.parametrize("reason", ["shutdown", "operator", "preempted", "transient", "invalid"])
async def test_release_requeues_the_step_with_the_same_id(api: ApiHarness, reason: str) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    url = f"/v1/leases/{lease['step_id']}/release"
    response = await api.client.post(url, headers=api.runner, json=release_body(lease, reason))
    assert response.status_code == 200
    assert response.json() == {"released": True}
    [again] = await api.claim()
    assert (again["step_id"], again["attempt"]) == (lease["step_id"], 2)
    assert again["fence"] > lease["fence"]
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    first = view["steps"][0]["attempts"][0]
    assert first["state"] == "released"
    assert first["reason"].startswith(reason)
    stale = await api.client.post(url, headers=api.runner, json=release_body(lease, reason))
    assert_error(stale, 409, "stale_fence")


async def test_release_not_retryable_fails_the_task(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    response = await api.client.post(
        f"/v1/leases/{lease['step_id']}/release",
        headers=api.runner,
        json=release_body(lease, "invalid", retryable=False),
    )
    assert response.status_code == 200
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "FAILED"
    assert "invalid" in view["reason"]
    assert await api.claim() == []


@pytest.mark.parametrize(
    ("reason", "counted"),
    [
        ("operator", False),
        ("shutdown", False),
        ("preempted", False),
        ("transient", True),
        ("invalid", True),
    ],
)
async def test_only_step_side_releases_count_toward_max_attempts(
    api: ApiHarness, reason: str, counted: bool
) -> None:
    task = await api.queued("k")
    for _ in range(5):  # max_attempts is 5
        [lease] = await api.claim()
        await api.client.post(
            f"/v1/leases/{lease['step_id']}/release",
            headers=api.runner,
            json=release_body(lease, reason),
        )
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == ("FAILED" if counted else "RUNNING")
    metrics = (await api.client.get("/metrics", headers=api.auth("metrics"))).text
    assert metric(metrics, "tether_leases_released_total ") == 5
    assert metric(metrics, "tether_leases_preempted_total ") == (5 if reason == "preempted" else 0)


# -- POST /v1/steps/{step_id}/result -----------------------------------------------------------


async def test_result_applied_then_replayed(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    first = await api.report(lease, output={"patch": "diff"})
    assert first.status_code == 200
    assert first.json() == {"outcome": "applied"}
    again = await api.report(lease, output={"patch": "diff"})
    assert again.status_code == 200
    assert again.json() == {"outcome": "replayed"}
    assert count(api.path, "effects") == 1
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "SUCCEEDED"
    assert view["steps"][0]["output"] == {"patch": "diff"}
    assert view["steps"][0]["effect_key"]


async def test_result_under_a_stale_fence_is_refused(api: ApiHarness) -> None:
    await api.queued("k")
    [lease] = await api.claim()
    api.clock.advance(10.5)  # never acknowledged: the lease lapsed with its acceptance window
    response = await api.report(lease)
    assert_error(response, 409, "stale_fence")
    assert count(api.path, "effects") == 0
    assert count(api.path, "rejections", "code = 'stale_fence'") == 1


async def test_result_with_a_drifted_payload_is_refused(api: ApiHarness) -> None:
    await api.queued("k")
    [lease] = await api.claim()
    response = await api.report({**lease, "payload_hash": "0" * 64})
    assert_error(response, 409, "payload_drift")
    assert count(api.path, "effects") == 0
    assert count(api.path, "rejections", "code = 'payload_drift'") == 1


async def test_result_for_a_cancelled_task_is_terminal(api: ApiHarness) -> None:
    task = await api.queued("k")
    [lease] = await api.claim()
    await api.client.post(f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={})
    response = await api.report(lease)
    assert_error(response, 409, "terminal")
    assert count(api.path, "effects") == 0
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["state"] == "CANCELLED"


# -- health, readiness, metrics ----------------------------------------------------------------


async def test_healthz_and_readyz(api: ApiHarness) -> None:
    health = await api.client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = await api.client.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


async def test_readyz_answers_503_when_the_ledger_cannot_be_read(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> dict[str, int]:
        raise RuntimeError("the ledger is not open")

    monkeypatch.setattr(api.app.state.ledger, "queue_depth", broken)
    assert_error(await api.client.get("/readyz"), 503, "unavailable")


async def test_metrics_need_a_metrics_token(api: ApiHarness) -> None:
    """Tenant names and their spend are not public (issue 23, finding 5): no token is 401, an
    operator's or a runner's 403, the scraper's `metrics` token 200 with the tenants listed."""
    await api.queued("a")
    assert_error(await api.client.get("/metrics"), 401, "unauthorized")
    for other in ("operator", "runner"):
        assert_error(await api.client.get("/metrics", headers=api.auth(other)), 403, "forbidden")
    scraped = await api.client.get("/metrics", headers=api.auth("metrics"))
    assert scraped.status_code == 200, scraped.text
    assert 'tether_budget_tokens{kind="spent",tenant="acme"}' in scraped.text
    # The metrics token reads nothing else.
    assert_error(await api.client.get("/v1/tasks", headers=api.auth("metrics")), 403, "forbidden")
    claim = {"runner_id": "r1", "capacity": 1}
    refused = await api.client.post("/v1/leases/claim", headers=api.auth("metrics"), json=claim)
    assert_error(refused, 403, "forbidden")


def metric(text: str, line_start: str) -> float:
    [value] = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_start)]
    return float(value)


async def test_metrics_count_what_happened(api: ApiHarness) -> None:
    await api.queued("a")
    await api.queued("b")
    first, second = await api.claim(capacity=2)
    await api.client.post(
        f"/v1/leases/{first['step_id']}/renew", headers=api.runner, json={"fence": first["fence"]}
    )
    await api.report(first)
    await api.report(first)
    api.clock.advance(10.5)  # `second` was never acknowledged: its lease lapsed
    await api.report(second)
    response = await api.client.get("/metrics", headers=api.auth("metrics"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "# TYPE tether_leases_granted_total counter" in text
    assert metric(text, "tether_leases_granted_total ") == 2
    assert metric(text, "tether_leases_renewed_total ") == 1
    assert metric(text, 'tether_commits_total{outcome="applied"}') == 1
    assert metric(text, 'tether_commits_total{outcome="replayed"}') == 1
    assert metric(text, 'tether_rejections_total{code="stale_fence"}') == 1
    assert metric(text, 'tether_steps{state="committed"}') == 1
    assert metric(text, 'tether_steps{state="leased"}') == 1
    assert metric(text, "tether_leases_expired_total ") == 0
    assert "# TYPE tether_rejections_total counter" in text
    assert "_created" not in text  # counts only: no creation-time series beside them


async def test_each_app_counts_its_own_metrics(api: ApiHarness, tmp_path: Path) -> None:
    """A registry per app: two apps in one process neither clash nor share counts."""
    await api.queued("a")
    await api.claim()
    async with open_api(tmp_path / "other.db", FakeClock(), synchronous="OFF") as other:
        other_text = (await other.client.get("/metrics", headers=other.auth("metrics"))).text
    assert metric(other_text, "tether_leases_granted_total ") == 0
    assert (
        metric(
            (await api.client.get("/metrics", headers=api.auth("metrics"))).text,
            "tether_leases_granted_total ",
        )
        == 1
    )


# -- shutdown drains long-polls ----------------------------------------------------------------


async def test_drain_ends_long_polls_with_their_empty_answers(api: ApiHarness) -> None:
    task = await api.create("k")
    answers: dict[str, Any] = {}

    async def claim() -> None:
        body = {"runner_id": "r1", "capacity": 1, "wait_s": 25}
        answers["claim"] = await api.client.post("/v1/leases/claim", headers=api.runner, json=body)

    async def events() -> None:
        url = f"/v1/tasks/{task['id']}/events"
        params = {"after": task["seq"], "wait": "25"}
        answers["events"] = await api.client.get(url, headers=api.operator, params=params)

    with anyio.fail_after(5):  # far below the 25 s the polls would wait
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            tg.start_soon(events)
            await anyio.sleep(0.2)  # proving an absence: both polls are waiting
            assert answers == {}
            drain(api.app)
    assert answers["claim"].status_code == 204
    assert answers["events"].json() == {"events": []}

    # Draining: work queued now is not leased, and unknown ids are still unknown.
    await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"]},
    )
    assert await api.claim() == []
    assert count(api.path, "attempts") == 0
    unknown = await api.client.get("/v1/tasks/nope/events?wait=25", headers=api.operator)
    assert_error(unknown, 404, "not_found")
