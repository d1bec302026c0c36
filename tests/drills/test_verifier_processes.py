"""A runner that lies about its checks, against a verifier (docs/design.md, Verification; Threat
model, The borrowed side), with real processes: `tether-supervisor serve`, the stand-in model
scripting an agent's tool calls, the lying runner (`tests/lying_runner.py`: a real runner whose
checks always "pass"), an honest runner, and an honest verifier runner in pool `acme/verify`,
over a local bare repository whose test fails until `add()` adds.

With a verifier pool set, the lying runner's candidate (tests still failing) ends
`check_disputed` naming both runners' tokens, and its `git.push` to the bare repository never
happens; an honest agent and the verifier let the task succeed and push. Without a verifier
the lying runner's task succeeds and is pushed: its checks were only `attested by runner`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.demo_agent import sandbox_environment
from examples.demo_repo import BUGGY, FIXED, TEST_COMMAND, Repository, git_text, make_repository
from tests.runner.test_runner_processes import Cluster, environment, wait_for

pytestmark = pytest.mark.slow

VERIFY_POOL = "acme/verify"
CHECKOUT = Path(__file__).resolve().parents[2]
WRONG = BUGGY.replace("a - b", "a * b")  # still fails: 2 * 3 != 5
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


def script_the_agent(cluster: Cluster, content: str) -> None:
    """The stand-in's agent: write `content` to src/calc.py, then say it is done."""
    turns = [
        {
            "name": "write",
            "assistant_turns": 0,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/calc.py", "content": content}}
            ],
        },
        {"name": "done", "assistant_turns": 1, "text": "Done: the test passes."},
    ]
    answer = httpx.post(
        f"{cluster.model_url}/_admin/scenario", json={"turns": turns}, trust_env=False
    )
    assert answer.status_code == 200, answer.text


def runner_env(cluster: Cluster, name: str, sandbox: dict[str, str]) -> dict[str, str]:
    # The check `python -m pytest -q` runs this installation's interpreter, which has pytest.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {"PATH": path, "CACHE_DIRECTORY": str(cluster.folder / f"cache-{name}"), **sandbox}


def start_lying_runner(cluster: Cluster, sandbox: dict[str, str]) -> None:
    argv = [sys.executable, "-m", "tests.lying_runner", "run", "--supervisor", cluster.url]
    argv += ["--runner-id", "liar", "--token-file", str(cluster.runner_token_file)]
    argv += ["--model", "stand-in", "--model-url", f"{cluster.model_url}/v1"]
    env = environment(
        TETHER_LOG_FORMAT="json",
        TETHER_CLAIM_WAIT_S="1",
        TETHER_PAUSE_INITIAL_S="0.5",
        PYTHONPATH=str(CHECKOUT),
        **runner_env(cluster, "liar", sandbox),
    )
    proc = cluster.start("liar", argv, env)
    wait_for(lambda: proc.events("supervisor answered"), "the lying runner", 30, cluster)


def start_verifier(cluster: Cluster, sandbox: dict[str, str]) -> None:
    token_file = cluster.folder / "verify-token"
    token_file.write_text(cluster.token(VERIFY_POOL, "runner") + "\n")
    cluster.start_runner(
        "verifier", "--token-file", str(token_file), **runner_env(cluster, "verifier", sandbox)
    )


def submit(cluster: Cluster, repo: Repository, key: str, verify: bool) -> str:
    plan = {
        "steps": [
            {
                "name": "fix",
                "kind": "agent",
                "payload": {
                    "messages": [{"role": "user", "content": "Make the failing test pass."}],
                    "allowed_commands": [],
                    "max_turns": 4,
                    "check_timeout_s": 60,
                },
            },
            {"name": "push", "kind": "git.push", "payload": {"branch": "main"}},
        ]
    }
    body: dict[str, Any] = {
        "idempotency_key": key,
        "plan": plan,
        "pool": "default",
        "repository": "calc",
        "base_sha": repo.base,
        "allowed_paths": ["src/"],
        "checks": {"tests": TEST_COMMAND},
    }
    if verify:
        body["verify"] = {"pool": VERIFY_POOL}
    task = cluster.http.post("/v1/tasks", json=body)
    assert task.status_code == 201, task.text
    approved = cluster.http.post(
        f"/v1/tasks/{task.json()['id']}/approve",
        json={"plan_hash": task.json()["plan_hash"], "base_sha": repo.base},
    )
    assert approved.status_code == 200, approved.text
    task_id: str = task.json()["id"]
    return task_id


