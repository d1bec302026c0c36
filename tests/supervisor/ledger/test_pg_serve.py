"""Two `tether-supervisor serve` processes on one PostgreSQL database serve one API: a runner's
claim long-polling on A is answered when an operator queues work through B, the result is
reported through B, an event watch on A sees it, and a token revoked through one supervisor
is refused by the other (within the token cache's second)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests import pgdb
from tests.supervisor.test_cli_serve import serving
from tether.supervisor import admin

pg_url = pgdb.pg_url

# How long the claim and the event watch on A wait. Woken within half of it is woken by the
# notification, not by the wait's end (a wide margin, for a loaded machine).
WAIT_S = 20


def test_two_supervisors_on_one_database_serve_one_api(pg_url: str, tmp_path: Path) -> None:
    operator = {"Authorization": f"Bearer {admin.create_token(pg_url, 'acme', 'operator').secret}"}
    runner_token = admin.create_token(pg_url, "acme/pg", "runner")
    runner = {"Authorization": f"Bearer {runner_token.secret}"}
    claims: list[httpx.Response] = []

    def long_claim(url: str) -> None:
        body = {"runner_id": "r1", "capacity": 1, "wait_s": WAIT_S}
        claims.append(
            httpx.post(f"{url}/v1/leases/claim", headers=runner, json=body, timeout=WAIT_S + 10)
        )

    with (
        serving(pg_url, tmp_path / "a.log") as (_a, on_a),  # type: ignore[arg-type]
        serving(pg_url, tmp_path / "b.log") as (_b, on_b),  # type: ignore[arg-type]
    ):
        claimer = threading.Thread(target=long_claim, args=(on_a,), daemon=True)
        claimer.start()
        claimer.join(timeout=0.5)
        assert claimer.is_alive()  # waiting on A: nothing is queued yet
        plan = {
            "steps": [
                {
                    "name": "s0",
                    "kind": "chat",
                    "payload": {"messages": [{"role": "user", "content": "hi"}]},
                }
            ]
        }
        body: dict[str, Any] = {"idempotency_key": "k1", "plan": plan, "pool": "acme/pg"}
        created = httpx.post(f"{on_b}/v1/tasks", headers=operator, json=body, timeout=10)
        assert created.status_code == 201, created.text
        task = created.json()
        queued_at = time.monotonic()
        approved = httpx.post(
            f"{on_b}/v1/tasks/{task['id']}/approve",
            headers=operator,
            json={"plan_hash": task["plan_hash"]},
            timeout=10,
        )
        assert approved.status_code == 200, approved.text
        claimer.join(timeout=WAIT_S / 2)
        assert time.monotonic() - queued_at < WAIT_S / 2  # through B's notification
        [claim] = claims
        assert claim.status_code == 200, claim.text
        [lease] = claim.json()["leases"]
        assert lease["task_id"] == task["id"]

        seen = httpx.get(f"{on_a}/v1/tasks/{task['id']}", headers=operator, timeout=10).json()
        watched: list[httpx.Response] = []

        def watch_on_a() -> None:
            url = f"{on_a}/v1/tasks/{task['id']}/events"
            query = {"after": seen["seq"], "wait": WAIT_S}
            watched.append(httpx.get(url, headers=operator, params=query, timeout=WAIT_S + 10))

        watcher = threading.Thread(target=watch_on_a, daemon=True)
        watcher.start()
        watcher.join(timeout=0.5)
        assert watcher.is_alive()  # no event after `seq` yet
        result = httpx.post(
            f"{on_b}/v1/steps/{lease['step_id']}/result",
            headers=runner,
            json={
                "fence": lease["fence"],
                "payload_hash": lease["payload_hash"],
                "output": {"ok": True},
                "usage": {"total_tokens": 1},
            },
            timeout=10,
        )
        assert result.json() == {"outcome": "applied"}
        reported_at = time.monotonic()
        watcher.join(timeout=WAIT_S / 2)
        assert time.monotonic() - reported_at < WAIT_S / 2
        [events] = watched
        assert events.status_code == 200
        after = [e["seq"] for e in events.json()["events"]]
        assert after
        assert min(after) > seen["seq"]
        view = httpx.get(f"{on_a}/v1/tasks/{task['id']}", headers=operator, timeout=10).json()
        assert view["state"] == "SUCCEEDED"

        admin.revoke_token(pg_url, runner_token.id)
        time.sleep(1.1)  # the token cache's lifetime
        for url in (on_a, on_b):
            body = {"runner_id": "r1", "capacity": 1, "wait_s": 0}
            refused = httpx.post(f"{url}/v1/leases/claim", headers=runner, json=body, timeout=10)
            assert refused.status_code == 401
