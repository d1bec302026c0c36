"""The artifact store against another tenant and a greedy runner, live (docs/design.md, Threat
model: The owned side; issue 23, findings 4 and 5): a real supervisor (`serve`), tenants acme
and rival sharing pool `default`, and a runner token of that pool.

- what the runner uploads for acme's lease is acme's: rival's operator gets `not_found` for
  it, digest in hand;
- the pool's bytes stop at `artifact_quota_bytes` (413 `quota_exceeded`, nothing stored);
- what no step names is removed by the collector once `artifact_keep_unreferenced_s` has
  passed, and the removal is logged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUOTA = 4096
LOG = b"a check's log line\n" * 150  # 2,850 bytes


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_supervisor(
            TETHER_ARTIFACT_QUOTA_BYTES=str(QUOTA),
            TETHER_ARTIFACT_KEEP_UNREFERENCED_S="1",
            TETHER_ARTIFACT_COLLECT_EVERY_S="0.5",
        )
        yield cluster
    finally:
        cluster.stop_all()


def client(cluster: Cluster, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
        trust_env=False,
    )


def lease_of_acme(cluster: Cluster, runner: httpx.Client) -> dict[str, Any]:
    cluster.submit()
    answer = runner.post(
        "/v1/leases/claim", json={"runner_id": "greedy", "capacity": 1, "wait_s": 5}
    )
    assert answer.status_code == 200, answer.text
    lease: dict[str, Any] = answer.json()["leases"][0]
    return lease


def put(runner: httpx.Client, data: bytes, lease: dict[str, Any]) -> httpx.Response:
    return runner.put(
        f"/v1/artifacts/{hashlib.sha256(data).hexdigest()}",
        content=data,
        params={"step_id": lease["step_id"], "fence": lease["fence"]},
    )


def stored(cluster: Cluster, data: bytes) -> bool:
    digest = hashlib.sha256(data).hexdigest()
    return (cluster.folder / "artifacts" / "sha256" / digest[:2] / digest).exists()


def test_another_tenant_cannot_read_what_a_runner_uploaded_for_acme(supervisor: Cluster) -> None:
    runner = client(supervisor, supervisor.runner_token_file.read_text().strip())
    rival = client(supervisor, supervisor.token("rival", "operator"))
    with runner, rival:
        lease = lease_of_acme(supervisor, runner)
        assert put(runner, LOG, lease).status_code == 200
        digest = hashlib.sha256(LOG).hexdigest()
        assert supervisor.http.get(f"/v1/artifacts/{digest}").content == LOG
        refused = rival.get(f"/v1/artifacts/{digest}")
        assert (refused.status_code, refused.json()["error"]) == (404, "not_found")
        assert runner.get(f"/v1/artifacts/{digest}").content == LOG  # the pool's runners


def test_a_runners_uploads_stop_at_the_pools_quota(supervisor: Cluster) -> None:
    runner = client(supervisor, supervisor.runner_token_file.read_text().strip())
    with runner:
        lease = lease_of_acme(supervisor, runner)
        accepted = 0
        refused: list[httpx.Response] = []
        for n in range(10):  # what a runner filling the disk would send
            answer = put(runner, LOG + str(n).encode(), lease)
            if answer.status_code == 200:
                accepted += answer.json()["size"]
            else:
                refused.append(answer)
        print(f"\naccepted {accepted} bytes of {10 * (len(LOG) + 1)}; quota {QUOTA}")
        assert accepted <= QUOTA
        assert len(refused) == 9
        assert {(r.status_code, r.json()["error"]) for r in refused} == {(413, "quota_exceeded")}
        assert [stored(supervisor, LOG + str(n).encode()) for n in range(3)] == [
            True,
            False,
            False,
        ]


def test_the_collector_removes_unreferenced_artifacts_and_logs_it(supervisor: Cluster) -> None:
    note = b"an operator's upload that no step names\n"
    digest = hashlib.sha256(note).hexdigest()
    assert supervisor.http.put(f"/v1/artifacts/{digest}", content=note).status_code == 200
    assert stored(supervisor, note)
    proc = supervisor.procs[0]
    wait_for(lambda: not stored(supervisor, note), "the collector", 30, supervisor)
    [line] = wait_for(
        lambda: proc.events("unreferenced artifacts collected"), "its log line", 10, supervisor
    )
    assert (line["rows"], line["digests"], line["bytes"]) == (1, 1, len(note))
    gone = supervisor.http.get(f"/v1/artifacts/{digest}")
    assert (gone.status_code, gone.json()["error"]) == (404, "not_found")
