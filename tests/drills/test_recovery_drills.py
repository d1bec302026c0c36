"""Recovery drills (docs/design.md, Recovery drills): model provider outage, missing secret,
exhausted quota, corrupted
state, each with real processes (the harness of `test_runner_processes`).

Each drill breaks something, checks what the operator sees and that nothing is burned or lost,
takes the operator's action, and measures on `time.monotonic()` the seconds from that action
to recovery. Each records one row `{drill, symptom, operator_action, seconds_to_recover}`:
printed (`pytest -s` shows it) and, when `TETHER_DRILLS_REPORT` names a file, appended to it
as a JSON line:

    TETHER_DRILLS_REPORT=/tmp/drills.jsonl \
        .venv/bin/python -m pytest -q tests/drills/test_recovery_drills.py

The figure is reported, not asserted (machines are shared and noisy: docs/how-to/recover.md
keeps a measured run). What each drill asserts is that recovery came, without a burned
attempt, a second effect or a reused fence, before a hang guard: the longest wait the recovery
may have to sit out by configuration (a backoff or a pause in progress), plus `MARGIN_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import (
    PAUSE_INITIAL_S,
    TTL_S,
    Cluster,
    cluster,
    environment,
    one_effect,
    program,
    wait_for,
)
from tether.runner import daemon
from tether.runner.models import client as model_client

__all__ = ["cluster"]  # the harness's fixture, re-exported for pytest

pytestmark = pytest.mark.slow

# Beyond the wait a recovery sits out by configuration: what starting processes and one step
# may take on a loaded 2-core machine (under a second each, quiet). A hang guard, not a figure.
MARGIN_S = 30.0
PAUSE_MAX_S = 0.5  # the quota drill's runner: each pause as long as the first
MAX_ATTEMPTS = 5  # the supervisor's default `max_attempts`; the harness does not change it
REPORT_ENV = "TETHER_DRILLS_REPORT"

ROWS: list[dict[str, Any]] = []


@pytest.fixture(scope="module", autouse=True)
def drills_report() -> Iterator[list[dict[str, Any]]]:
    """Append this module's rows to `$TETHER_DRILLS_REPORT` (JSON lines) once the drills ran."""
    yield ROWS
    target = os.environ.get(REPORT_ENV)
    if target and ROWS:
        with Path(target).open("a", encoding="utf-8") as out:
            out.writelines(json.dumps(row, sort_keys=True) + "\n" for row in ROWS)


def record(drill: str, symptom: str, action: str, seconds: float, **extra: Any) -> None:
    row = {
        "drill": drill,
        "symptom": symptom,
        "operator_action": action,
        "seconds_to_recover": round(seconds, 3),
        **extra,
    }
    ROWS.append(row)
    print(f"\nrecovery drill: {json.dumps(row, sort_keys=True)}")


# ---- reading the ledger ---------------------------------------------------------------------


