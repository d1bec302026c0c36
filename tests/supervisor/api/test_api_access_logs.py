"""Refused requests are logged at warning, with the token's id when it is known and never its
secret (issue 16, finding 1: a 401 or 403 left no line in the supervisor's log); and the
token behind a claim is written on its attempt and named by the grant's line."""

from __future__ import annotations

import json
from typing import Any

from structlog.testing import capture_logs

from tests.conftest import ApiHarness, raw_db, task_body


def token_id_of(api: ApiHarness, scope: str, role: str) -> str:
    db = raw_db(api.path)
    try:
        row = db.execute(
            "SELECT id FROM tokens WHERE scope = ? AND role = ?", (scope, role)
        ).fetchone()
    finally:
        db.close()
    return str(row["id"])


def refusals(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == "access refused"]


async def test_a_missing_or_unknown_token_is_logged_at_warning_without_the_secret(
    api: ApiHarness,
) -> None:
    with capture_logs() as logs:
        missing = await api.client.get("/v1/tasks")
        unknown = await api.client.get(
            "/v1/tasks", headers={"Authorization": "Bearer tether_made-up-secret"}
        )
    assert (missing.status_code, unknown.status_code) == (401, 401)
    first, second = refusals(logs)
    for line in (first, second):
        assert line["log_level"] == "warning"
        assert line["code"] == "unauthorized"
        assert (line["method"], line["path"]) == ("GET", "/v1/tasks")
        assert "token_id" not in line  # no token is known for either
    assert "made-up-secret" not in json.dumps(logs)


async def test_a_token_of_the_wrong_role_is_logged_with_its_id(api: ApiHarness) -> None:
    with capture_logs() as logs:
        response = await api.client.get("/v1/tasks", headers=api.runner)
    assert response.status_code == 403
    [line] = refusals(logs)
    assert line["log_level"] == "warning"
    assert line["code"] == "forbidden"
    assert line["token_id"] == token_id_of(api, "default", "runner")
    assert (line["role"], line["scope"]) == ("runner", "default")
    assert api.secrets["runner"] not in json.dumps(logs)


async def test_a_pool_the_tenant_may_not_use_is_logged_with_the_token_id(
    api: ApiHarness,
) -> None:
    with capture_logs() as logs:
        response = await api.client.post(
            "/v1/tasks", headers=api.operator, json=task_body("k", pool="rival")
        )
    assert response.status_code == 403
    [line] = refusals(logs)
    assert (line["code"], line["tenant"], line["pool"]) == ("forbidden", "acme", "rival")
    assert line["token_id"] == token_id_of(api, "acme", "operator")


async def test_a_claim_over_http_records_and_logs_the_claiming_token(api: ApiHarness) -> None:
    task = await api.queued("k")
    with capture_logs() as logs:
        [lease] = await api.claim(runner_id="box-17")
    runner_token = token_id_of(api, "default", "runner")
    [granted] = [line for line in logs if line["event"] == "step granted"]
    assert (granted["task_id"], granted["fence"]) == (task["id"], lease["fence"])
    assert (granted["runner_id"], granted["token_id"]) == ("box-17", runner_token)
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert [a["token_id"] for a in view["steps"][0]["attempts"]] == [runner_token]
