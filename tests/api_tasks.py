"""Tasks submitted and approved through the operator API, for tests that need one to run."""

from __future__ import annotations

from typing import Any

from tests.conftest import ApiHarness


async def submitted(api: ApiHarness, body: dict[str, Any]) -> dict[str, Any]:
    """Create the task `body` describes and approve its plan as the operator; the task's view
    after the approval."""
    created = await api.client.post("/v1/tasks", headers=api.operator, json=body)
    assert created.status_code == 201, created.text
    task = created.json()
    approved = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"]},
    )
    assert approved.status_code == 200, approved.text
    view: dict[str, Any] = approved.json()
    return view
