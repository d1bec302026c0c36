"""Preemption notices with real processes (issue 27): a supervisor allowing ONE attempt per
step, the stand-in model, the stand-in metadata service (examples/standin_metadata.py) and
runners, each its own OS process on 127.0.0.1.

For each source (aws, gcp, azure, file): runner-a is inside an agent step's second model call,
held by the stand-in model, when its cloud announces the reclaim. Once runner-a has logged the
notice the model's answer comes: runner-a checkpoints that turn as it stands and releases the
lease `preempted` (not left to expire), runner-b resumes from that checkpoint, and every model
turn was asked exactly once. The task succeeds though `max_attempts` is 1: the preempted
attempt was not counted. A metadata address that does not answer leaves the runner serving.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_model_apis_processes import submit
from tests.runner.test_runner_processes import Cluster, Proc, environment, free_port, wait_for

pytestmark = pytest.mark.slow

CHECKOUT = str(Path(__file__).resolve().parents[2])  # examples/ is not installed
POLL_S = "0.5"
# Turn 2 is held until the test releases it: the notice then comes while its call is in
# flight, by construction, however loaded the machine is.
SCENARIO = {
    "turns": [
        {
            "name": "first",
            "assistant_turns": 0,
            "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "A"}}],
        },
        {
            "name": "held",
            "assistant_turns": 1,
            "hold_s": 600,
            "holds": 1,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "b.txt", "content": "B"}},
                {"name": "list_files", "arguments": {"path": "."}},
            ],
        },
        {"name": "done", "assistant_turns": 2, "text": "both notes written"},
    ]
}


def start_metadata(cluster: Cluster, port: int) -> Proc:
    argv = [sys.executable, "-m", "examples.standin_metadata", "--port", str(port)]
    proc = cluster.start("metadata", argv, environment(PYTHONPATH=CHECKOUT))
    url = f"http://127.0.0.1:{port}/_admin/stats"
    wait_for(lambda: cluster._up(url, proc), "the metadata stand-in", 20, cluster)
    return proc


def submit_agent(cluster: Cluster) -> str:
    messages = [{"role": "user", "content": "Write the two notes."}]
    step = {
        "name": "notes",
        "kind": "agent",
        "payload": {"messages": messages, "allowed_commands": []},
    }
    return submit(cluster, f"agent-{cluster.sup_port}", step)


def asked_turns(cluster: Cluster) -> list[int]:
    return [a["turn_index"] for a in cluster.model_stats()["asked"]]


def metric(cluster: Cluster, name: str) -> float:
    text = cluster.scrape()
    [value] = [line.split()[-1] for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(value)


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure", "file"])
def test_a_notice_mid_model_call_hands_the_step_on_with_no_turn_asked_twice(
    cluster: Cluster, provider: str
) -> None:
    # Leases long enough that nothing on a loaded machine expires by itself: the only way
    # runner-b gets the step inside this test is runner-a's release.
    cluster.start_supervisor(
        TETHER_MAX_ATTEMPTS="1", TETHER_LEASE_TTL_S="20", TETHER_ACCEPT_WINDOW_S="10"
    )
    scenario = cluster.folder / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO))
    cluster.start_model("--scenario", str(scenario))
    notice_file = cluster.folder / "preempted"
    if provider == "file":
        where = str(notice_file)
    else:
        metadata_port = free_port()
        start_metadata(cluster, metadata_port)
        where = f"http://127.0.0.1:{metadata_port}"
    watching = {"TETHER_PREEMPTION": provider, "TETHER_PREEMPTION_URL": where}
    a = cluster.start_runner(
        "runner-a", "--concurrency", "1", TETHER_PREEMPTION_POLL_S=POLL_S, **watching
    )
    wait_for(lambda: a.events("watching for preemption notices"), "the watch", 20, cluster)
    task_id = submit_agent(cluster)
    wait_for(lambda: asked_turns(cluster) == [0, 1], "runner-a's second model call", 60, cluster)
    b = cluster.start_runner("runner-b")

    if provider == "file":
        notice_file.touch()
    else:
        announced = httpx.post(f"{where}/_admin/notice", json={"in_s": 90}, trust_env=False)
        assert announced.status_code == 200, announced.text
    [heard] = wait_for(lambda: a.events("preemption notice"), "runner-a to hear it", 30, cluster)
    assert (heard["level"], heard["provider"], heard["in_flight"]) == ("warning", provider, 1)
    if provider in ("aws", "azure"):  # a deadline the provider named, read on its clock
        assert heard["deadline"]
        assert 0 < heard["left_s"] <= 90
    else:
        assert heard["deadline"] is None
    # The answer to the call in flight arrives inside the notice's window.
    released = httpx.post(f"{cluster.model_url}/_admin/release", trust_env=False)
    assert released.json() == {"released": 1}

    wait_for(lambda: cluster.state(task_id) == "SUCCEEDED", "runner-b to finish", 60, cluster)
    attempts = cluster.attempts(task_id)
    assert [(x["runner_id"], x["state"]) for x in attempts] == [
        ("runner-a", "released"),
        ("runner-b", "committed"),
    ]
    assert attempts[0]["reason"].startswith(f"preempted: {provider} reclaims the server")
    step = cluster.task(task_id)["steps"][0]
    assert step["output"]["resumed_from"] == {"turn": 2, "fence": attempts[0]["fence"]}
    assert (step["output"]["turns"], step["output"]["finish"]) == (3, "answered")
    # Every model turn was asked exactly once: the held answer was checkpointed, not lost.
    assert Counter(asked_turns(cluster)) == {0: 1, 1: 1, 2: 1}
    assert [a["turn"] for a in cluster.model_stats()["asked"]] == ["first", "held", "done"]
    assert metric(cluster, "tether_leases_preempted_total") == 1
    # runner-a stays up, claiming nothing, until it is stopped.
    assert a.popen.poll() is None
    assert a.stop(signal.SIGTERM) == 0
    assert b.stop(signal.SIGTERM) == 0
    cluster.check_ledger()


def test_an_unreachable_metadata_address_leaves_the_runner_serving(cluster: Cluster) -> None:
    cluster.start_supervisor()
    cluster.start_model()
    port = free_port()  # nothing listens there yet
    watching = {"TETHER_PREEMPTION": "aws", "TETHER_PREEMPTION_URL": f"http://127.0.0.1:{port}"}
    a = cluster.start_runner("runner-a", TETHER_PREEMPTION_POLL_S="0.2", **watching)
    first, second = cluster.submit("one"), cluster.submit("two")
    wait_for(lambda: cluster.state(first) == "SUCCEEDED", "the first task", 30, cluster)
    wait_for(lambda: cluster.state(second) == "SUCCEEDED", "the second task", 30, cluster)
    wait_for(lambda: a.events("preemption notices cannot be read"), "the warning", 20, cluster)
    start_metadata(cluster, port)  # the address answers at last: the backoff finds it
    wait_for(lambda: a.events("preemption notices readable again"), "the recovery", 90, cluster)
    [unreadable] = a.events("preemption notices cannot be read")  # once, for every failed poll
    assert unreadable["level"] == "warning"
    third = cluster.submit("three")
    wait_for(lambda: cluster.state(third) == "SUCCEEDED", "a task after", 30, cluster)
    assert a.stop(signal.SIGTERM) == 0
