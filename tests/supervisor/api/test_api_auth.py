"""Bearer tokens on the wire: missing, malformed, unknown, revoked (from another process, within
the token cache's second) and the wrong role. Each is refused and writes nothing."""

from __future__ import annotations

import sqlite3
from typing import Any

import anyio
import pytest

from tests.conftest import ApiHarness, assert_error, count, ledger_snapshot
from tether.supervisor import admin
from tether.supervisor.api import auth
from tether.supervisor.ledger.tokens import hash_secret

OPERATOR_ROUTES = [
    ("POST", "/v1/tasks"),
    ("GET", "/v1/tasks"),
    ("GET", "/v1/tasks/{task}"),
    ("POST", "/v1/tasks/{task}/approve"),
    ("POST", "/v1/tasks/{task}/cancel"),
    ("GET", "/v1/tasks/{task}/events"),
    ("GET", "/v1/tasks/{task}/review"),
    ("PUT", "/v1/repositories/repo/head"),
]
RUNNER_ROUTES = [
    ("POST", "/v1/leases/claim"),
    ("POST", "/v1/leases/{step}/renew"),
    ("POST", "/v1/leases/{step}/release"),
    ("POST", "/v1/steps/{step}/result"),
]


# Bodies that would succeed with the right token, so only the token can be the reason to refuse.
def good_body(method: str, path: str, task: dict[str, Any], lease: dict[str, Any]) -> Any:
    if method == "GET":
        return None
    return {
        "/v1/tasks": {
            "idempotency_key": "new",
            "plan": {
                "steps": [
                    {
                        "name": "s",
                        "kind": "chat",
                        "payload": {"messages": [{"role": "user", "content": "hi"}]},
                    }
                ]
            },
        },
        "/v1/tasks/{task}/approve": {"plan_hash": task["plan_hash"]},
        "/v1/tasks/{task}/cancel": {"reason": "no"},
        "/v1/repositories/repo/head": {"sha": "a" * 40},
        "/v1/leases/claim": {"runner_id": "r2", "capacity": 1, "wait_s": 0},
        "/v1/leases/{step}/renew": {"fence": lease["fence"]},
        "/v1/leases/{step}/release": {
            "fence": lease["fence"],
            "reason": "shutdown",
            "retryable": True,
        },
        "/v1/steps/{step}/result": {
            "fence": lease["fence"],
            "payload_hash": lease["payload_hash"],
            "output": "x",
        },
    }[path]


async def prepared(api: ApiHarness) -> tuple[dict[str, Any], dict[str, Any]]:
    """A running task with a live lease, and a second, planned task for approve."""
    running = await api.queued("running")
    [lease] = await api.claim()
    await api.queued("waiting")  # queued work, so a claim that got through would be visible
    return running, lease


async def call(
    api: ApiHarness,
    method: str,
    path: str,
    headers: dict[str, str],
    task: dict[str, Any],
    lease: dict[str, Any],
) -> Any:
    url = path.format(task=task["id"], step=lease["step_id"])
    body = good_body(method, path, task, lease)
    return await api.client.request(method, url, headers=headers, json=body)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token abc",
        "tether_abc",
        "Bearer tether_not-a-real-token",
        "Bearer  ",
    ],
    ids=[
        "missing",
        "empty",
        "bare_scheme",
        "scheme_and_space",
        "basic",
        "other_scheme",
        "no_scheme",
        "unknown_token",
        "only_spaces",
    ],
)
async def test_without_a_valid_token_every_route_is_401(
    api: ApiHarness, header: str | None
) -> None:
    task, lease = await prepared(api)
    headers = {} if header is None else {"Authorization": header}
    before = ledger_snapshot(api.path)
    for method, path in OPERATOR_ROUTES + RUNNER_ROUTES:
        response = await call(api, method, path, headers, task, lease)
        assert_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    assert ledger_snapshot(api.path) == before


async def test_a_runner_token_on_operator_routes_is_403(api: ApiHarness) -> None:
    task, lease = await prepared(api)
    before = ledger_snapshot(api.path)
    for method, path in OPERATOR_ROUTES:
        response = await call(api, method, path, api.runner, task, lease)
        body = assert_error(response, 403, "forbidden")
        assert body["detail"] == "this call needs an operator token"
    assert ledger_snapshot(api.path) == before


