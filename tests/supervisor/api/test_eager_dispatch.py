"""Eager dispatch (docs/design.md, Runner API): a result may ask for the next leases, granted
in the result's own group-commit batch by the claim's rules; a refused result grants none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from tests.conftest import ApiHarness, FakeClock, count, open_api, queued_task, report_for
from tests.runner.test_runner_fakes import FakeModel, settings
from tether.clocks import LoopClock
from tether.runner.credentials import SecretSource
from tether.runner.daemon import Runner
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.runner.model_client import ModelClient
from tether.runner.supervisor_client import SupervisorClient
from tether.supervisor.ledger import SqliteLedger, StaleFence


async def report_and_claim(
    ledger: SqliteLedger, reports: list[Any], want: int, kinds: tuple[str, ...] = ("chat",)
) -> tuple[list[Any], list[Any]]:
    """The route's order: the reports, then the eager claim, queued together."""
    outcomes: list[Any] = [None] * len(reports)
    granted: list[Any] = []

    async def one(n: int, rep: Any) -> None:
        try:
            outcomes[n] = await ledger.report(rep, "default")
        except StaleFence as exc:
            outcomes[n] = exc

    async def grant() -> None:
        granted.extend(
            await ledger.claim_after(
                [(r.step_id, r.fence) for r in reports], "r1", "default", want, kinds=kinds
            )
        )

    async with anyio.create_task_group() as tg:
        for n, rep in enumerate(reports):
            tg.start_soon(one, n, rep)
        tg.start_soon(grant)
    return outcomes, granted


async def test_a_result_with_want_grants_up_to_want_in_the_results_batch(
    ledger: SqliteLedger,
) -> None:
    for k in range(4):
        await queued_task(ledger, f"k{k}")
    [lease] = await ledger.claim("r1", "default", 1, 0)
    batches = ledger.counters.batches
    outcomes, granted = await report_and_claim(ledger, [report_for(lease)], want=2)
    assert [str(o) for o in outcomes] == ["applied"]
    assert len(granted) == 2
    assert lease.step_id not in {g.step_id for g in granted}
    assert ledger.counters.batches - batches == 1  # the result and the grant: one transaction
    # The rest of the queue is left for a claim: want bounds the grant.
    assert len(await ledger.claim("r1", "default", 10, 0)) == 1


async def test_a_refused_result_grants_nothing(ledger: SqliteLedger, clock: FakeClock) -> None:
    await queued_task(ledger, "k0")
    await queued_task(ledger, "k1")
    [lease] = await ledger.claim("r1", "default", 1, 0)
    clock.advance(10.5)  # never acknowledged: the lease lapsed with its acceptance window
    outcomes, granted = await report_and_claim(ledger, [report_for(lease)], want=3)
    assert isinstance(outcomes[0], StaleFence)
    assert granted == []
    assert len(await ledger.claim("r1", "default", 10, 0)) == 1  # the other task still queued


