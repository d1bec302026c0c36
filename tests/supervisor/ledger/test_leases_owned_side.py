"""A lease belongs to the token that claimed it, live (docs/design.md, Fencing and leases;
Threat model: The owned side; issue 23, finding 3).

A real supervisor (`serve`), the stand-in model and an honest runner process, all on
127.0.0.1 (`Cluster`). A second runner token of the same pool, an intruder that knows the
honest lease's step and fence (fences are visible and a global counter: the issue's intruder
found one on its first guess), renews, checkpoints, reports (single and batch) and releases on
that lease. Each call is answered `not_found`, as for a step that does not exist; the honest
runner's own result then commits `applied` under its own token, and nothing of the
intruder's is in the ledger.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import POOL, Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FORGED = {"forged": "by the intruder"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


def intruder_client(cluster: Cluster, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
        trust_env=False,
    )


def refused_not_found(answer: httpx.Response) -> None:
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == "not_found"


def item_not_found(item: dict[str, Any]) -> None:
    assert (item["status"], item["error"]) == (404, "not_found"), item


def test_a_second_token_of_the_pool_cannot_renew_report_or_release_anothers_lease(
    served: Cluster,
) -> None:
    cluster = served
    intruder_token = cluster.token(POOL, "runner")  # made before serve holds the ledger
    cluster.start_supervisor()
    # The model holds the honest runner's call long enough for every intrusion below.
    cluster.start_model("--latency", "8")
    honest = cluster.start_runner("honest", "--concurrency", "1")
    task_id = cluster.submit("honest work")
    wait_for(lambda: cluster.leased_to(task_id) == "honest", "the honest lease", 15, cluster)
    [attempt] = cluster.attempts(task_id)
    step = cluster.task(task_id)["steps"][0]
    step_id, fence = step["id"], attempt["fence"]
    lease = {"step_id": step_id, "fence": fence}
    report = {"fence": fence, "payload_hash": step["payload_hash"], "output": FORGED}

    with intruder_client(cluster, intruder_token) as intruder:
        me = intruder.get("/v1/runner").json()
        assert (me["pool"], me["token_id"] == attempt["token_id"]) == (POOL, False)
        refused_not_found(intruder.post(f"/v1/leases/{step_id}/renew", json={"fence": fence}))
        [renewal] = intruder.post("/v1/leases/renewals", json={"leases": [lease]}).json()["leases"]
        item_not_found(renewal)
        transcript = b'[{"role": "user", "content": "forged"}]'
        digest = hashlib.sha256(transcript).hexdigest()
        assert intruder.put(f"/v1/artifacts/{digest}", content=transcript).is_success
        checkpoint = {"fence": fence, "turn": 1, "transcript": digest}
        refused_not_found(intruder.put(f"/v1/steps/{step_id}/checkpoint", json=checkpoint))
        refused_not_found(intruder.post(f"/v1/steps/{step_id}/result", json=report))
        batch = {"results": [{"step_id": step_id, **report}]}
        [result] = intruder.post("/v1/steps/results", json=batch).json()["results"]
        item_not_found(result)
        release = {"fence": fence, "reason": "invalid", "retryable": False, "detail": "forged"}
        refused_not_found(intruder.post(f"/v1/leases/{step_id}/release", json=release))

    wait_for(lambda: cluster.state(task_id) == "SUCCEEDED", "the honest result", 30, cluster)
    [reported] = honest.events("step reported")
    assert reported["outcome"] == "applied"
    view = cluster.task(task_id)
    [committed] = view["steps"][0]["attempts"]
    assert (committed["state"], committed["fence"]) == ("committed", fence)
    assert committed["token_id"] == attempt["token_id"]
    assert view["steps"][0]["output"] != FORGED
    assert view["rejections"] == []  # guesses are not_found, never recorded
    assert cluster.effects(task_id) == [(step_id, fence)]
    cluster.check_ledger()