async def test_an_operator_token_on_runner_routes_is_403(api: ApiHarness) -> None:
    task, lease = await prepared(api)
    before = ledger_snapshot(api.path)
    for method, path in RUNNER_ROUTES:
        response = await call(api, method, path, api.operator, task, lease)
        body = assert_error(response, 403, "forbidden")
        assert body["detail"] == "this call needs a runner token"
    assert ledger_snapshot(api.path) == before


async def test_the_right_tokens_get_through(api: ApiHarness) -> None:
    """The refusals above are the token's doing: the same calls succeed with the right one."""
    task, lease = await prepared(api)
    statuses = []
    for method, path in RUNNER_ROUTES[:2] + OPERATOR_ROUTES:
        headers = api.runner if (method, path) in RUNNER_ROUTES else api.operator
        statuses.append((await call(api, method, path, headers, task, lease)).status_code)
    assert all(s in (200, 201) for s in statuses), statuses


class MonotonicClock:
    def __init__(self) -> None:
        self.now = 5_000.0

    def monotonic(self) -> float:
        return self.now


def revoke_from_another_process(path: Any, secret: str) -> None:
    """What `tether-supervisor token revoke` does: its own connection to the file."""
    db = sqlite3.connect(str(path))
    try:
        [token_id] = db.execute(
            "SELECT id FROM tokens WHERE secret_hash = ?", (hash_secret(secret),)
        ).fetchone()
    finally:
        db.close()
    admin.revoke_token(path, token_id)


@pytest.fixture
def monotonic(api: ApiHarness) -> MonotonicClock:
    """The token cache's clock, and only its: the event loop keeps the real one."""
    clock = MonotonicClock()
    api.app.state.tokens = auth.TokenCache(api.app.state.ledger, timer=clock.monotonic)
    return clock


async def test_a_revoked_operator_is_refused_once_the_cache_expires(
    api: ApiHarness, monotonic: MonotonicClock
) -> None:
    task = await api.create("k")
    assert (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).is_success
    revoke_from_another_process(api.path, api.secrets["operator"])
    monotonic.now += auth.CACHE_S + 0.01
    before = ledger_snapshot(api.path)
    response = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"]},
    )
    assert_error(response, 401, "unauthorized")
    assert_error(
        await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator), 401, "unauthorized"
    )
    assert ledger_snapshot(api.path) == before
    # Other tokens are untouched by one revocation.
    assert (await api.client.get("/v1/tasks", headers=api.auth("rival"))).status_code == 200


async def test_a_revoked_runner_can_neither_renew_nor_report(
    api: ApiHarness, monotonic: MonotonicClock
) -> None:
    await api.queued("k")
    [lease] = await api.claim()
    renew = f"/v1/leases/{lease['step_id']}/renew"
    assert (
        await api.client.post(renew, headers=api.runner, json={"fence": lease["fence"]})
    ).is_success
    revoke_from_another_process(api.path, api.secrets["runner"])
    monotonic.now += auth.CACHE_S + 0.01
    before = ledger_snapshot(api.path)
    refused = await api.client.post(renew, headers=api.runner, json={"fence": lease["fence"]})
    assert_error(refused, 401, "unauthorized")
    assert_error(await api.report(lease), 401, "unauthorized")
    assert ledger_snapshot(api.path) == before
    assert count(api.path, "effects") == 0


async def test_revocation_takes_effect_within_the_real_cache_lifetime(api: ApiHarness) -> None:
    """The same, on the real monotonic clock: one short wait past the cache, once per suite."""
    assert (await api.client.get("/v1/tasks", headers=api.operator)).status_code == 200
    revoke_from_another_process(api.path, api.secrets["operator"])
    await anyio.sleep(auth.CACHE_S + 0.05)
    assert_error(await api.client.get("/v1/tasks", headers=api.operator), 401, "unauthorized")


class _CountingLedger:
    """Just enough ledger for a `TokenCache`: every secret is unknown; lookups are counted."""

    def __init__(self) -> None:
        self.lookups = 0

    async def authenticate(self, secret: str) -> None:
        self.lookups += 1


async def test_the_cache_spares_the_ledger_until_its_lifetime_ends() -> None:
    ledger, clock = _CountingLedger(), MonotonicClock()
    cache = auth.TokenCache(ledger, timer=clock.monotonic)
    assert await cache.principal("s") is None
    clock.now += auth.CACHE_S - 0.01
    assert await cache.principal("s") is None
    assert ledger.lookups == 1
    clock.now += 0.02
    assert await cache.principal("s") is None
    assert ledger.lookups == 2
