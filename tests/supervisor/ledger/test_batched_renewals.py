"""Batched renewals (docs/design.md, Runner API): a runner renews all the leases due together
in one request, one ledger batch; each lease gets the single renew's answer, and a refusal
drops only its own step."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import anyio

from tests.conftest import ApiHarness, assert_error, count
from tests.runner.test_runner_fakes import hang, make_lease, make_rig
from tests.runner.test_runner_steps import step_outcomes, until
from tether.clocks import LoopClock
from tether.runner.errors import SupervisorUnreachable
from tether.runner.keeper import RenewalBatcher
from tether.runner.supervisor_client import SupervisorClient


async def test_each_lease_gets_its_own_answer_in_one_transaction(api: ApiHarness) -> None:
    for k in range(2):
        await api.queued(f"k{k}")
    good, stale = await api.claim(2)
    acknowledged = await api.client.post(
        f"/v1/leases/{good['step_id']}/renew", headers=api.runner, json={"fence": good["fence"]}
    )
    assert acknowledged.status_code == 200, acknowledged.text
    api.clock.advance(10.5)  # `stale` was never acknowledged: its acceptance window lapsed
    batches = api.app.state.ledger.counters.batches
    answer = await api.client.post(
        "/v1/leases/renewals",
        headers=api.runner,
        json={
            "leases": [
                {"step_id": good["step_id"], "fence": good["fence"]},
                {"step_id": stale["step_id"], "fence": stale["fence"]},
                {"step_id": "no-such-step", "fence": 1},
            ]
        },
    )
    assert answer.status_code == 200, answer.text
    renewed, refused, unknown = answer.json()["leases"]
    assert renewed == {
        "step_id": good["step_id"],
        "ttl_s": 30.0,
        "renew_every_s": 5.0,
        "cancelled": False,
        "budget_exhausted": False,
    }
    assert (refused["status"], refused["error"]) == (409, "stale_fence")
    assert (unknown["status"], unknown["error"]) == (404, "not_found")
    assert api.app.state.ledger.counters.batches - batches == 1
    assert count(api.path, "rejections") == 1  # the stale fence is recorded, as on the single
    single = await api.client.post(
        f"/v1/leases/{stale['step_id']}/renew", headers=api.runner, json={"fence": stale["fence"]}
    )
    assert_error(single, 409, "stale_fence")


async def test_a_step_named_twice_is_refused_and_nothing_renewed(api: ApiHarness) -> None:
    await api.queued("k0")
    [lease] = await api.claim()
    ref = {"step_id": lease["step_id"], "fence": lease["fence"]}
    answer = await api.client.post(
        "/v1/leases/renewals", headers=api.runner, json={"leases": [ref, ref]}
    )
    assert_error(answer, 422, "invalid_field")
    assert count(api.path, "steps", "accept_deadline IS NULL") == 0  # not acknowledged


async def test_a_runner_renews_its_leases_together_and_a_refusal_drops_only_its_step(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, concurrency=3)
    sup = rig.supervisor
    rig.model.script(hang, hang, hang)
    for n in range(3):
        sup.offer(make_lease(f"s{n}", task_id=f"t{n}", fence=10 + n, renew_every_s=0.05))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: len(sup.renewal_batches) >= 3)
        sup.fences["s1"] = 99  # another runner holds it now
        await until(rig, lambda: "dropped: stale_fence" in step_outcomes(rig))
        dropped_at = len(sup.renewal_batches)
        await sup.until(lambda: len(sup.renewal_batches) >= dropped_at + 2)
        rig.runner.request_shutdown()
    assert sorted(sup.renewal_batches[0]) == ["s0", "s1", "s2"]  # one request for the three
    assert all(sorted(b) == ["s0", "s2"] for b in sup.renewal_batches[dropped_at:])
    assert sup.of("result") == []
    outcomes = step_outcomes(rig)
    assert outcomes.count("dropped: stale_fence") == 1
    assert outcomes.count("released: shutdown") == 2  # the other two kept their leases


async def test_a_supervisor_without_the_route_gets_single_renews(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, concurrency=2)
    sup = rig.supervisor
    sup.renewals_route_missing = True
    rig.model.script(hang, hang)
    for n in range(2):
        sup.offer(make_lease(f"s{n}", task_id=f"t{n}", fence=10 + n, renew_every_s=0.05))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.serve)
        await sup.until(lambda: len(sup.of("renew", "s0")) >= 2 and len(sup.of("renew", "s1")) >= 2)
        rig.runner.request_shutdown()
    assert sup.renewal_batches == []
    assert step_outcomes(rig) == ["released: shutdown", "released: shutdown"]


class _HangingClient:
    """A supervisor client whose batch renew never answers."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []
        self.called = anyio.Event()

    async def renew_many(self, pairs: list[tuple[str, int]], *, timeout_s: float | None) -> None:
        self.calls.append(pairs)
        self.called.set()
        await anyio.sleep_forever()


async def test_a_keeper_cancelled_while_its_request_is_out_leaves_no_lease_unanswered() -> None:
    """The keeper whose renew carries others' leases is cancelled mid-request: the others get
    `SupervisorUnreachable` (and retry on their own), never a loop of empty requests."""
    client = _HangingClient()
    batcher = RenewalBatcher(cast(SupervisorClient, client), clock=LoopClock())
    answers: dict[str, object] = {}
    answered = anyio.Event()

    async def renew(step_id: str) -> None:
        try:
            answers[step_id] = await batcher.renew(step_id, 1, timeout_s=None, every_s=1.0)
        except SupervisorUnreachable as exc:
            answers[step_id] = exc
        answered.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            sender = anyio.CancelScope()

            async def first() -> None:
                with sender:
                    await renew("s1")

            tg.start_soon(first)
            tg.start_soon(renew, "s2")
            await client.called.wait()
            sender.cancel()
            await answered.wait()
            tg.cancel_scope.cancel()
    assert client.calls == [[("s1", 1), ("s2", 1)]]
    assert isinstance(answers["s2"], SupervisorUnreachable)
    assert "s1" not in answers
