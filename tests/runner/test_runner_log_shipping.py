"""One log for both halves, kept on the owned box (issue 26, finding 3), with real processes:
the runner's lines about a step outlive the borrowed server.

runner-a is granted a chat step and SIGKILLed mid-step; its own log file is deleted (the
borrowed server is gone). runner-b finishes the step under a higher fence. `tether-supervisor
logs TASK`, read from the owned box alone (`--db`, and `--url` with `--follow`), shows both
runners' lines among the journal's events, in the order the supervisor received them. A
line sent with another runner token for runner-a's fence is refused and never shown.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import (
    POOL,
    Cluster,
    cluster,
    environment,
    program,
    wait_for,
)

__all__ = ["cluster"]  # the harness's fixture, re-exported for pytest

pytestmark = pytest.mark.slow


def logs_of(cluster: Cluster, task_id: str, *how: str) -> subprocess.CompletedProcess[str]:
    argv = [*program("tether-supervisor"), "logs", task_id, *how]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=environment()
    )


def json_entries(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    done = logs_of(cluster, task_id, "--db", str(cluster.db), "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def shipped(cluster: Cluster, task_id: str, runner_id: str) -> list[dict[str, Any]]:
    return [
        e
        for e in json_entries(cluster, task_id)
        if e["source"] == "runner" and e["runner_id"] == runner_id
    ]


def test_the_runners_lines_outlive_its_server_and_a_forged_line_is_refused(
    cluster: Cluster,
) -> None:
    sup = cluster.start_supervisor()
    cluster.start_model("--latency", "30")
    a = cluster.start_runner("runner-a")
    task_id = cluster.submit("ship my lines")
    wait_for(lambda: cluster.leased_to(task_id) == "runner-a", "a lease to runner-a", 15, cluster)
    wait_for(lambda: cluster.model_stats()["calls"] >= 1, "runner-a's model call", 10, cluster)
    # At most about a second behind: runner-a's `step leased` is on the owned box.
    wait_for(lambda: shipped(cluster, task_id, "runner-a"), "runner-a's lines", 15, cluster)
    a.popen.send_signal(signal.SIGKILL)
    a.popen.wait(10)
    a.log_path.unlink()  # the borrowed server, and its log, are gone
    cluster.knobs(latency_s=0.0)
    b = cluster.start_runner("runner-b")
    wait_for(lambda: cluster.state(task_id) == "SUCCEEDED", "the task to succeed", 20, cluster)
    assert b.stop() == 0  # a stopping runner sends its last lines first
    (first, second) = sorted(cluster.attempts(task_id), key=lambda x: x["fence"])
    assert (first["runner_id"], second["runner_id"]) == ("runner-a", "runner-b")

    # Another runner token of the same pool cannot write into runner-a's attempt.
    step_id = cluster.task(task_id)["steps"][0]["id"]
    forger = cluster.token(POOL, "runner")
    forged = {
        "step_id": step_id,
        "fence": first["fence"],
        "level": "info",
        "event": "forged: runner-a deployed to production",
    }
    answer = httpx.post(
        f"{cluster.url}/v1/logs",
        json={"lines": [forged]},
        trust_env=False,
        headers={"Authorization": f"Bearer {forger}"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"kept": 0, "refused": 1, "over_limit": 0}

    entries = json_entries(cluster, task_id)
    assert sup.stop() == 0
    assert not any("forged" in e["event"] for e in entries)
    runner_lines = [
        (e["runner_id"], e["fence"], e["event"]) for e in entries if e["source"] == "runner"
    ]
    assert ("runner-a", first["fence"], "step leased") in runner_lines
    assert ("runner-b", second["fence"], "step leased") in runner_lines
    assert ("runner-b", second["fence"], "step reported") in runner_lines
    assert {e["attempt"] for e in entries if e.get("runner_id") == "runner-a"} == {1}
    # The owned box's order: runner-a's line after its grant and before runner-b's, and
    # every entry at or after the journal's sequence number it arrived at.
    kinds = [(e["source"], e["event"], e.get("fence")) for e in entries]
    grants = [n for n, k in enumerate(kinds) if k[1] == "step_leased"]
    a_leased = kinds.index(("runner", "step leased", first["fence"]))
    b_leased = kinds.index(("runner", "step leased", second["fence"]))
    assert grants[0] < a_leased < grants[1] < b_leased
    committed = kinds.index(("journal", "step_committed", second["fence"]))
    assert kinds.index(("runner", "step reported", second["fence"])) > committed
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)
    secret = cluster.runner_token_file.read_text().strip()
    assert secret not in json.dumps(entries)
    assert "ship my lines" not in json.dumps(entries)  # the payload's text


def test_logs_through_the_api_follows_to_the_end_and_names_each_half(cluster: Cluster) -> None:
    cluster.start_supervisor()
    cluster.start_model()
    runner = cluster.start_runner("runner-a")
    task_id = cluster.submit("follow the log")
    token_file = cluster.folder / "operator-token"
    token_file.write_text(cluster.operator_token + "\n")
    done = logs_of(
        cluster, task_id, "--url", cluster.url, "--token-file", str(token_file), "--follow"
    )
    assert done.returncode == 0, done.stderr  # SUCCEEDED, as `task watch` says it
    assert runner.stop() == 0
    lines = done.stdout.splitlines()
    assert any("  supervisor  " in line and "step_committed" in line for line in lines)
    assert any("  runner-a  " in line and "step reported" in line for line in lines)
    wrong = logs_of(cluster, task_id, "--db", str(cluster.db), "--url", cluster.url)
    assert wrong.returncode == 2
    assert "not both" in wrong.stderr
    missing = logs_of(cluster, "no-such-task", "--db", str(cluster.db))
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1
