"""Budgets that count every token (issue 12, item 6): the usage of attempts that never commit
(fenced out, released) counts toward the tenant's spent total once per attempt; the budget is
shown by the task view, `GET /v1/budget`, `tether-supervisor budget --show` and /metrics; a renew
says when it is spent, and the runner then lets the step go uncounted so the task waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import (
    ApiHarness,
    FakeClock,
    assert_error,
    open_api,
    queued_task,
    raw_db,
    report_for,
)
from tests.plain import plain
from tests.runner.test_runner_fakes import completion, make_lease, make_rig, settings
from tests.runner.test_runner_steps import run_until, step_outcomes
from tether.clocks import LoopClock
from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.errors import TransientFailure
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.supervisor_client import SupervisorClient
from tether.supervisor import admin
from tether.supervisor.ledger import Lease, SqliteLedger, StaleFence
from tether.wire import Outcome, ReleaseReason


async def claim_one(ledger: SqliteLedger) -> Lease:
    [lease] = await ledger.claim("r1", "default", 1, 0)
    return lease


async def fenced_out(ledger: SqliteLedger, clock: FakeClock) -> tuple[Lease, Lease]:
    """A step whose first lease lapsed and was granted again: (the old lease, the new one)."""
    await queued_task(ledger)
    old = await claim_one(ledger)
    clock.advance(31)
    assert await ledger.expire() == 1
    return old, await claim_one(ledger)


async def test_a_fenced_out_result_counts_its_usage_once(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    old, new = await fenced_out(ledger, clock)
    for _ in range(2):  # the runner retries a result whose reply it did not read
        with pytest.raises(StaleFence):
            await ledger.report(report_for(old, usage={"total_tokens": 7}))
    assert (await ledger.budget("acme")).spent == 7
    assert await ledger.report(report_for(new, usage={"total_tokens": 3})) is Outcome.APPLIED
    assert await ledger.report(report_for(new, usage={"total_tokens": 3})) is Outcome.REPLAYED
    assert (await ledger.budget("acme")).spent == 10
    view = plain(await ledger.task(new.task_id))
    assert [a["usage"] for a in view["steps"][0]["attempts"]] == [
        {"total_tokens": 7},
        {"total_tokens": 3},
    ]
    assert [r["code"] for r in view["rejections"]] == ["stale_fence", "stale_fence"]


async def test_a_late_result_on_a_committed_step_counts_its_own_attempt(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    old, new = await fenced_out(ledger, clock)
    assert await ledger.report(report_for(new, usage={"total_tokens": 3})) is Outcome.APPLIED
    with pytest.raises(StaleFence):
        await ledger.report(report_for(old, usage={"prompt_tokens": 4, "completion_tokens": 1}))
    assert (await ledger.budget("acme")).spent == 8


async def test_a_release_counts_its_usage_once(ledger: SqliteLedger) -> None:
    task_id = await queued_task(ledger)
    lease = await claim_one(ledger)
    usage = {"total_tokens": 5}
    await ledger.release(
        lease.step_id, lease.fence, ReleaseReason.TRANSIENT, True, "x", None, usage
    )
    with pytest.raises(StaleFence):  # the same release again: the lease is over
        await ledger.release(
            lease.step_id, lease.fence, ReleaseReason.TRANSIENT, True, "x", None, usage
        )
    assert (await ledger.budget("acme")).spent == 5
    view = plain(await ledger.task(task_id))
    assert view["budget"] == {"tenant": "acme", "spent": 5, "budget": None, "left": None}
    [attempt] = view["steps"][0]["attempts"]
    assert (attempt["state"], attempt["usage"]) == ("released", usage)


async def test_a_renew_says_when_the_budget_is_spent_and_the_task_waits_for_more(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await ledger.set_budget("acme", 10)
    first = await queued_task(ledger, "a")
    second = await queued_task(ledger, "b")
    spender, waiter = await ledger.claim("r1", "default", 2, 0)
    assert spender.task_id == first
    assert (await ledger.renew(waiter.step_id, waiter.fence)).budget_exhausted is False
    await ledger.report(report_for(spender, usage={"total_tokens": 10}))
    # The runner's next renew, one interval on: a renew within half an interval of the last
    # written is answered from memory, and a spent budget is no event of the waiter's task.
    clock.advance(5)
    assert (await ledger.renew(waiter.step_id, waiter.fence)).budget_exhausted is True
    await ledger.release(
        waiter.step_id, waiter.fence, ReleaseReason.OPERATOR, True, "budget", None, {}
    )
    assert await ledger.claim("r1", "default", 1, 0) == []
    view = plain(await ledger.task(second))
    assert view["waiting_for"]["reason"] == "budget"
    assert view["budget"] == {"tenant": "acme", "spent": 10, "budget": 10, "left": 0}
    await ledger.set_budget("acme", 100)
    again = await claim_one(ledger)
    assert (again.step_id, again.attempt) == (waiter.step_id, 2)


async def test_budget_show_counts_what_a_fenced_out_attempt_spent(
    ledger_path: Path, ledger: SqliteLedger, clock: FakeClock
) -> None:
    old, _new = await fenced_out(ledger, clock)
    with pytest.raises(StaleFence):
        await ledger.report(report_for(old, usage={"total_tokens": 11}))
    await ledger.set_budget("acme", 50)
    line = admin.show_budget(ledger_path, "acme")
    assert line == "tenant=acme spent=11 budget=50 left=39"


# -- over HTTP ---------------------------------------------------------------------------------


async def test_get_budget_shows_the_operators_own_tenant(api: ApiHarness) -> None:
    response = await api.client.get("/v1/budget", headers=api.operator)
    assert response.status_code == 200
    assert response.json() == {"tenant": "acme", "spent": 0, "budget": None, "left": None}
    await api.app.state.ledger.set_budget("acme", 10)
    task = await api.queued()
    [lease] = await api.claim()
    assert (await api.report(lease)).status_code == 200  # usage: 3 tokens
    response = await api.client.get("/v1/budget", headers=api.operator)
    assert response.json() == {"tenant": "acme", "spent": 3, "budget": 10, "left": 7}
    theirs = await api.client.get("/v1/budget", headers=api.auth("rival"))
    assert theirs.json() == {"tenant": "rival", "spent": 0, "budget": None, "left": None}
    assert_error(await api.client.get("/v1/budget", headers=api.runner), 403, "forbidden")
    view = (await api.client.get(f"/v1/tasks/{task['id']}", headers=api.operator)).json()
    assert view["budget"] == {"tenant": "acme", "spent": 3, "budget": 10, "left": 7}


async def test_a_release_over_http_carries_its_usage(api: ApiHarness) -> None:
    await api.queued()
    [lease] = await api.claim()
    body = {
        "fence": lease["fence"],
        "reason": "transient",
        "retryable": True,
        "usage": {"prompt_tokens": 4, "completion_tokens": 2},
    }
    url = f"/v1/leases/{lease['step_id']}/release"
    assert (await api.client.post(url, headers=api.runner, json=body)).status_code == 200
    assert_error(await api.client.post(url, headers=api.runner, json=body), 409, "stale_fence")
    response = await api.client.get("/v1/budget", headers=api.operator)
    assert response.json()["spent"] == 6


async def test_the_budget_gauge_shows_spent_and_limit(api: ApiHarness) -> None:
    await api.app.state.ledger.set_budget("acme", 10)
    await api.queued()
    [lease] = await api.claim()
    await api.report(lease)
    text = (await api.client.get("/metrics", headers=api.auth("metrics"))).text
    assert 'tether_budget_tokens{kind="spent",tenant="acme"} 3.0' in text
    assert 'tether_budget_tokens{kind="limit",tenant="acme"} 10.0' in text
    assert 'tether_budget_tokens{kind="spent",tenant="rival"}' not in text  # no row: no task
    assert 'kind="limit",tenant="rival"' not in text


# -- a real runner against a real supervisor ----------------------------------------------------


class GatedModel:
    """A model whose answers wait for `open`; `asked` is set by its first request."""

    def __init__(self) -> None:
        self.open = anyio.Event()
        self.asked = anyio.Event()

    async def __call__(self, _request: httpx.Request) -> httpx.Response:
        self.asked.set()
        await self.open.wait()
        return completion("done", prompt=5, out=1)


async def view_of(api: ApiHarness, task_id: str) -> dict[str, Any]:
    response = await api.client.get(f"/v1/tasks/{task_id}", headers=api.operator)
    view: dict[str, Any] = response.json()
    return view


async def until_view(api: ApiHarness, task_id: str, check: Any) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            view = await view_of(api, task_id)
            if check(view):
                return view
            await anyio.sleep(0.02)


async def test_a_runner_told_the_budget_is_spent_releases_uncounted_and_the_task_waits(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Renew every 0.1 s; the supervisor's clock stands still, so no lease lapses on its side.
    async with open_api(
        tmp_path / "api.db", clock, synchronous="OFF", lease_ttl_s=0.3, accept_window_s=0.3
    ) as api:
        ledger = api.app.state.ledger
        await ledger.set_budget("acme", 10)
        task = await api.queued()
        model = GatedModel()
        (tmp_path / "model-key").write_text("unused\n")
        cfg = settings(
            model_key_file=tmp_path / "model-key", claim_wait_s=0.05, pause_initial_s=0.05
        )
        runner_clock = LoopClock()
        runner = Runner(
            settings=cfg,
            supervisor=SupervisorClient(
                base_url=cfg.supervisor_url,
                token=api.secrets["runner"],
                clock=runner_clock,
                transport=httpx.ASGITransport(app=api.app),
            ),
            model=ModelClient(
                base_url=cfg.model_url, clock=runner_clock, transport=httpx.MockTransport(model)
            ),
            model_key=SecretSource(
                path=tmp_path / "model-key", credential="model-key", setting="model_key_file"
            ),
            kinds=KindRegistry.default(entry_points=False),
            clock=runner_clock,
            backoff_max_s=0.05,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(10):
                await model.asked.wait()
            await ledger.set_budget("acme", 0)  # spent while the step's model call runs
            view = await until_view(
                api, task["id"], lambda v: v["steps"][0]["attempts"][0]["state"] == "released"
            )
            [attempt] = view["steps"][0]["attempts"]
            assert attempt["reason"].startswith("operator: ")
            assert view["state"] == "RUNNING"
            assert view["waiting_for"]["reason"] == "budget"
            assert view["steps"][0]["state"] == "queued"
            await anyio.sleep(0.3)  # a few claims: none is granted while the budget is spent
            assert len((await view_of(api, task["id"]))["steps"][0]["attempts"]) == 1
            model.open.set()
            await ledger.set_budget("acme", 100)
            view = await until_view(api, task["id"], lambda v: v["state"] == "SUCCEEDED")
            runner.request_shutdown()
    attempts = view["steps"][0]["attempts"]
    assert [a["state"] for a in attempts] == ["released", "committed"]
    assert "budget is spent" in attempts[0]["reason"]
    assert view["budget"] == {"tenant": "acme", "spent": 6, "budget": 100, "left": 94}
    db = raw_db(api.path)
    try:  # the released attempt was not counted toward max_attempts
        assert db.execute("SELECT burned FROM steps").fetchone()[0] == 0
    finally:
        db.close()


async def test_a_release_carries_the_tokens_the_attempts_model_calls_spent(
    tmp_path: Path,
) -> None:
    async def asks_then_fails(ctx: StepContext) -> StepOutput:
        await ctx.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        await ctx.chat({"model": "m", "messages": [{"role": "user", "content": "again"}]})
        raise TransientFailure("the answer was no use")

    kinds = KindRegistry.default(entry_points=False)
    kinds.register("asks", asks_then_fails)
    rig = make_rig(tmp_path, kinds=kinds)
    rig.supervisor.requeue_released = False
    rig.model.script(completion("one", prompt=5, out=1), completion("two", prompt=7, out=2))
    rig.supervisor.offer(make_lease("s1", kind="asks"))
    await run_until(rig, lambda: step_outcomes(rig) == ["released: transient"])
    body = rig.supervisor.of("release", "s1")[0].body
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
