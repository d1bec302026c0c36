"""A NUL character in a string the ledger keeps as it is (an id, a name, a key, a reason, a
detail) is refused at the wire, the same 422 `invalid_field` naming the field on SQLite and on
PostgreSQL (whose text cannot hold NUL), and changes nothing. NUL inside a JSON value the ledger
stores as JSON text (a model's output, a payload) is escaped there and accepted on both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ApiHarness, FakeClock, assert_error, chat_payload, open_api, task_body
from tests.pgledger import rows
from tether.wire.codec import BadMessage, decode
from tether.wire.records import Cancel, Results

pytestmark = pytest.mark.backends

NUL = "\x00"


def refused(response: Any, field: str, what: str = "") -> None:
    """The response is the 422 that names `field` (`what` of it, say a key) and says why."""
    body = assert_error(response, 422, "invalid_field")
    assert body["detail"] == f"{field!r}{what}: must not contain NUL (\\u0000)", body


async def leased(api: ApiHarness) -> dict[str, Any]:
    await api.queued("k1")
    [lease] = await api.claim()
    return lease


def tables(db: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """What the tests' requests could write: tasks, steps, leases and their attempts."""
    return {
        "tasks": rows(db, "SELECT id, state, reason, idempotency_key FROM tasks ORDER BY id"),
        "steps": rows(db, "SELECT id, state FROM steps ORDER BY id"),
        "attempts": rows(db, "SELECT step_id, fence, state, reason FROM attempts ORDER BY 1, 2"),
    }


@pytest.fixture
async def api(ledger_db: Path | str, clock: FakeClock) -> Any:
    async with open_api(ledger_db, clock) as harness:  # type: ignore[arg-type]
        yield harness


async def test_an_idempotency_key_or_a_step_name_with_nul_creates_no_task(
    api: ApiHarness, ledger_db: Path | str
) -> None:
    create = await api.client.post(
        "/v1/tasks", headers=api.operator, json=task_body("k" + NUL + "1")
    )
    refused(create, "idempotency_key")
    plan = {"steps": [{"name": "s" + NUL, "kind": "chat", "payload": chat_payload("hi")}]}
    named = await api.client.post(
        "/v1/tasks", headers=api.operator, json={"idempotency_key": "k2", "plan": plan}
    )
    refused(named, "plan.steps[0].name")
    assert tables(ledger_db) == {"tasks": [], "steps": [], "attempts": []}


async def test_a_release_detail_or_a_claim_runner_with_nul_is_refused_and_the_lease_held(
    api: ApiHarness, ledger_db: Path | str
) -> None:
    lease = await leased(api)
    before = tables(ledger_db)
    release = await api.client.post(
        f"/v1/leases/{lease['step_id']}/release",
        headers=api.runner,
        json={
            "fence": lease["fence"],
            "reason": "transient",
            "retryable": True,
            "detail": "the tool said: " + NUL,
        },
    )
    refused(release, "detail")
    claim = await api.client.post(
        "/v1/leases/claim",
        headers=api.runner,
        json={"runner_id": "r" + NUL, "capacity": 1, "wait_s": 0},
    )
    refused(claim, "runner_id")
    assert tables(ledger_db) == before
    renew = await api.client.post(
        f"/v1/leases/{lease['step_id']}/renew", headers=api.runner, json={"fence": lease["fence"]}
    )
    assert renew.status_code == 200, renew.text


async def test_a_cancel_reason_with_nul_leaves_the_task_as_it_was(
    api: ApiHarness, ledger_db: Path | str
) -> None:
    task = await api.queued("k1")
    before = tables(ledger_db)
    cancel = await api.client.post(
        f"/v1/tasks/{task['id']}/cancel", headers=api.operator, json={"reason": "stop" + NUL}
    )
    refused(cancel, "reason")
    assert tables(ledger_db) == before


async def test_a_result_naming_an_artifact_with_nul_is_refused(
    api: ApiHarness, ledger_db: Path | str
) -> None:
    lease = await leased(api)
    before = tables(ledger_db)
    refused(await api.report(lease, artifacts={"log" + NUL: "0" * 64}), "artifacts", " (a key)")
    assert tables(ledger_db) == before


async def test_nul_inside_a_model_output_is_kept_on_both(api: ApiHarness) -> None:
    lease = await leased(api)
    output = {"text": "a model wrote " + NUL + " here", NUL: [NUL]}
    result = await api.report(lease, output=output)
    assert result.json() == {"outcome": "applied"}, result.text
    view = await api.client.get(f"/v1/tasks/{lease['task_id']}", headers=api.operator)
    assert view.json()["steps"][0]["output"] == output


def test_a_batch_item_is_named_and_an_escaped_backslash_is_no_nul() -> None:
    item = {"step_id": "s1", "fence": 1, "payload_hash": "h", "output": "x" + NUL}
    raw = json.dumps({"results": [item, dict(item, step_id="s" + NUL)]}).encode()
    with pytest.raises(BadMessage) as refusal:
        decode(raw, Results)
    assert refusal.value.detail == "'results[1].step_id': must not contain NUL (\\u0000)"
    assert decode(raw.replace(b'"s\\u0000"', b'"s2"'), Results).results[0].output == "x" + NUL
    text = decode(b'{"reason": "C:\\\\u0000"}', Cancel)  # a backslash, then the text u0000
    assert text.reason == "C:\\u0000"


@pytest.mark.parametrize(
    ("method", "url", "where"),
    [
        ("POST", "/v1/leases/a%00b/renew", "path"),
        ("GET", "/v1/tasks/a%00b", "path"),
        ("POST", "/v1/tasks/a%00b/cancel", "path"),
        ("GET", "/v1/tasks?state=a%00b", "query string"),
    ],
)
async def test_a_nul_in_the_path_or_query_is_the_same_422_on_both(
    api: ApiHarness, ledger_db: Path | str, method: str, url: str, where: str
) -> None:
    """Ids in the path reach the ledger as text as they are (supervisor/api/nul.py)."""
    lease = await leased(api)
    before = tables(ledger_db)
    body = {"fence": lease["fence"]} if "renew" in url else {"reason": "x"}
    headers = api.runner if "leases" in url else api.operator
    response = await api.client.request(
        method, url, headers=headers, json=body if method == "POST" else None
    )
    detail = assert_error(response, 422, "invalid_field")["detail"]
    assert detail == f"the request's {where} must not contain NUL (%00)"
    assert tables(ledger_db) == before
