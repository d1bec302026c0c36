"""Real processes (docs/design.md, Effects): SIGKILL `tether-supervisor serve` at least 20 times
while it delivers `http` effects to a receiver process (`python -m examples.receiver`), and
restart it on the same ledger file each time (`TETHER_EFFECT_KILLS` asks for more,
`TETHER_EFFECT_KILL_SEED` replays one run's moments).

The receiver applies a delivery, then waits `RECEIVER_DELAY_S` before answering, and each kill
comes within that wait after a delivery arrived: between the send and the record. Keyed tasks
hold two chained keyed effects; an unkeyed task holds a keyed effect, an unkeyed one
(`"keyed": false`, its gate opened through the API for the digest of the request shown) and a
keyed one after it. A round that opened a gate kills once that very request reached the receiver
or, half the time, once the ledger holds its attempt begun (the send may not have left yet), so
some unkeyed effects always end `uncertain`, some sent and some not.

At the end, by the receiver's own counts (`GET /counts`): every keyed effect was applied
exactly once (some were sent again after a kill and answered as replays), and no unkeyed effect
was sent more than once. Each `uncertain` effect is shown so, and resolved the way an operator
would (one `yes` and one `no` through the CLI: `task show`, `task gate --happened`, `task gate`
for the digest and `--open --digest`; the rest through the API behind it): `yes` when the
receiver has it, else `no` and the gate opened again. Every task then succeeds, and
`tether-supervisor check` passes. The figures are printed (`pytest -s`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import (
    POOL,
    Cluster,
    Proc,
    environment,
    free_port,
    program,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KILLS = int(os.environ.get("TETHER_EFFECT_KILLS", "20"))
SEED = int(os.environ.get("TETHER_EFFECT_KILL_SEED", str(random.SystemRandom().randrange(10**6))))
HOLD_S = 2.0  # effect_hold_s: a killed supervisor's effects are taken again this long after
RECEIVER_DELAY_S = 0.4  # the receiver applies, then waits this long before it answers
ARRIVAL_WAIT_S = 4.0  # how long a round waits for a delivery to arrive before it kills anyway
CHECKOUT = Path(__file__).resolve().parents[3]  # examples/ is not installed


class Receiver:
    """The receiver process and its own account of what it received."""

    def __init__(self, cluster: Cluster) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "examples.receiver", "--port", str(self.port)]
        argv += ["--state", str(cluster.folder / "receiver.db")]
        argv += ["--delay-s", str(RECEIVER_DELAY_S)]
        self.proc = cluster.start("receiver", argv, environment(PYTHONPATH=str(CHECKOUT)))
        wait_for(lambda: cluster._up(f"{self.url}/counts", self.proc), "the receiver", 20, cluster)

    def counts(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/counts", timeout=5, trust_env=False)
        assert answer.status_code == 200, answer.text
        counts: dict[str, Any] = answer.json()
        return counts


def start_supervisor(cluster: Cluster, life: int, receiver: Receiver) -> Proc:
    argv = [*program("tether-supervisor"), "serve", "--db", str(cluster.db)]
    argv += ["--host", "127.0.0.1", "--port", str(cluster.sup_port)]
    env = environment(
        TETHER_EFFECT_HOLD_S=str(HOLD_S),
        TETHER_EFFECT_ALLOWED_HOSTS=f"127.0.0.1:{receiver.port}",  # our receiver, named
    )
    proc = cluster.start(f"supervisor-{life}", argv, env)
    wait_for(lambda: cluster._up(f"{cluster.url}/healthz", proc), "the supervisor", 30, cluster)
    return proc


def read(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
        return conn.execute(sql, params).fetchall()


def keyed_plan(receiver: str, n: int) -> dict[str, Any]:
    """Two keyed effects, the second's body taking the first's answer."""
    return {
        "steps": [
            {
                "name": "build",
                "kind": "http",
                "payload": {"url": f"{receiver}/build/{n}", "body": {"task": n}},
            },
            {
                "name": "deploy",
                "kind": "http",
                "payload": {
                    "url": f"{receiver}/deploy/{n}",
                    "body": {"task": n, "build": "{{ steps.build.output.status }}"},
                },
            },
        ]
    }


def unkeyed_plan(receiver: str, n: int) -> dict[str, Any]:
    """A keyed effect, an unkeyed one behind its gate, and a keyed one after it."""
    return {
        "steps": [
            {"name": "prepare", "kind": "http", "payload": {"url": f"{receiver}/prepare/{n}"}},
            {
                "name": "charge",
                "kind": "http",
                "payload": {
                    "url": f"{receiver}/charge/{n}",
                    "body": {"amount": 82000, "task": n},
                    "keyed": False,
                },
            },
            {"name": "notify", "kind": "http", "payload": {"url": f"{receiver}/notify/{n}"}},
        ]
    }


def submit(cluster: Cluster, plan: dict[str, Any], key: str) -> str:
    body = {"idempotency_key": f"{key}-{SEED}", "plan": plan, "pool": POOL}
    created = cluster.http.post("/v1/tasks", json=body)
    assert created.status_code == 201, created.text
    task: dict[str, Any] = created.json()
    approval = {"plan_hash": task["plan_hash"], "base_sha": None}
    approved = cluster.http.post(f"/v1/tasks/{task['id']}/approve", json=approval)
    assert approved.status_code == 200, approved.text
    task_id: str = task["id"]
    return task_id


def gated(db: Path) -> list[tuple[str, str]]:
    """(task id, step name) of every effect waiting behind its gate."""
    rows = read(
        db,
        "SELECT o.task_id, s.name FROM outbox o JOIN steps s ON s.id = o.step_id"
        " WHERE o.state = 'gated'",
    )
    return [(str(t), str(s)) for t, s in rows]


def effect_view(cluster: Cluster, task_id: str, step: str) -> dict[str, Any]:
    view = cluster.task(task_id)
    effect: dict[str, Any] = next(s for s in view["steps"] if s["name"] == step)["effect"]
    return effect


def open_gates(cluster: Cluster) -> list[str]:
    """Open every gated effect's gate through the API, for the digest of the request the task
    view shows (an operator who read it); the keys of the effects opened."""
    keys = []
    for task_id, step in gated(cluster.db):
        effect = effect_view(cluster, task_id, step)
        assert effect["request"]["body"]["amount"] == 82000
        answer = cluster.http.post(
            f"/v1/tasks/{task_id}/steps/{step}/gate", json={"digest": effect["digest"]}
        )
        assert answer.status_code == 200, answer.text
        keys.append(str(effect["key"]))
    return keys


def begun_unrecorded(db: Path, keys: list[str] | None = None) -> bool:
    """Whether a delivery attempt (of one of `keys`, if given) was begun and never answered:
    after a kill, one cut between send and record."""
    sql = (
        "SELECT COUNT(*) FROM deliveries d JOIN outbox o ON o.step_id = d.step_id"
        " WHERE d.answer IS NULL AND d.ended_at IS NULL"
    )
    if keys is not None:
        sql += f" AND o.effect_key IN ({', '.join('?' for _ in keys)})"
    return bool(read(db, sql, tuple(keys or ()))[0][0])


def moment_to_kill(cluster: Cluster, receiver: Receiver, rng: random.Random) -> None:
    """Wait for a moment between a send and its record (bounded by `ARRIVAL_WAIT_S`).

    A round that opened gates waits for one of those effects: half the time (at random) until
    the ledger holds its attempt begun (the send may not have left yet: the operator finds out
    from the receiver), else until the receiver has it. Other rounds wait for any new delivery
    at the receiver, then a random part of its wait before it answers."""
    requests_before = int(receiver.counts()["requests"])
    opened = open_gates(cluster)
    end = time.monotonic() + ARRIVAL_WAIT_S
    if opened and rng.random() < 0.5:
        while time.monotonic() < end and not begun_unrecorded(cluster.db, opened):
            time.sleep(0.002)
        return
    while time.monotonic() < end:
        counts = receiver.counts()
        if opened and any(counts["by_key"].get(k, 0) for k in opened):
            return
        if not opened and int(counts["requests"]) > requests_before:
            time.sleep(rng.uniform(0.0, RECEIVER_DELAY_S * 0.6))
            return
        time.sleep(0.01)


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*program("tether-supervisor"), "task", *args, "--url", cluster.url]
    argv += ["--token-file", str(cluster.folder / "operator-token")]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=environment()
    )


def resolve_by_cli(cluster: Cluster, task_id: str, happened: bool) -> None:
    """What an operator does with an uncertain effect: `task show` it, say whether it
    happened, and after a `no` open the gate again for the digest `task gate` shows."""
    shown = cli(cluster, "show", task_id)
    assert shown.returncode == 0, shown.stderr
    step = next(s for s in json.loads(shown.stdout)["steps"] if s["name"] == "charge")
    assert step["effect"]["state"] == "uncertain", step
    assert "effect 'charge' may have been sent" in shown.stderr, shown.stderr
    said = cli(cluster, "gate", task_id, "charge", "--happened", "yes" if happened else "no")
    assert said.returncode == 0, said.stderr
    if happened:
        assert "is delivered" in said.stdout, said.stdout
        return
    assert "is gated" in said.stdout, said.stdout
    gate = cli(cluster, "gate", task_id, "charge")
    assert gate.returncode == 0, gate.stderr
    digest = re.search(r"^digest (\S+)$", gate.stdout, re.MULTILINE)
    assert digest is not None, gate.stdout
    opened = cli(cluster, "gate", task_id, "charge", "--open", "--digest", digest.group(1))
    assert opened.returncode == 0, opened.stderr


def resolve_by_api(cluster: Cluster, task_id: str, happened: bool) -> None:
    """The same through the API the CLI calls (quicker than a process per command)."""
    view = cluster.task(task_id)
    assert view["waiting_for"]["reason"] == "uncertain", view["waiting_for"]
    assert view["waiting_for"]["step"] == "charge", view["waiting_for"]
    assert effect_view(cluster, task_id, "charge")["state"] == "uncertain"
    said = cluster.http.post(
        f"/v1/tasks/{task_id}/steps/charge/happened", json={"happened": happened}
    )
    assert said.status_code == 200, said.text
    if not happened:
        assert open_gates(cluster), "the gate did not close again after a `no`"


def resolve_all(cluster: Cluster, receiver: Receiver) -> tuple[int, int]:
    """Resolve every uncertain effect as the receiver's record says: one `yes` and one `no`
    through the CLI (each a process of its own, run side by side), the rest through the API.
    Returns (said yes, said no)."""
    uncertain = read(cluster.db, "SELECT task_id, effect_key FROM outbox WHERE state = 'uncertain'")
    by_key = receiver.counts()["by_key"]
    words = [(str(task_id), key in by_key) for task_id, key in uncertain]
    first_yes = next((w for w in words if w[1]), None)
    first_no = next((w for w in words if not w[1]), None)
    by_cli = [w for w in (first_yes, first_no) if w is not None]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda w: resolve_by_cli(cluster, *w), by_cli))
    for task_id, happened in words:
        if (task_id, happened) not in by_cli:
            resolve_by_api(cluster, task_id, happened)
    yes = sum(1 for _, happened in words if happened)
    return yes, len(words) - yes


def test_sigkill_the_supervisor_mid_delivery_applies_each_effect_once(tmp_path: Path) -> None:
    print(f"effects kill test: {KILLS} kills, seed {SEED}")
    started = time.monotonic()
    rng = random.Random(SEED)
    cluster = Cluster(tmp_path)
    (tmp_path / "operator-token").write_text(cluster.operator_token + "\n")
    try:
        receiver = Receiver(cluster)
        supervisor = start_supervisor(cluster, 0, receiver)
        keyed_tasks: list[str] = []
        unkeyed_tasks: list[str] = []
        cut = 0  # kills that left an attempt begun and unrecorded
        for kill in range(1, KILLS + 1):
            for j in range(rng.randint(1, 2)):
                keyed_tasks.append(submit(cluster, keyed_plan(receiver.url, kill), f"k{kill}-{j}"))
            if kill % 2:
                unkeyed_tasks.append(submit(cluster, unkeyed_plan(receiver.url, kill), f"u{kill}"))
            moment_to_kill(cluster, receiver, rng)
            supervisor.popen.kill()
            supervisor.popen.wait(10)
            cut += begun_unrecorded(cluster.db)
            assert read(cluster.db, "PRAGMA integrity_check") == [("ok",)], f"kill {kill}"
            supervisor = start_supervisor(cluster, kill, receiver)
        killing = time.monotonic() - started

        def settled() -> bool:
            open_gates(cluster)
            states = read(cluster.db, "SELECT DISTINCT state FROM outbox")
            return {str(state) for (state,) in states} <= {"delivered", "uncertain"}

        wait_for(settled, "every effect delivered or uncertain", 60, cluster)
        uncertain = read(cluster.db, "SELECT task_id FROM outbox WHERE state = 'uncertain'")
        assert uncertain, "no kill left an unkeyed effect uncertain"
        assert {str(t) for (t,) in uncertain} <= set(unkeyed_tasks)
        settling = time.monotonic() - started - killing
        yes, no = resolve_all(cluster, receiver)
        every = keyed_tasks + unkeyed_tasks

        def all_succeeded() -> bool:
            states = read(cluster.db, "SELECT state FROM tasks")
            return len(states) == len(every) and all(s == "SUCCEEDED" for (s,) in states)

        wait_for(all_succeeded, "every task to succeed after the operator's word", 60, cluster)

        effects = read(cluster.db, "SELECT effect_key, keyed FROM outbox")
        keyed = [str(k) for k, flag in effects if flag]
        unkeyed = [str(k) for k, flag in effects if not flag]
        assert len(keyed) == 2 * len(keyed_tasks) + 2 * len(unkeyed_tasks)
        assert len(unkeyed) == len(unkeyed_tasks)
        counts = receiver.counts()
        by_key = counts["by_key"]
        # The receiver applies a key at most once by construction: as many applied as keys
        # seen means each effect was applied exactly once, however often it was sent.
        assert set(by_key) == set(keyed) | set(unkeyed)
        assert counts["applied"] == len(keyed) + len(unkeyed)
        assert counts["unkeyed"] == 0
        assert counts["failed"] == 0
        sent_again = sum(by_key[k] for k in keyed) - len(keyed)
        assert counts["replayed"] == sent_again
        assert sent_again > 0, "no keyed effect was sent again after a kill"
        assert all(by_key[k] == 1 for k in unkeyed), {k: by_key[k] for k in unkeyed}
        doubled = read(
            cluster.db, "SELECT step_id FROM effects GROUP BY step_id HAVING COUNT(*) > 1"
        )
        assert doubled == []
        assert cut > 0
        cluster.check_ledger()
        print(
            f"  {len(every)} tasks SUCCEEDED; {len(keyed)} keyed effects applied once each"
            f" ({sent_again} sends again, answered as replays); {len(unkeyed)} unkeyed effects"
            f" sent once each; {len(uncertain)} uncertain, resolved {yes} yes and {no} no;"
            f" {cut} of {KILLS} kills between a send and its record; kill loop {killing:.1f} s,"
            f" settling {settling:.1f} s, total {time.monotonic() - started:.1f} s"
        )
    finally:
        cluster.stop_all()
