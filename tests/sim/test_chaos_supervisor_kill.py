"""Real processes (docs/design.md, Proof obligations): SIGKILL the supervisor at random moments
while several runners work,
restart it on the same ledger file each time, at least 20 times (`TETHER_SUPERVISOR_KILLS` asks
for more, `TETHER_SUPERVISOR_KILL_SEED` replays one run's moments).

After every kill, before the restart: `PRAGMA integrity_check` is ok, and every step the ledger
had committed before the kill is still committed with the same effect. At the end: every task
the operator was told exists exists and has ended, no step has two effects, every result a
runner was told was `applied` (or `replayed`) is an effect in the ledger under that runner's
fence, and `tether-supervisor check` passes.

The cluster helpers come from the runner process tests: one way to start these programs.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import (
    ACCEPT_S,
    POOL,
    TTL_S,
    Cluster,
    Proc,
    environment,
    program,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KILLS = int(os.environ.get("TETHER_SUPERVISOR_KILLS", "20"))
SEED = int(
    os.environ.get("TETHER_SUPERVISOR_KILL_SEED", str(random.SystemRandom().randrange(10**6)))
)
RUNNERS = 3


def start_supervisor(cluster: Cluster, life: int) -> Proc:
    argv = [*program("tether-supervisor"), "serve", "--db", str(cluster.db)]
    argv += ["--host", "127.0.0.1", "--port", str(cluster.sup_port)]
    env = environment(TETHER_LEASE_TTL_S=str(TTL_S), TETHER_ACCEPT_WINDOW_S=str(ACCEPT_S))
    proc = cluster.start(f"supervisor-{life}", argv, env)
    wait_for(lambda: cluster._up(f"{cluster.url}/healthz", proc), "the supervisor", 20, cluster)
    return proc


def call(cluster: Cluster, path: str, body: dict[str, Any]) -> httpx.Response | None:
    """POST, retried like a client would on a cut connection (the bodies are idempotent)."""
    for _ in range(5):
        try:
            return cluster.http.post(path, json=body)
        except httpx.TransportError:
            time.sleep(0.1)
    return None


def submit(cluster: Cluster, rng: random.Random, n: int) -> str | None:
    """Create and approve a task of 1-3 steps; answer its id once the create was answered."""
    steps = [
        {
            "name": f"s{j}",
            "kind": "chat",
            "payload": {"messages": [{"role": "user", "content": f"task {n} step {j}"}]},
        }
        for j in range(rng.randint(1, 3))
    ]
    body = {"idempotency_key": f"kill-{SEED}-{n}", "plan": {"steps": steps}, "pool": POOL}
    created = call(cluster, "/v1/tasks", body)
    if created is None:
        return None
    assert created.status_code in (200, 201), created.text
    task: dict[str, Any] = created.json()
    approve(cluster, task["id"], task["plan_hash"])
    task_id: str = task["id"]
    return task_id


def approve(cluster: Cluster, task_id: str, plan_hash: str) -> None:
    answer = call(
        cluster, f"/v1/tasks/{task_id}/approve", {"plan_hash": plan_hash, "base_sha": None}
    )
    assert answer is not None, f"approve {task_id}: no answer"
    assert answer.status_code == 200, answer.text


def read(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        return conn.execute(sql).fetchall()


def committed(db: Path) -> dict[str, int]:
    """step id -> the fence of its effect, for every committed step."""
    rows = read(db, "SELECT s.id, e.fence FROM steps s JOIN effects e ON e.step_id = s.id")
    return {str(step): int(fence) for step, fence in rows}


def test_sigkill_the_supervisor_under_load_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    print(f"supervisor kill test: {KILLS} kills, seed {SEED}")
    rng = random.Random(SEED)
    cluster = Cluster(tmp_path)
    try:
        cluster.start_model("--latency", "0.2")  # steps stay in flight across kills
        supervisor = start_supervisor(cluster, 0)
        runners = [cluster.start_runner(f"runner-{i}") for i in range(RUNNERS)]
        acknowledged: set[str] = set()  # tasks the operator was told exist
        submitted = 0
        mid_step = 0  # kills that caught a step in flight
        for kill in range(1, KILLS + 1):
            for _ in range(rng.randint(2, 4)):
                submitted += 1
                task_id = submit(cluster, rng, submitted)
                if task_id is not None:
                    acknowledged.add(task_id)
            time.sleep(rng.uniform(0.0, 0.6))  # a random moment under load
            leased = read(cluster.db, "SELECT COUNT(*) FROM steps WHERE state = 'leased'")[0][0]
            mid_step += 1 if leased else 0
            supervisor.popen.kill()
            supervisor.popen.wait(10)
            before = committed(cluster.db)
            assert read(cluster.db, "PRAGMA integrity_check") == [("ok",)], f"kill {kill}"
            supervisor = start_supervisor(cluster, kill)
            after = committed(cluster.db)
            lost = {s: f for s, f in before.items() if after.get(s) != f}
            assert not lost, f"kill {kill}: committed steps lost or changed: {lost}"

        for task_id, plan_hash in read(
            cluster.db, "SELECT id, plan_hash FROM tasks WHERE state = 'PLANNED'"
        ):
            approve(cluster, task_id, plan_hash)  # an approval the last kill cut off

        def all_ended() -> bool:
            states = read(cluster.db, "SELECT state FROM tasks")
            return all(s in ("SUCCEEDED", "FAILED", "CANCELLED") for (s,) in states)

        wait_for(all_ended, "every task to end after the last restart", 60, cluster)
        known = {str(t) for (t,) in read(cluster.db, "SELECT id FROM tasks")}
        assert acknowledged <= known
        doubled = read(
            cluster.db, "SELECT step_id, COUNT(*) FROM effects GROUP BY step_id HAVING COUNT(*) > 1"
        )
        assert doubled == []
        effects = committed(cluster.db)
        told = [(r.name, e) for r in runners for e in r.events("step reported")]
        assert told, "no runner reported anything"
        for runner, event in told:
            step_id, fence = event["step_id"], event["fence"]
            assert step_id in effects, f"{runner} was told {event['outcome']} for {step_id}"
            if event["outcome"] == "applied":
                assert effects[step_id] == fence, (runner, event)
        states = read(cluster.db, "SELECT state, COUNT(*) FROM tasks GROUP BY state")
        print(
            f"  {len(known)} tasks {dict(states)}, {len(effects)} effects, {len(told)} reports,"
            f" {mid_step} of {KILLS} kills with a step in flight"
        )
        assert mid_step > 0
        cluster.check_ledger()
    finally:
        cluster.stop_all()
