"""One step's whole story, followed by its `task_id` across the supervisor's and the runners'
JSON logs, with real processes (issue 16, finding 1: the supervisor logged no step activity,
so a step could not be followed across the two logs; finding 10: the README's jq filter
aborted on the first line that was not JSON).

The step is granted to runner-a, runner-a is SIGKILLed mid-step, its lease expires on the
supervisor's clock, the step is granted again to runner-b under a higher fence and committed.
The logs are read as a user reads them: line by line, skipping what is not JSON; and, when jq
is installed, through the recipe of docs/how-to/follow-a-step.md.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.runner.test_runner_processes import Cluster, cluster, wait_for

__all__ = ["cluster"]  # the harness's fixture, re-exported for pytest

pytestmark = pytest.mark.slow

RECIPE = "fromjson? | select(.task_id == $t)"  # docs/how-to/follow-a-step.md


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of `path` that is a JSON object; anything else (a traceback, a warning
    printed by a library) is skipped, as `jq -R 'fromjson?'` skips it."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


def about(path: Path, task_id: str) -> list[dict[str, Any]]:
    return [e for e in json_lines(path) if e.get("task_id") == task_id]


def test_one_steps_grant_expiry_replay_and_commit_read_from_both_logs(cluster: Cluster) -> None:
    sup = cluster.start_supervisor()
    cluster.start_model("--latency", "30")
    a = cluster.start_runner("runner-a")
    task_id = cluster.submit("follow me")
    wait_for(lambda: cluster.leased_to(task_id) == "runner-a", "a lease to runner-a", 15, cluster)
    wait_for(lambda: cluster.model_stats()["calls"] >= 1, "runner-a's model call", 10, cluster)
    cluster.knobs(latency_s=0.0)
    b = cluster.start_runner("runner-b")
    a.popen.send_signal(signal.SIGKILL)
    a.popen.wait(10)
    wait_for(lambda: cluster.state(task_id) == "SUCCEEDED", "the task to succeed", 20, cluster)
    step_id = cluster.task(task_id)["steps"][0]["id"]
    assert b.stop() == 0
    assert sup.stop() == 0

    story = about(sup.log_path, task_id)
    decisions = [e["event"] for e in story]
    assert decisions == [
        "task created",
        "task approved",
        "step granted",
        "lease expired",
        "step requeued",
        "step granted",
        "step committed",
        "task verified",
    ], story
    _, _, first, expired, requeued, second, committed, _ = story
    assert first["step_id"] == step_id
    token_id = first["token_id"]
    assert token_id  # the runners' token, by id; the secret is in no line
    assert (first["runner_id"], first["attempt"]) == ("runner-a", 1)
    for line in (expired, requeued):
        assert (line["step_id"], line["fence"], line["runner_id"]) == (
            step_id,
            first["fence"],
            "runner-a",
        )
    assert expired["level"] == "warning"
    assert (second["runner_id"], second["attempt"], second["step_id"]) == ("runner-b", 2, step_id)
    assert second["fence"] > first["fence"]
    assert (committed["runner_id"], committed["fence"]) == ("runner-b", second["fence"])
    for line in (first, second, committed):
        assert (line["token_id"], line["tenant"], line["pool"]) == (token_id, "acme", "default")
    secret = cluster.runner_token_file.read_text().strip()
    assert secret not in sup.log_path.read_text()
    assert "follow me" not in sup.log_path.read_text()  # the payload's text

    # The runners' side of the same story, by the same task_id and fences.
    a_fences = {e.get("fence") for e in about(a.log_path, task_id)}
    b_fences = {e.get("fence") for e in about(b.log_path, task_id)}
    assert first["fence"] in a_fences
    assert second["fence"] in b_fences
    assert first["fence"] not in b_fences

    # The documented recipe gives the same lines, and a line that is not JSON does not stop it.
    jq = shutil.which("jq")
    if jq is None:
        return
    noisy = cluster.folder / "noisy-supervisor.log"
    noisy.write_text("Traceback (most recent call last): not JSON\n" + sup.log_path.read_text())
    done = subprocess.run(
        [jq, "-cR", "--arg", "t", task_id, RECIPE, str(noisy), str(a.log_path), str(b.log_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    followed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["event"] for e in followed[: len(story)]] == decisions
    assert len(followed) == len(story) + len(about(a.log_path, task_id)) + len(
        about(b.log_path, task_id)
    )