def ledger_rows(cluster: Cluster, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{cluster.db}?mode=ro", uri=True)) as db:
        return [tuple(r) for r in db.execute(sql, params).fetchall()]


def burned(cluster: Cluster, task_id: str) -> int:
    """Attempts counted toward `max_attempts` (expiry, retryable failure) for the task's step."""
    ((count,),) = ledger_rows(cluster, "SELECT burned FROM steps WHERE task_id = ?", task_id)
    return int(count)


def requeues(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    """The `data` of each `step_requeued` event in the task's journal."""
    answer = cluster.http.get(f"/v1/tasks/{task_id}/events", params={"after": 0})
    assert answer.status_code == 200, answer.text
    return [e["data"] for e in answer.json()["events"] if e["kind"] == "step_requeued"]


def released(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    return [x for x in cluster.attempts(task_id) if x["state"] == "released"]


def step_id_of(cluster: Cluster, task_id: str) -> str:
    step_id: str = cluster.task(task_id)["steps"][0]["id"]
    return step_id


def succeeded(cluster: Cluster, task_id: str) -> bool:
    state = cluster.state(task_id)
    assert state != "FAILED", cluster.task(task_id)
    return state == "SUCCEEDED"


def settled_without_burning(cluster: Cluster, task_id: str) -> dict[str, Any]:
    """The same step id committed once, after operator releases only; answers the commit."""
    attempts = cluster.attempts(task_id)
    *earlier, last = attempts
    assert last["state"] == "committed", attempts
    assert all(x["state"] == "released" for x in earlier), attempts
    assert all(x["reason"].startswith("operator") for x in earlier), attempts
    assert [x["attempt"] for x in attempts] == list(range(1, len(attempts) + 1))
    assert burned(cluster, task_id) == 0
    assert all(not r["counted"] for r in requeues(cluster, task_id))
    assert one_effect(cluster, task_id) == (step_id_of(cluster, task_id), last["fence"])
    return last


def ready(cluster: Cluster) -> bool:
    try:
        return httpx.get(f"{cluster.url}/readyz", timeout=1, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def supervisor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*program("tether-supervisor"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=environment(),
    )


# ---- the drills -----------------------------------------------------------------------------


def test_drill_model_provider_outage_the_step_waits_and_completes_once(
    cluster: Cluster,
) -> None:
    cluster.start_supervisor()
    model = cluster.start_model("--fail-500", "1000000")
    a = cluster.start_runner("runner-a")
    task_id = cluster.submit("during a provider outage")
    wait_for(
        lambda: cluster.model_stats()["by_status"].get("500", 0) >= 2,
        "the provider's 500s",
        15,
        cluster,
    )
    (leased,) = cluster.attempts(task_id)
    assert leased["state"] == "leased"
    answered_500 = cluster.model_stats()["by_status"]["500"]
    # The provider goes away altogether, for longer than a lease: the step must hold on.
    lines_before = len(a.lines())
    assert model.stop(signal.SIGKILL) == -signal.SIGKILL
    outage_started = time.monotonic()
    time.sleep(TTL_S + 1.0)
    assert cluster.state(task_id) == "RUNNING"
    assert cluster.attempts(task_id) == [leased]  # same attempt, same fence, still leased
    assert not a.events("releasing the step")
    said = [str(e["event"]) for e in a.lines()[lines_before:] if e.get("level") != "debug"]
    symptom = (
        f"provider answered 500 x{answered_500}, then refused connections for"
        f" {time.monotonic() - outage_started:.1f}s; task RUNNING on attempt 1 (fence"
        f" {leased['fence']}), lease renewed; runner log lines during the outage: {said}"
    )

    started = time.monotonic()  # the provider comes back on the same address
    cluster.start_model(name="model-back")
    # The runner tries the provider again when its model backoff in progress ends.
    guard = model_client.BACKOFF_MAX_S + MARGIN_S
    wait_for(lambda: succeeded(cluster, task_id), "the same step to finish", guard, cluster)
    seconds = time.monotonic() - started

    (committed,) = cluster.attempts(task_id)
    assert committed["state"] == "committed"
    assert committed["fence"] == leased["fence"]
    assert one_effect(cluster, task_id) == (step_id_of(cluster, task_id), leased["fence"])
    assert burned(cluster, task_id) == 0
    assert cluster.model_stats()["by_status"] == {"200": 1}
    record(
        "model provider outage",
        symptom,
        "none on tether's side: the provider came back (stand-in restarted on the same port);"
        " no runner restart, no resubmission",
        seconds,
        conditions=f"outage of {TTL_S + 1.0:g} s (longer than the {TTL_S:g} s lease); recovery"
        f" waits out the runner's model backoff (random exponential, up to"
        f" {model_client.BACKOFF_MAX_S:g} s)",
    )
    assert a.stop() == 0
    cluster.check_ledger()


def test_drill_missing_secret_releases_without_burning_until_the_key_is_installed(
    cluster: Cluster,
) -> None:
    cluster.start_supervisor()
    cluster.start_model("--key", "sk-drill-key")
    key_file = cluster.folder / "credentials" / "model-key"
    a = cluster.start_runner("runner-a", "--model-key-file", str(key_file))
    (warned,) = a.events("model key missing")  # one line, at start
    assert str(key_file) in warned["event"]
    assert warned["operator_action"] == f"put the model API key in {key_file}"
    assert warned["level"] == "warning"

    task_id = cluster.submit("needs the missing key")
    paused = wait_for(lambda: a.events("claiming paused"), "the pause", 15, cluster)
    assert "model key missing" in paused[0]["event"]
    assert f"Operator action: put the model API key in {key_file}" in paused[0]["event"]
    first = wait_for(lambda: released(cluster, task_id), "the operator release", 10, cluster)
    assert first[0]["reason"].startswith("operator")
    assert cluster.state(task_id) in ("QUEUED", "RUNNING")
    assert burned(cluster, task_id) == 0
    assert cluster.model_stats()["calls"] == 0  # no call to the provider without a key

    # The runner looks again when the pause in progress ends; each pause doubles the last,
    # so with n releases so far it is at most PAUSE_INITIAL_S * 2**n (one more for a release
    # on its way).
    pause_s = PAUSE_INITIAL_S * 2 ** (len(released(cluster, task_id)) + 1)
    started = time.monotonic()  # the operator installs the key (atomically, mode 0600)
    key_file.parent.mkdir(mode=0o700)
    staged = key_file.with_name(".model-key.new")
    staged.write_text("sk-drill-key\n")
    staged.chmod(0o600)
    staged.replace(key_file)
    guard = pause_s + MARGIN_S
    wait_for(lambda: succeeded(cluster, task_id), "the same step to finish", guard, cluster)
    seconds = time.monotonic() - started

    committed = settled_without_burning(cluster, task_id)
    assert committed["fence"] > first[0]["fence"]
    assert cluster.model_stats()["by_status"] == {"200": 1}
    log_text = a.log_path.read_text()
    assert "sk-drill-key" not in log_text
    record(
        "missing secret",
        f"runner at start: {warned['event']}; per step: {paused[0]['event']}",
        f"install the model key file {key_file.name} (mode 0600); no runner restart",
        seconds,
        releases_before_fix=len(released(cluster, task_id)),
        conditions="runner pause_initial_s 0.5 (harness), pause_max_s 300; fixed after the"
        " first release: recovery waits out the pause in progress",
    )
    assert a.stop() == 0
    cluster.check_ledger()


def test_drill_exhausted_quota_pauses_without_burning_until_the_quota_is_raised(
    cluster: Cluster,
) -> None:
    cluster.start_supervisor()
    cluster.start_model("--quota-exhausted")
    # Pauses capped at their first length, so that the step goes round more often than
    # `max_attempts` would allow if these releases were counted.
    a = cluster.start_runner("runner-a", TETHER_PAUSE_MAX_S=str(PAUSE_MAX_S))
    task_id = cluster.submit("over quota")
    wait_for(
        lambda: len(released(cluster, task_id)) > MAX_ATTEMPTS,
        f"more than {MAX_ATTEMPTS} operator releases",
        25,
        cluster,
    )
    paused = a.events("claiming paused")
    assert "quota exhausted" in paused[0]["event"]
    assert paused[0]["operator_action"].startswith("raise the provider quota")
    assert cluster.state(task_id) in ("QUEUED", "RUNNING")
    assert burned(cluster, task_id) == 0

    started = time.monotonic()  # the operator raises the quota
    cluster.knobs(quota_exhausted=False)
    guard = PAUSE_MAX_S + MARGIN_S  # the runner looks again when the pause in progress ends
    wait_for(lambda: succeeded(cluster, task_id), "the same step to finish", guard, cluster)
    seconds = time.monotonic() - started

    settled_without_burning(cluster, task_id)
    releases = released(cluster, task_id)
    assert len(releases) > MAX_ATTEMPTS
    # One call per attempt: `insufficient_quota` is never retried within a step.
    assert cluster.model_stats()["by_status"] == {"429": len(releases), "200": 1}
    assert len(requeues(cluster, task_id)) == len(releases)
    record(
        "exhausted quota",
        paused[0]["event"],
        "raise the provider quota (stand-in knob quota_exhausted=false); no runner restart",
        seconds,
        releases_before_fix=len(releases),
        conditions="runner pause_initial_s = pause_max_s = 0.5: recovery waits out the pause"
        " in progress, which doubles up to pause_max_s (300 s by default)",
    )
    assert a.stop() == 0
    cluster.check_ledger()


def damage_a_page(db: Path, table: str) -> int:
    """Overwrite the root page of `table` with garbage; answers the page number."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        ((page_size,),) = conn.execute("PRAGMA page_size").fetchall()
        ((page_count,),) = conn.execute("PRAGMA page_count").fetchall()
        ((root,),) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchall()
    assert 1 < root < page_count, (root, page_count)  # a page in the middle, not the header
    garbage = (b"\xde\xad\xbe\xef" * (page_size // 4 + 1))[:page_size]
    with db.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(garbage)
        f.flush()
        os.fsync(f.fileno())
    return int(root)


def test_drill_corrupted_ledger_is_refused_and_a_restored_backup_serves(
    cluster: Cluster,
) -> None:
    sup = cluster.start_supervisor()
    cluster.start_model()
    a = cluster.start_runner("runner-a")
    kept = cluster.submit("before the backup")
    wait_for(lambda: succeeded(cluster, kept), "the first task", 20, cluster)
    kept_effect = one_effect(cluster, kept)
    backup = cluster.folder / "backups" / "ledger-backup.db"
    backup.parent.mkdir()
    made = supervisor("backup", "--db", str(cluster.db), str(backup))
    assert made.returncode == 0, made.stdout + made.stderr
    lost = cluster.submit("after the backup")
    wait_for(lambda: succeeded(cluster, lost), "the second task", 20, cluster)
    (_, lost_fence) = one_effect(cluster, lost)

    assert sup.stop(signal.SIGTERM) == 0
    cluster.procs.remove(sup)
    for leftover in ("-wal", "-shm"):  # a clean stop checkpoints the WAL into the file
        assert not Path(f"{cluster.db}{leftover}").exists(), leftover
    page = damage_a_page(cluster.db, "effects")

    checked = supervisor("check", "--db", str(cluster.db))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    serve = [*program("tether-supervisor"), "serve", "--db", str(cluster.db)]
    serve += ["--host", "127.0.0.1", "--port", str(cluster.sup_port)]
    refused = subprocess.run(
        serve, capture_output=True, text=True, timeout=30, check=False, env=environment()
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    (symptom,) = refused.stderr.strip().splitlines()
    assert symptom.startswith("tether-supervisor: error: ledger ")
    assert str(cluster.db) in symptom
    assert "refused" in symptom
    assert not ready(cluster)

    started = time.monotonic()  # restore the backup (keeping it), then start the supervisor
    for leftover in ("-wal", "-shm"):
        Path(f"{cluster.db}{leftover}").unlink(missing_ok=True)
    shutil.copyfile(backup, cluster.db)
    cluster.start_supervisor()
    wait_for(lambda: ready(cluster), "/readyz", MARGIN_S, cluster)
    ready_s = time.monotonic() - started
    fresh = cluster.submit("after the restore")
    # The runner, which kept trying the supervisor through the outage, asks again when its
    # backoff in progress ends: at most the runner's backoff cap after the restart.
    guard = daemon.BACKOFF_MAX_S + MARGIN_S
    wait_for(lambda: succeeded(cluster, fresh), "a new task on the restored ledger", guard, cluster)
    seconds = time.monotonic() - started

    cluster.check_ledger()
    assert cluster.state(kept) == "SUCCEEDED"
    assert one_effect(cluster, kept) == kept_effect
    gone = cluster.http.get(f"/v1/tasks/{lost}")  # the backup forgot what came after it
    assert gone.status_code == 404, gone.text
    (committed,) = cluster.attempts(fresh)
    assert committed["runner_id"] == "runner-a"  # the runner rode out the outage
    assert committed["fence"] > lost_fence  # no fence handed out twice
    assert one_effect(cluster, fresh) == (step_id_of(cluster, fresh), committed["fence"])
    record(
        "corrupted state",
        f"serve exit {refused.returncode}: {symptom}",
        f"stop; delete ledger -wal/-shm; copy the `tether-supervisor backup` copy over the"
        f" ledger (page {page}, the effects table's root, was garbage); start the supervisor",
        seconds,
        seconds_to_ready=round(ready_s, 3),
        conditions="the runner rides out the outage: recovery waits out its backoff in progress"
        f" (random exponential, up to {daemon.BACKOFF_MAX_S:g} s)",
    )
    assert a.stop() == 0