def ended(cluster: Cluster, task_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        task = cluster.task(task_id)
        return task if task["state"] in TERMINAL else None

    found: dict[str, Any] = wait_for(done, f"task {task_id} to end", 180, cluster)
    return found


def main_of(repo: Repository) -> str:
    return git_text("rev-parse", "main", cwd=repo.bare)


def token_of(task: dict[str, Any], kind: str) -> str:
    step = next(s for s in task["steps"] if s["kind"] == kind)
    [committed] = [a for a in step["attempts"] if a["state"] == "committed"]
    token: str = committed["token_id"]
    return token


def setting_up(cluster: Cluster, tmp_path: Path) -> tuple[Repository, dict[str, str]]:
    repo = make_repository(tmp_path / "repo")
    cluster.add_repository("calc", repo.bare, tenant="acme")
    cluster.start_supervisor()
    cluster.start_model()
    return repo, sandbox_environment(tmp_path)


def test_a_lying_runner_is_disputed_by_the_verifier_and_nothing_is_pushed(
    cluster: Cluster, tmp_path: Path
) -> None:
    repo, sandbox = setting_up(cluster, tmp_path)
    script_the_agent(cluster, WRONG)
    start_lying_runner(cluster, sandbox)
    start_verifier(cluster, sandbox)
    task_id = submit(cluster, repo, f"liar-{time.time_ns()}", verify=True)
    task = ended(cluster, task_id)
    assert task["state"] == "FAILED", task["reason"]
    assert task["reason"].startswith("check_disputed: "), task["reason"]
    maker, verifier = token_of(task, "agent"), token_of(task, "verify")
    assert maker != verifier
    assert maker in task["reason"]
    assert verifier in task["reason"]
    assert task["checks_standing"].startswith("disputed: check_disputed: ")
    # The liar said its check passed; the verifier's own log says otherwise.
    [agent_run] = task["steps"][0]["checks"]
    [verify_run] = task["steps"][-1]["checks"]
    assert (agent_run["exit_code"], verify_run["exit_code"]) == (0, 1)
    push = next(s for s in task["steps"] if s["name"] == "push")
    assert push["effect"] is None  # never fell due
    assert main_of(repo) == repo.base
    [line] = cluster.procs[0].events("checks disputed")
    assert (line["maker_token"], line["verifier_token"]) == (maker, verifier)
    assert line["level"] == "warning"
    review = cluster.http.get(f"/v1/tasks/{task_id}/review").json()
    assert review["verdict"]["acceptable"] is False
    cluster.check_ledger()


def test_an_honest_agent_and_the_verifier_let_the_task_succeed_and_push(
    cluster: Cluster, tmp_path: Path
) -> None:
    repo, sandbox = setting_up(cluster, tmp_path)
    script_the_agent(cluster, FIXED)
    cluster.start_runner("honest", **runner_env(cluster, "honest", sandbox))
    start_verifier(cluster, sandbox)
    task_id = submit(cluster, repo, f"honest-{time.time_ns()}", verify=True)
    task = ended(cluster, task_id)
    assert task["state"] == "SUCCEEDED", task["reason"]
    candidate = task["steps"][0]["candidate_sha"]
    assert main_of(repo) == candidate
    verifier = token_of(task, "verify")
    assert task["checks_standing"].startswith(f"verified by runner {verifier} of pool")
    cluster.check_ledger()


def test_without_a_verifier_the_lying_runner_s_word_stands_and_is_called_attested(
    cluster: Cluster, tmp_path: Path
) -> None:
    """What a verifier closes: the same lie, no verifier pool, succeeds and is pushed."""
    repo, sandbox = setting_up(cluster, tmp_path)
    script_the_agent(cluster, WRONG)
    start_lying_runner(cluster, sandbox)
    task_id = submit(cluster, repo, f"unverified-{time.time_ns()}", verify=False)
    task = ended(cluster, task_id)
    assert task["state"] == "SUCCEEDED", task["reason"]
    assert main_of(repo) == task["steps"][0]["candidate_sha"]
    assert task["checks_standing"] == f"attested by runner {token_of(task, 'agent')}"
