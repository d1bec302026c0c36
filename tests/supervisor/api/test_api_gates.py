"""The operator's routes for effects (docs/design.md, Effects): a gate opened for exactly one
digest, an uncertain effect resolved by an operator's word, and credentials a plan names
checked against the credentials folder at create. Deliveries are driven through the ledger's
port, as the dispatcher drives them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.api_tasks import submitted
from tests.conftest import ApiHarness, FakeClock, assert_error, ledger_snapshot, open_api
from tether.supervisor import service
from tether.supervisor.ledger.outbox import Unanswered


class IdleDispatcher:
    """Stands in for the supervisor's dispatcher: these tests deliver through the ledger's
    port by hand, and nothing may reach the network."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def run(self) -> None:
        await anyio.sleep_forever()


@pytest.fixture
async def api(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ApiHarness]:
    monkeypatch.setattr(service, "Dispatcher", IdleDispatcher)
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as harness:
        yield harness


HOOK = "https://deploy.example/hook"


def effect_task(key: str = "k1", **http: Any) -> dict[str, Any]:
    payload = {"url": HOOK, "keyed": False, "body": {"amount": "$82,000"}, **http}
    return {
        "idempotency_key": key,
        "plan": {"steps": [{"name": "deploy", "kind": "http", "payload": payload}]},
    }


def gate(task_id: str) -> str:
    return f"/v1/tasks/{task_id}/steps/deploy/gate"


def happened(task_id: str) -> str:
    return f"/v1/tasks/{task_id}/steps/deploy/happened"


async def send_unanswered(api: ApiHarness) -> None:
    """A dispatcher takes the open effect, begins its one send, and hears nothing back."""
    ledger = api.app.state.ledger
    [out] = await ledger.take_effects("d1", 8)
    attempt = await ledger.begin_attempt(out.effect_id, "d1", out.digest)
    await ledger.record_attempt(out.effect_id, attempt, "d1", Unanswered(detail="", sent=True))


async def test_approval_does_not_open_a_gate_and_the_task_shows_what_it_waits_for(
    api: ApiHarness,
) -> None:
    task = await submitted(api, effect_task())
    [step] = task["steps"]
    assert step["state"] == "due"
    assert step["effect"]["state"] == "gated"
    assert step["effect"]["request"]["body"] == {"amount": "$82,000"}
    assert task["waiting_for"]["reason"] == "gate"
    assert task["waiting_for"]["digest"] == step["effect"]["digest"]
    listed = (await api.client.get("/v1/tasks", headers=api.operator)).json()
    assert listed["tasks"][0]["waiting_for"]["reason"] == "gate"


async def test_a_gate_opens_for_the_shown_digest_only_and_once(api: ApiHarness) -> None:
    task = await submitted(api, effect_task())
    digest = task["steps"][0]["effect"]["digest"]
    before = ledger_snapshot(api.path)
    wrong = await api.client.post(gate(task["id"]), headers=api.operator, json={"digest": "a" * 64})
    assert_error(wrong, 409, "gate_mismatch")
    after_refusal = ledger_snapshot(api.path)
    assert {k: v for k, v in after_refusal.items() if k != "rejections"} == {
        k: v for k, v in before.items() if k != "rejections"
    }
    opened = await api.client.post(gate(task["id"]), headers=api.operator, json={"digest": digest})
    assert opened.status_code == 200, opened.text
    effect = opened.json()["steps"][0]["effect"]
    assert effect["state"] == "open"
    assert effect["gate"]["digest"] == digest
    assert effect["gate"]["opened_by"]
    again = await api.client.post(gate(task["id"]), headers=api.operator, json={"digest": digest})
    assert_error(again, 409, "invalid_transition")


async def test_an_uncertain_effect_is_resolved_only_by_an_operator(api: ApiHarness) -> None:
    task = await submitted(api, effect_task())
    digest = task["steps"][0]["effect"]["digest"]
    early = await api.client.post(
        happened(task["id"]), headers=api.operator, json={"happened": True}
    )
    assert_error(early, 409, "invalid_transition")
    await api.client.post(gate(task["id"]), headers=api.operator, json={"digest": digest})
    await send_unanswered(api)
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["waiting_for"]["reason"] == "uncertain"
    no = await api.client.post(happened(task["id"]), headers=api.operator, json={"happened": False})
    assert no.status_code == 200, no.text
    assert no.json()["steps"][0]["effect"]["state"] == "gated"
    await api.client.post(gate(task["id"]), headers=api.operator, json={"digest": digest})
    await send_unanswered(api)
    second_no = await api.client.post(
        happened(task["id"]), headers=api.operator, json={"happened": False}
    )
    assert_error(second_no, 409, "invalid_transition")
    yes = await api.client.post(happened(task["id"]), headers=api.operator, json={"happened": True})
    assert yes.status_code == 200, yes.text
    done = yes.json()
    assert done["state"] == "SUCCEEDED"
    assert done["steps"][0]["effect"]["resolved"]["happened"] is True
    review = (await api.client.get(f"/v1/tasks/{task['id']}/review", headers=api.operator)).json()
    [marked] = review["effects"]["value"]
    assert marked["keyed"] is False
    assert marked["resolved"]["by"] == done["steps"][0]["effect"]["resolved"]["by"]
    assert len(marked["deliveries"]) == 2


async def test_the_gate_routes_are_the_tenant_s_and_an_operator_s(api: ApiHarness) -> None:
    task = await submitted(api, effect_task())
    digest = task["steps"][0]["effect"]["digest"]
    for path, body in (
        (gate(task["id"]), {"digest": digest}),
        (happened(task["id"]), {"happened": True}),
    ):
        assert_error(await api.client.post(path, json=body), 401, "unauthorized")
        assert_error(await api.client.post(path, headers=api.runner, json=body), 403, "forbidden")
        rival = await api.client.post(path, headers=api.auth("rival"), json=body)
        assert_error(rival, 404, "not_found")
    unknown = f"/v1/tasks/{task['id']}/steps/nosuch/gate"
    assert_error(
        await api.client.post(unknown, headers=api.operator, json={"digest": digest}),
        404,
        "not_found",
    )


async def test_a_credential_the_folder_does_not_hold_refuses_the_plan(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "Dispatcher", IdleDispatcher)
    folder = tmp_path / "credentials"
    folder.mkdir()
    (folder / "deploy-token").write_text("s3cret\n")
    headers = {"Authorization": "Bearer {{ credential.deploy-token }}"}
    async with open_api(tmp_path / "api.db", clock, credentials_dir=folder) as api:
        missing = effect_task("k1", headers={"Authorization": "Bearer {{ credential.other }}"})
        response = await api.client.post("/v1/tasks", headers=api.operator, json=missing)
        body = assert_error(response, 422, "invalid_field")
        assert "'other'" in body["detail"]
        task = await submitted(api, effect_task("k2", headers=headers))
        shown = task["steps"][0]["effect"]["request"]["headers"]
        assert shown == {"Authorization": "Bearer {{ credential.deploy-token }}"}
        assert "s3cret" not in str(task)
