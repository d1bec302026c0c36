"""Which pools a tenant's tasks may name: a shared pool (`shared_pools`, default `default`),
the tenant's own pool, or its `<tenant>/<name>` pools. Any other pool is refused, writes
nothing, and so never reaches runners set up for another tenant."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ApiHarness, FakeClock, assert_error, ledger_snapshot, open_api, task_body
from tether.settings import SettingsError
from tether.supervisor import admin
from tether.supervisor.settings import SupervisorSettings


@pytest.mark.parametrize("pool", ["default", "acme", "acme/gpu", "acme/gpu/eu"])
async def test_a_tenant_may_name_a_shared_pool_and_its_own(api: ApiHarness, pool: str) -> None:
    answer = await api.client.post("/v1/tasks", headers=api.operator, json=task_body(pool=pool))
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize("pool", ["elsewhere", "rival", "rival/gpu", "acmeco", "acme-gpu"])
async def test_any_other_pool_is_forbidden_and_writes_nothing(api: ApiHarness, pool: str) -> None:
    before = ledger_snapshot(api.path)
    answer = await api.client.post("/v1/tasks", headers=api.operator, json=task_body(pool=pool))
    detail = assert_error(answer, 403, "forbidden")["detail"]
    assert repr(pool) in detail
    assert "'acme/<name>'" in detail
    assert ledger_snapshot(api.path) == before


async def test_a_runner_of_another_tenants_pool_never_sees_the_task(api: ApiHarness) -> None:
    """The scenario the rule closes: tenant rival aims a task at acme's runners."""
    runner = admin.create_token(api.path, "acme/gpu", "runner").secret
    refused = await api.client.post(
        "/v1/tasks",
        headers=api.auth("rival"),
        json=task_body("r1", pool="acme/gpu"),
    )
    assert_error(refused, 403, "forbidden")
    claim = await api.client.post(
        "/v1/leases/claim",
        headers={"Authorization": f"Bearer {runner}"},
        json={"runner_id": "acme-gpu-1", "capacity": 1, "wait_s": 0},
    )
    assert claim.status_code == 204


async def test_shared_pools_are_a_setting(tmp_path: Path, clock: FakeClock) -> None:
    async with open_api(tmp_path / "l.db", clock, shared_pools="default, gpu") as api:
        for pool in ("gpu", "default", "acme"):
            body = task_body(f"k-{pool}", pool=pool)
            answer = await api.client.post("/v1/tasks", headers=api.operator, json=body)
            assert answer.status_code == 201, answer.text
        refused = await api.client.post(
            "/v1/tasks", headers=api.operator, json=task_body("k-cpu", pool="cpu")
        )
        assert "shared pool (default, gpu)" in assert_error(refused, 403, "forbidden")["detail"]
    async with open_api(tmp_path / "m.db", clock, shared_pools="") as api:
        refused = await api.client.post("/v1/tasks", headers=api.operator, json=task_body())
        assert "shared pool (none)" in assert_error(refused, 403, "forbidden")["detail"]


def test_a_shared_pool_cannot_be_a_tenants_pool() -> None:
    with pytest.raises(SettingsError, match="shared_pools"):
        SupervisorSettings(shared_pools="default,acme/gpu")
    assert SupervisorSettings(shared_pools=" gpu ,, default").shared_pool_names == {
        "gpu",
        "default",
    }


def test_a_tenant_name_has_no_slash(tmp_path: Path) -> None:
    with pytest.raises(admin.AdminError, match="no '/'"):
        admin.create_token(tmp_path / "l.db", "acme/evil", "operator", init=True)
    # A pool's name may have one.
    assert admin.create_token(tmp_path / "l.db", "acme/gpu", "runner", init=True)
