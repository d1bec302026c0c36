"""Recording the reviewer's decision (docs/design.md, Review record): once per ended task, and
acceptance only of
what the ledger's own verdict can vouch for."""

from __future__ import annotations

from typing import Any

from tests.conftest import ApiHarness, assert_error, count, ledger_snapshot


async def finished(api: ApiHarness, key: str) -> dict[str, Any]:
    task = await api.queued(key)
    [lease] = await api.claim()
    assert (await api.report(lease)).status_code == 200
    return task


async def decide(api: ApiHarness, task_id: str, decision: Any, note: str = "") -> Any:
    return await api.client.post(
        f"/v1/tasks/{task_id}/review",
        headers=api.operator,
        json={"decision": decision, "note": note},
    )


async def test_an_accepted_success_is_recorded_once(api: ApiHarness) -> None:
    task = await finished(api, "ok")
    answer = await decide(api, task["id"], "accept", "looks right")
    assert answer.status_code == 200
    field = answer.json()["reviewer_decision"]
    assert field["kind"] == "observation"
    assert (field["value"]["decision"], field["value"]["note"]) == ("accept", "looks right")
    assert (await decide(api, task["id"], "accept")).status_code == 200  # a retry is done
    before = ledger_snapshot(api.path)
    assert_error(await decide(api, task["id"], "reject"), 409, "invalid_transition")
    assert ledger_snapshot(api.path)["tasks"] == before["tasks"]
    assert count(api.path, "events", "kind = 'reviewed'") == 1


async def test_a_task_is_reviewed_only_once_it_has_ended(api: ApiHarness) -> None:
    task = await api.queued("running")
    before = ledger_snapshot(api.path)
    assert_error(await decide(api, task["id"], "reject"), 422, "invalid_field")
    assert ledger_snapshot(api.path) == before


async def test_an_unacceptable_result_cannot_be_accepted_but_can_be_rejected(
    api: ApiHarness,
) -> None:
    task = await api.queued("to-cancel")
    cancelled = await api.client.post(
        f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={"reason": "stop"}
    )
    assert cancelled.status_code == 200
    body = assert_error(await decide(api, task["id"], "accept"), 422, "invalid_field")
    assert "CANCELLED" in body["detail"]
    answer = await decide(api, task["id"], "reject", "cancelled before it ran")
    assert answer.json()["reviewer_decision"]["value"]["decision"] == "reject"


async def test_bad_decisions_and_other_tenants_change_nothing(api: ApiHarness) -> None:
    task = await finished(api, "guarded")
    before = ledger_snapshot(api.path)
    assert_error(await decide(api, task["id"], "maybe"), 422, "invalid_field")
    assert_error(await decide(api, task["id"], 1), 422, "invalid_field")
    rival = await api.client.post(
        f"/v1/tasks/{task['id']}/review", headers=api.auth("rival"), json={"decision": "accept"}
    )
    assert_error(rival, 404, "not_found")
    assert ledger_snapshot(api.path) == before
