"""The result route's shortcut for chat steps (`tether.supervisor.usecases.unbound`): a step
the claim granted without a repository reports with no binding read; every other step's
binding is read, so a forgotten one only costs that read, never its evidence."""

from __future__ import annotations

from typing import Any

from tests.conftest import ApiHarness
from tether.supervisor.usecases.unbound import UnboundSteps
from tether.wire.records import Lease, LeaseRepository


def lease(step_id: str, repository: LeaseRepository | None = None) -> Lease:
    return Lease(
        step_id=step_id,
        task_id="t",
        name="s",
        kind="chat",
        attempt=1,
        fence=1,
        payload={},
        payload_hash="h",
        ttl_s=30.0,
        renew_every_s=10.0,
        repository=repository,
    )


def test_only_unbound_leases_are_remembered_and_each_is_taken_once() -> None:
    bound = LeaseRepository(name="app", url="/srv/app.git", base_sha="a" * 40, start_sha="a" * 40)
    steps = UnboundSteps(size=2)
    steps.granted([lease("t.0"), lease("t.1", bound)])
    assert steps.take("t.1") is False
    assert steps.take("t.0") is True
    assert steps.take("t.0") is False  # taken: a replayed result reads the binding again
    steps.granted([lease("a.0"), lease("b.0"), lease("c.0")])
    assert [steps.take(s) for s in ("a.0", "b.0", "c.0")] == [False, True, True]


class CountingReads:
    """The app's ledger with the binding read a report pays counted (the real reads still
    run): `binding_of_lease`, which also asks whether the reporting token holds the lease."""

    def __init__(self, api: ApiHarness) -> None:
        self.calls: list[str] = []
        ledger = api.app.state.ledger
        real = ledger.binding_of_lease

        async def counted(step_id: str, fence: int, token_id: str | None, pool: str | None) -> Any:
            self.calls.append(step_id)
            return await real(step_id, fence, token_id, pool)

        ledger.binding_of_lease = counted


async def test_a_chat_result_reads_no_binding_unless_it_was_forgotten(api: ApiHarness) -> None:
    reads = CountingReads(api)
    await api.queued("remembered")
    [first] = await api.claim()
    assert (await api.report(first)).json() == {"outcome": "applied"}
    assert reads.calls == []

    await api.queued("forgotten")
    [second] = await api.claim()
    api.app.state.unbound_steps = UnboundSteps()  # as after a restart
    assert (await api.report(second)).json() == {"outcome": "applied"}
    assert reads.calls == [second["step_id"]]
