"""`POST /v1/steps/results`: many results in one request, one transaction, one answer each,
and exactly what the single route would have answered for every one of them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ApiHarness, assert_error, count, ledger_snapshot
from tether.wire import RESULTS_PER_REQUEST_MAX


def item(lease: dict[str, Any], output: Any = "done", **extra: Any) -> dict[str, Any]:
    return {
        "step_id": lease["step_id"],
        "fence": lease["fence"],
        "payload_hash": lease["payload_hash"],
        "output": output,
        "usage": {"total_tokens": 3},
        **extra,
    }


async def post(api: ApiHarness, items: Any, who: str = "runner") -> Any:
    return await api.client.post(
        "/v1/steps/results", headers=api.auth(who), json={"results": items}
    )


async def leases(api: ApiHarness, n: int) -> list[dict[str, Any]]:
    for k in range(n):
        await api.queued(f"k{k}")
    got = await api.claim(capacity=n)
    assert len(got) == n
    return got


async def test_results_of_several_steps_commit_together_each_answered_in_order(
    api: ApiHarness,
) -> None:
    held = await leases(api, 3)
    batches_before = api.app.state.ledger.counters.batches
    answer = await post(api, [item(x, output={"n": n}) for n, x in enumerate(held)])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "results": [{"step_id": x["step_id"], "outcome": "applied"} for x in held]
    }
    assert api.app.state.ledger.counters.batches - batches_before == 1  # one transaction
    assert count(api.path, "effects") == 3
    again = await post(api, [item(x, output={"n": n}) for n, x in enumerate(held)])
    assert [a["outcome"] for a in again.json()["results"]] == ["replayed"] * 3
    assert count(api.path, "effects") == 3


async def test_each_refused_result_gets_the_single_routes_status_and_code(
    api: ApiHarness,
) -> None:
    good, stale, drifted, unheld = await leases(api, 4)
    for held in (good, unheld):  # acknowledged; `stale` is not, and its window lapses
        renewed = await api.client.post(
            f"/v1/leases/{held['step_id']}/renew", headers=api.runner, json={"fence": held["fence"]}
        )
        assert renewed.status_code == 200, renewed.text
    api.clock.advance(10.5)
    items = [
        item(good),
        item(stale),
        item(drifted, payload_hash="0" * 64),
        item(good | {"step_id": "no-such-step"}),
        item(unheld, fence=unheld["fence"] + 1000),  # a fence the step never had
    ]
    answers = (await post(api, items)).json()["results"]
    assert answers[0] == {"step_id": good["step_id"], "outcome": "applied"}
    assert [(a["step_id"], a["status"], a["error"]) for a in answers[1:]] == [
        (stale["step_id"], 409, "stale_fence"),
        (drifted["step_id"], 409, "payload_drift"),
        ("no-such-step", 404, "not_found"),
        (unheld["step_id"], 404, "not_found"),
    ]
    assert all(a["detail"].strip() for a in answers[1:])
    # The single route answers the same for the same reports.
    single = await api.report(stale)
    assert_error(single, 409, "stale_fence")
    assert_error(await api.report(unheld, fence=unheld["fence"] + 1000), 404, "not_found")
    assert count(api.path, "effects") == 1


async def test_a_lease_another_token_holds_is_not_found_and_stays_its_holders(
    api: ApiHarness,
) -> None:
    [lease] = await leases(api, 1)
    answers = (await post(api, [item(lease, output="forged")], who="intruder")).json()["results"]
    assert (answers[0]["status"], answers[0]["error"]) == (404, "not_found")
    assert count(api.path, "effects") == 0
    [honest] = (await post(api, [item(lease)])).json()["results"]
    assert honest == {"step_id": lease["step_id"], "outcome": "applied"}


async def test_another_pools_step_is_not_found_there_too(api: ApiHarness) -> None:
    [lease] = await leases(api, 1)
    answers = (await post(api, [item(lease)], who="stranger")).json()["results"]
    assert (answers[0]["status"], answers[0]["error"]) == (404, "not_found")
    assert count(api.path, "effects") == 0


async def test_an_operator_token_is_refused(api: ApiHarness) -> None:
    [lease] = await leases(api, 1)
    assert_error(await post(api, [item(lease)], who="operator"), 403, "forbidden")


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda items: {"results": []}, "'results'"),
        (lambda items: {"results": "nope"}, "'results'"),
        (lambda items: {"nothing": items}, "'results'"),
        (lambda items: {"results": [*items, 7]}, "results[2]"),
        (lambda items: {"results": [items[0], {**items[1], "fence": "x"}]}, "results[1]"),
        (lambda items: {"results": [items[0], {**items[1], "step_id": 5}]}, "results[1]"),
        (
            lambda items: {
                "results": [items[0], {k: v for k, v in items[1].items() if k != "output"}]
            },
            "results[1]",
        ),
        (lambda items: {"results": [items[0], items[0]]}, "more than once"),
        (lambda items: {"results": [items[0]] * (RESULTS_PER_REQUEST_MAX + 1)}, "'results'"),
    ],
)
async def test_a_malformed_item_refuses_the_whole_request_and_changes_nothing(
    api: ApiHarness, mutate: Any, where: str
) -> None:
    held = await leases(api, 2)
    before = ledger_snapshot(api.path)
    answer = await api.client.post(
        "/v1/steps/results", headers=api.runner, json=mutate([item(x) for x in held])
    )
    body = assert_error(answer, 422, "invalid_field")
    assert where in body["detail"]
    assert ledger_snapshot(api.path) == before


async def test_a_storage_failure_is_503_unavailable_on_both_routes(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both routes turn a ledger error into its wire code in one place (`ledger_error_code`)."""
    from tether.supervisor.ledger import StorageError

    [lease] = await leases(api, 1)

    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise StorageError("disk I/O error")

    async def refused(reports: list[Any]) -> list[StorageError]:
        return [StorageError("disk I/O error") for _ in reports]

    monkeypatch.setattr(api.app.state.ledger, "report", broken)
    # The batch route queues its reports together (`LedgerStore.queue_reports`).
    monkeypatch.setattr(
        api.app.state.ledger, "queue_reports", lambda reports, *_a, **_k: refused(reports)
    )
    assert_error(await api.report(lease), 503, "unavailable")
    [answer] = (await post(api, [item(lease)])).json()["results"]
    assert answer == {
        "step_id": lease["step_id"],
        "status": 503,
        "error": "unavailable",
        "detail": "disk I/O error",
    }
