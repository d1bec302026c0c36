"""Each model API with real processes (issue 27): the supervisor, the stand-in model (its strict
Responses and Anthropic routes) and a runner started with `--model-api`, each its own OS
process; a `chat` task and an agent task with a tool loop both succeed, every model request
came by the chosen API and carried the model key the way that API wants it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runner.test_runner_processes import POOL, Cluster, wait_for

pytestmark = pytest.mark.slow

KEY = "sk-process-model-key-77aa"
SCENARIO = {
    "turns": [
        {
            "name": "look",
            "assistant_turns": 0,
            "last_contains": "write notes",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "notes.txt", "content": "hi"}}
            ],
        },
        {
            "name": "check",
            "assistant_turns": 1,
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
        },
        {"name": "answer", "assistant_turns": 2, "text": "notes.txt says hi"},
    ]
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


def submit(cluster: Cluster, key: str, step: dict[str, Any]) -> str:
    body = {"idempotency_key": f"{key}-{os.getpid()}", "plan": {"steps": [step]}, "pool": POOL}
    task = cluster.http.post("/v1/tasks", json=body)
    assert task.status_code == 201, task.text
    approved = cluster.http.post(
        f"/v1/tasks/{task.json()['id']}/approve",
        json={"plan_hash": task.json()["plan_hash"], "base_sha": None},
    )
    assert approved.status_code == 200, approved.text
    task_id: str = task.json()["id"]
    return task_id


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_a_runner_process_runs_a_chat_step_and_an_agent_loop_under_each_api(
    cluster: Cluster, tmp_path: Path, api: str
) -> None:
    key_file = tmp_path / "model-key"
    key_file.write_text(KEY + "\n")
    cluster.start_supervisor()
    cluster.start_model("--key-file", str(key_file))
    answer = httpx.post(f"{cluster.model_url}/_admin/scenario", json=SCENARIO, trust_env=False)
    assert answer.status_code == 200, answer.text
    cluster.start_runner(
        "r1",
        "--model-api",
        api,
        "--model-key-file",
        str(key_file),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    chat = submit(
        cluster,
        "chat",
        {
            "name": "ask",
            "kind": "chat",
            "payload": {"messages": [{"role": "user", "content": "hello there"}]},
        },
    )
    notes = {"messages": [{"role": "user", "content": "write notes"}], "allowed_commands": []}
    agent = submit(cluster, "agent", {"name": "fix", "kind": "agent", "payload": notes})
    for task_id in (chat, agent):
        wait_for(
            lambda t=task_id: cluster.state(t) in ("SUCCEEDED", "FAILED"), "the tasks", 60, cluster
        )
        assert cluster.state(task_id) == "SUCCEEDED", cluster.task(task_id)
    stats = cluster.model_stats()
    assert {a["api"] for a in stats["asked"]} == {api}
    assert stats["by_status"] == {"200": 4}  # the chat step, then the agent's three turns
    assert stats["turns"].count("look") == 1  # each agent turn asked once
    assert sorted(t for t in stats["turns"] if t) == ["answer", "check", "look"]
    [attempt] = cluster.attempts(agent)
    assert attempt["usage"]["total_tokens"] > 0
    cluster.check_ledger()