async def test_each_result_not_accepted_takes_one_lease_off_want(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    for k in range(5):
        await queued_task(ledger, f"k{k}")
    good, bad = await ledger.claim("r1", "default", 2, 0)
    await ledger.renew(good.step_id, good.fence)  # acknowledged; `bad` is not, and lapses
    clock.advance(10.5)
    reports = [report_for(good), report_for(bad)]
    _outcomes, granted = await report_and_claim(ledger, reports, want=3)
    assert len(granted) == 2


async def test_a_replayed_result_grants_and_the_next_step_of_its_task_may_be_granted(
    ledger: SqliteLedger,
) -> None:
    await queued_task(ledger, "k0", steps=2)
    [first] = await ledger.claim("r1", "default", 1, 0)
    _, granted = await report_and_claim(ledger, [report_for(first)], want=1)
    assert [g.name for g in granted] == ["s1"]  # the task's next step, in the same batch
    outcomes, again = await report_and_claim(ledger, [report_for(first)], want=1)
    assert [str(o) for o in outcomes] == ["replayed"]
    assert again == []


async def test_eager_grants_keep_the_kinds_and_budget_rules(ledger: SqliteLedger) -> None:
    await queued_task(ledger, "k0")
    await queued_task(ledger, "k1")
    [lease] = await ledger.claim("r1", "default", 1, 0)
    await ledger.set_budget("acme", 3)  # the report's 3 tokens spend it
    _, granted = await report_and_claim(ledger, [report_for(lease)], want=2)
    assert granted == []
    await ledger.set_budget("acme", None)
    await queued_task(ledger, "k2")
    [other] = await ledger.claim("r1", "default", 1, 0)
    _, granted = await report_and_claim(ledger, [report_for(other)], want=2, kinds=("agent",))
    assert granted == []  # only chat steps are queued
    assert len(await ledger.claim("r1", "default", 10, 0)) == 1


# -- the API ------------------------------------------------------------------------------


def want(n: int, runner_id: str = "r1") -> dict[str, Any]:
    return {"runner_id": runner_id, "leases": n}


async def test_the_result_route_answers_the_granted_leases(api: ApiHarness) -> None:
    for k in range(3):
        await api.queued(f"k{k}")
    [lease] = await api.claim()
    answer = await api.report(lease, want=want(5))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["outcome"] == "applied"
    assert len(body["leases"]) == 2
    assert {x["attempt"] for x in body["leases"]} == {1}
    assert await api.claim(5) == []
    # Without `want` (a runner older than it) the answer is as before: no `leases` key.
    assert (await api.report(body["leases"][0])).json() == {"outcome": "applied"}


async def test_a_refused_result_on_the_route_grants_nothing(api: ApiHarness) -> None:
    await api.queued("k0")
    await api.queued("k1")
    [lease] = await api.claim()
    attempts = count(api.path, "attempts")
    api.clock.advance(10.5)  # never acknowledged: the lease lapsed with its acceptance window
    answer = await api.report(lease, want=want(2))
    assert answer.status_code == 409
    assert answer.json()["error"] == "stale_fence"
    assert count(api.path, "attempts") == attempts


async def test_the_batch_route_grants_for_the_whole_request(api: ApiHarness) -> None:
    for k in range(5):
        await api.queued(f"k{k}")
    held = await api.claim(2)
    items = [
        {
            "step_id": x["step_id"],
            "fence": x["fence"],
            "payload_hash": x["payload_hash"],
            "output": "ok",
        }
        for x in held
    ]
    ledger = api.app.state.ledger
    batches = ledger.counters.batches
    answer = await api.client.post(
        "/v1/steps/results", headers=api.runner, json={"results": items, "want": want(2)}
    )
    assert answer.status_code == 200, answer.text
    assert ledger.counters.batches - batches == 1  # both results and the grant: one transaction
    body = answer.json()
    assert [r["outcome"] for r in body["results"]] == ["applied", "applied"]
    assert len(body["leases"]) == 2
    assert len(await api.claim(5)) == 1


async def test_a_malformed_want_is_refused_before_anything_is_applied(api: ApiHarness) -> None:
    await api.queued("k0")
    [lease] = await api.claim()
    answer = await api.report(lease, want={"runner_id": "r1", "leases": 10_000})
    assert answer.status_code == 422
    assert count(api.path, "effects") == 0


# -- the runner ---------------------------------------------------------------------------


class Counting:
    """A step kind that counts how many of its steps run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.done = 0

    async def __call__(self, ctx: StepContext) -> StepOutput:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(0.01)
        finally:
            self.running -= 1
        self.done += 1
        return StepOutput(output={"ok": ctx.step_id})


def counting_route(api: ApiHarness, seen: dict[str, int]) -> httpx.AsyncBaseTransport:
    """The app's transport, counting requests by route."""
    inner = httpx.ASGITransport(app=api.app)

    class Counted(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            parts = request.url.path.strip("/").split("/")
            name = parts[-1] if parts[-1] in ("claim", "results", "renew", "renewals") else "other"
            seen[name] = seen.get(name, 0) + 1
            return await inner.handle_async_request(request)

    return Counted()


def runner_on(api: ApiHarness, tmp_path: Path, kind: Counting, **overrides: Any) -> Runner:
    """A runner whose `chat` steps are `kind`, talking to the real app through `transport`."""
    key_file = tmp_path / "model-key"
    key_file.write_text("sk-test\n")
    seen: dict[str, int] = overrides.pop("seen")
    cfg = settings(model_key_file=key_file, **overrides)
    clock = LoopClock()
    return Runner(
        settings=cfg,
        supervisor=SupervisorClient(
            base_url="http://supervisor.test",
            token=api.secrets["runner"],
            clock=clock,
            transport=counting_route(api, seen),
        ),
        model=ModelClient(base_url=cfg.model_url, clock=clock, transport=FakeModel().transport),
        model_key=SecretSource(path=key_file, credential="model-key", setting="model_key_file"),
        kinds=KindRegistry([("chat", kind)]),
        clock=clock,
        backoff_max_s=0.05,
    )


async def test_the_runner_starts_eager_leases_within_its_concurrency(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with open_api(tmp_path / "api.db", clock, synchronous="OFF") as api:
        for k in range(12):
            await api.queued(f"k{k}")
        kind, seen = Counting(), dict[str, int]()
        runner = runner_on(api, tmp_path, kind, seen=seen, concurrency=3, claim_wait_s=0.5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(10):
                await runner.wait_until(lambda: kind.done >= 12)
            runner.request_shutdown()
        assert count(api.path, "steps", "state = 'committed'") == 12
        assert kind.most <= 3
        assert runner.eager_leases > 0
        assert seen.get("claim", 0) < 12  # most leases came with results
