"""`make demo-effects`: effects that leave the ledger, delivered by the supervisor exactly once
though it is SIGKILLed in the middle of each delivery (docs/design.md, Effects).

A supervisor, the stand-in model, one runner and a local HTTP receiver (examples/receiver.py)
run as separate processes on 127.0.0.1; the repository is a local bare git repository. The
task's plan: an agent step fixes a failing test (the stand-in scripts the tool calls), then a
`git.push` effect moves the repository's `main` to the verified candidate, then an `http`
deploy effect tells the receiver which commit to deploy. Both effects are done, then their
answers held `ANSWER_HOLD_S` (a `post-receive` hook in the bare repository sleeps; the receiver
runs with `--delay-s`), and the supervisor is SIGKILLed in that gap each time: the effect
happened, the ledger has its attempt begun and no answer. Restarted on the same ledger, the
supervisor sends each again under the same key: the push finds `main` already at the candidate
and records `replayed`, and the receiver answers the deploy's key as a replay. At the end the
receiver's own count of deploys (1) and the branch (at the candidate) are printed, with
`tether-supervisor check`. Every line printed is checked first.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from examples.demo_agent import (
    CHECKS,
    DECLARED,
    OWNER,
    POOL,
    REPOSITORY,
    TENANT,
    add_repository,
    sandbox_environment,
    start_runner,
)
from examples.demo_agent import PLAN as AGENT_PLAN
from examples.demo_agent import scenario as agent_scenario
from examples.demo_repo import FIXED, Repository, git, git_text, make_repository
from examples.processes import (
    CHECKOUT,
    Child,
    Children,
    Deadline,
    call,
    child_environment,
    create_token,
    expect,
    free_port,
    ledger_check,
    program,
    run_guarded,
    say,
    wait_until_up,
    write_secret,
)
from tether.cli import Parser
from tether.wire import content_hash

DEADLINE_S = 150.0  # the run itself (35-60 s here); stopping adds at most STOP_BUDGET_S
LEASE_TTL_S = 4
ACCEPT_WINDOW_S = 2
# The dispatcher's hold on an effect: a killed supervisor's effect is taken again once it lapses.
# Half of it bounds one attempt, so it must stay well above ANSWER_HOLD_S.
EFFECT_HOLD_S = 6.0
ANSWER_HOLD_S = 2.5  # the hook and the receiver do the effect, then wait this long to answer
BRANCH = "main"
RUNNER_ID = "effects-runner"
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def plan(receiver_url: str) -> dict[str, Any]:
    """The agent demo's fix step, then the push of its candidate and the deploy of it."""
    return {
        "steps": [
            *AGENT_PLAN["steps"],
            {"name": "push", "kind": "git.push", "payload": {"branch": BRANCH}},
            {
                "name": "deploy",
                "kind": "http",
                "payload": {
                    "url": f"{receiver_url}/deploy",
                    "method": "POST",
                    "body": {"service": "calc", "commit": "{{ steps.fix.output.candidate_sha }}"},
                },
            },
        ]
    }


def hold_pushes(bare: Path, marker: Path) -> None:
    """A `post-receive` hook for the bare repository: git has moved the branch when it runs, and
    the pusher waits for it; it writes what moved to `marker`, then holds the answer."""
    hook = bare / "hooks" / "post-receive"
    hook.write_text(
        "#!/bin/sh\n"
        "# the branch has moved; the pusher's answer waits for this hook\n"
        f"cat > '{marker}.part' && mv '{marker}.part' '{marker}'\n"
        f"sleep {ANSWER_HOLD_S}\n",
        encoding="utf-8",
    )
    hook.chmod(0o755)


class EffectsDemo:
    """The running demo: its processes, the supervisor's lives, and the operator's client."""

    def __init__(self, folder: Path, children: Children, deadline: Deadline) -> None:
        self.folder, self.children, self.deadline = folder, children, deadline
        self.db = folder / "ledger.db"
        self.marker = folder / "pushed"
        self.sup_port = free_port()
        self.url = f"http://127.0.0.1:{self.sup_port}"
        self.receiver_url = ""
        self.lives = 0
        self.supervisor: Child
        self.http: httpx.Client

    def start(self, repo: Repository, runner_env: dict[str, str]) -> None:
        token = create_token(self.db, TENANT, "operator")
        write_secret(self.folder / "operator-token", token)
        runner_token = write_secret(
            self.folder / "runner-token", create_token(self.db, POOL, "runner")
        )
        add_repository(self.db, repo)
        say(f"             its post-receive hook holds each push's answer {ANSWER_HOLD_S:g} s")

        receiver_port, model_port = free_port(), free_port()
        self.receiver_url = f"http://127.0.0.1:{receiver_port}"
        receiver = self.children.start(
            "receiver",
            [
                sys.executable,
                "-m",
                "examples.receiver",
                "--port",
                str(receiver_port),
                "--state",
                str(self.folder / "receiver.db"),
                "--delay-s",
                str(ANSWER_HOLD_S),
            ],
            child_environment(PYTHONPATH=str(CHECKOUT)),
        )
        model = self.children.start(
            "stand-in-model",
            [sys.executable, "-m", "examples.standin_model", "--port", str(model_port)],
            child_environment(PYTHONPATH=str(CHECKOUT)),
            stop_signal=signal.SIGKILL,  # a test double: how it dies proves nothing
        )
        self.start_supervisor()
        wait_until_up(f"{self.receiver_url}/counts", receiver, self.deadline)
        wait_until_up(f"http://127.0.0.1:{model_port}/healthz", model, self.deadline)
        say(
            f"receiver     {self.receiver_url}  (examples/receiver.py: applies each"
            f" Idempotency-Key once, answers {ANSWER_HOLD_S:g} s later)"
        )
        say(f"stand-in     http://127.0.0.1:{model_port}/v1  (a test double: scripted tool calls)")
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            trust_env=False,
            timeout=10.0,
        )
        with httpx.Client(base_url=f"http://127.0.0.1:{model_port}", trust_env=False) as m:
            call(m, "POST", "/_admin/scenario", json=agent_scenario("", 0.0))
        start_runner(
            self.children, self.folder, RUNNER_ID, self.url, runner_token, model_port, runner_env
        )
        say(f"runner       {RUNNER_ID}")

    def start_supervisor(self) -> None:
        """Start (or restart, on the same ledger and port) the supervisor."""
        self.lives += 1
        name = "supervisor" if self.lives == 1 else f"supervisor-{self.lives}"
        argv = [program("tether-supervisor"), "serve", "--db", str(self.db)]
        argv += ["--port", str(self.sup_port)]
        self.supervisor = self.children.start(
            name,
            argv,
            child_environment(
                TETHER_LEASE_TTL_S=str(LEASE_TTL_S),
                TETHER_ACCEPT_WINDOW_S=str(ACCEPT_WINDOW_S),
                TETHER_EFFECT_HOLD_S=str(EFFECT_HOLD_S),
                # The receiver is on 127.0.0.1: an internal address is sent to only when
                # an entry names it.
                TETHER_EFFECT_ALLOWED_HOSTS=self.receiver_url.removeprefix("http://"),
            ),
        )
        wait_until_up(f"{self.url}/healthz", self.supervisor, self.deadline)
        if self.lives == 1:
            say(f"supervisor   {self.url}  ledger {self.db}  effect hold {EFFECT_HOLD_S:g} s")
            say(f"             effect_allowed_hosts {self.receiver_url.removeprefix('http://')}")
        else:
            say(f"  restarted    {name} (pid {self.supervisor.process.pid}) on the same ledger")

    def kill_supervisor(self, why: str) -> None:
        self.supervisor.kill()
        say(f"  SIGKILL      {self.supervisor.name} (pid {self.supervisor.process.pid}) {why}")

    def close(self) -> None:
        if hasattr(self, "http"):
            self.http.close()

    def view(self, task_id: str) -> dict[str, Any]:
        found: dict[str, Any] = call(self.http, "GET", f"/v1/tasks/{task_id}")
        return found

    def receiver_counts(self) -> dict[str, Any]:
        with httpx.Client(trust_env=False, timeout=5.0) as http:
            counts: dict[str, Any] = call(http, "GET", f"{self.receiver_url}/counts")
        return counts

    def submit(self, base: str) -> str:
        body_plan = plan(self.receiver_url)
        body = {
            "idempotency_key": f"demo-effects-{os.getpid()}-{time.time_ns()}",
            "plan": body_plan,
            "pool": POOL,
            "owner": OWNER,
            "repository": REPOSITORY,
            "base_sha": base,
            "requirement_revision": DECLARED.requirement_revision,
            "allowed_paths": list(DECLARED.allowed_paths),
            "checks": CHECKS,
        }
        task = call(self.http, "POST", "/v1/tasks", json=body)
        approval = {"plan_hash": content_hash(body_plan), "base_sha": base}
        approved = call(self.http, "POST", f"/v1/tasks/{task['id']}/approve", json=approval)
        say(
            f"task         {task['id']}  fix (agent) -> push (git.push {BRANCH}) -> deploy"
            f" (http POST {self.receiver_url}/deploy); approved on {base[:12]}:"
            f" {approved['state']}"
        )
        return str(task["id"])

    def step(self, task_id: str, name: str) -> dict[str, Any]:
        view = self.view(task_id)
        expect(view["state"] not in ENDED, f"the task ended {view['state']}: {view.get('reason')}")
        found: dict[str, Any] = next(s for s in view["steps"] if s["name"] == name)
        return found


def unanswered_attempt(step: dict[str, Any]) -> bool:
    """The effect is in delivery with its last attempt begun and not answered."""
    effect = step.get("effect") or {}
    deliveries = effect.get("deliveries") or []
    return (
        effect.get("state") == "sending" and bool(deliveries) and deliveries[-1]["answer"] is None
    )


def branch_at(repo: Repository) -> str:
    line = git_text("ls-remote", str(repo.bare), f"refs/heads/{BRANCH}", cwd=repo.work)
    return line.split()[0] if line else ""


def kill_mid_push(demo: EffectsDemo, repo: Repository, task_id: str) -> str:
    """Wait for the fix's candidate and for the push to have moved the branch (the hook holds
    its answer), then SIGKILL the supervisor and restart it. Returns the candidate."""
    while True:
        fix = demo.step(task_id, "fix")
        if fix["state"] == "committed" and demo.marker.exists():
            break
        demo.deadline.check(f"the fix to commit and the push to reach {repo.bare.name}")
        time.sleep(0.05)
    candidate = str(fix["candidate_sha"])
    say(f"  step fix     committed; candidate {candidate[:12]} verified (checks: tests)")
    moved = demo.marker.read_text(encoding="utf-8").split()
    expect(moved[1:] == [candidate, f"refs/heads/{BRANCH}"], f"the hook saw {moved}")
    expect(branch_at(repo) == candidate, f"{BRANCH} is not at the candidate after the push")
    push = demo.step(task_id, "push")
    expect(unanswered_attempt(push), f"the push is not in delivery: {push.get('effect')}")
    demo.kill_supervisor(
        f"after the push moved {BRANCH} {repo.base[:12]} -> {candidate[:12]}, before its answer"
        " was recorded"
    )
    demo.start_supervisor()
    return candidate


def kill_mid_deploy(demo: EffectsDemo, task_id: str) -> None:
    """Wait until the receiver has applied the deploy (and holds its answer), then SIGKILL the
    supervisor and restart it."""
    while demo.receiver_counts()["applied"] < 1:
        demo.step(task_id, "deploy")  # the task has not ended meanwhile
        demo.deadline.check("the receiver to apply the deploy")
        time.sleep(0.05)
    deploy = demo.step(task_id, "deploy")
    expect(unanswered_attempt(deploy), f"the deploy is not in delivery: {deploy.get('effect')}")
    demo.kill_supervisor("after the receiver applied the deploy, before its answer was recorded")
    demo.start_supervisor()


def wait_for_end(demo: EffectsDemo, task_id: str) -> dict[str, Any]:
    while True:
        view = demo.view(task_id)
        if view["state"] in ENDED:
            return view
        demo.deadline.check(f"task {task_id} to end (it is {view['state']})")
        time.sleep(0.1)


def effect_account(step: dict[str, Any]) -> list[str]:
    """An effect step's lines: each delivery attempt, and the observation recorded. Checks that
    the first attempt was cut by the kill and the last was answered as a replay."""
    effect = step["effect"]
    deliveries = effect["deliveries"]
    output = step["output"] or {}
    lines = [
        f"  step {step['name']:<7} {step['state']}  {effect['kind']} effect, key"
        f" {effect['key'][:16]}, {effect['state']}"
    ]
    for d in deliveries:
        if d["answer"] is None:
            said = "no answer recorded: the supervisor was SIGKILLed"
        else:
            status = "" if d["status"] is None else f" {d['status']}"
            said = f"{d['answer']}{status}: {d['detail']}"
        lines.append(f"      attempt {d['attempt']}  {said}")
    expect(step["state"] == "committed", f"step {step['name']} is {step['state']}")
    expect(effect["state"] == "delivered", f"effect {step['name']} is {effect['state']}")
    expect(
        len(deliveries) >= 2 and deliveries[0]["answer"] is None,
        f"{step['name']}'s first attempt was not cut by the kill: {deliveries}",
    )
    expect(
        deliveries[-1]["answer"] == "delivered" and output.get("replayed") is True,
        f"{step['name']}'s last attempt was not answered as a replay: {output}",
    )
    lines.append(f"      recorded: replayed {output['replayed']} on attempt {output['attempt']}")
    return lines


def account(demo: EffectsDemo, repo: Repository, final: dict[str, Any], candidate: str) -> None:
    """Print the ledger's, the receiver's and git's account, each line checked first."""
    expect(final["state"] == "SUCCEEDED", f"the task ended {final['state']}: {final.get('reason')}")
    lines = [f"task {final['id']}  state {final['state']}"]
    for step in final["steps"]:
        if step["effect"] is not None:
            lines += effect_account(step)
    say("")
    say("== the ledger's account ==")
    for line in lines:
        say(line)
    counts = demo.receiver_counts()
    deploy = next(s for s in final["steps"] if s["name"] == "deploy")
    key = deploy["effect"]["key"]
    expect(counts["applied"] == 1, f"the receiver applied {counts['applied']} deploys")
    expect(counts["by_key"] == {key: 2}, f"the receiver saw keys {counts['by_key']}")
    expect(counts["replayed"] == 1, f"the receiver replayed {counts['replayed']} deliveries")
    request = deploy["effect"]["request"]
    expect(request["body"]["commit"] == candidate, f"the deploy named {request['body']}")
    say("")
    say("== the receiver's account (GET /counts) ==")
    say(
        f"deploys applied: {counts['applied']}  (requests {counts['requests']}, both with key"
        f" {key[:16]}; replayed {counts['replayed']}) of commit {candidate[:12]}"
    )
    at = branch_at(repo)
    expect(at == candidate, f"{BRANCH} of {repo.bare.name} is at {at}, not {candidate}")
    fixed = git("show", f"{at}:src/calc.py", cwd=repo.bare).decode()
    expect(fixed == FIXED, "src/calc.py on the branch is not the fix")
    say("")
    say("== git's account (git ls-remote) ==")
    say(f"{repo.bare.name} {BRANCH}: {at[:12]} = the verified candidate (was {repo.base[:12]})")


def stop_runner_first(children: Children) -> None:
    """SIGTERM the runner while a supervisor still answers it (stop_all goes in reverse start
    order, and the restarted supervisor started last)."""
    runner = children.all[RUNNER_ID].process
    if runner.poll() is None:
        runner.send_signal(signal.SIGTERM)
        runner.wait(10)


def run(*, keep: bool) -> int:
    """Run the demo; return 0 when every claim it printed held, else print one line saying what
    was off (and where the logs are kept) and return 1.

    Every child is stopped before the return; the temporary folder is removed unless the demo
    failed (then its path is printed, logs inside) or `keep` is set.
    """
    deadline = Deadline(DEADLINE_S)
    folder = Path(tempfile.mkdtemp(prefix="tether-demo-effects-"))
    children = Children(folder)
    demo = EffectsDemo(folder, children, deadline)

    def body() -> None:
        say("== tether effects demo: a push and a deploy, the supervisor SIGKILLed mid-delivery ==")
        runner_env = sandbox_environment(folder)
        repo = make_repository(folder / "git")
        hold_pushes(repo.bare, demo.marker)
        demo.start(repo, runner_env)
        say("")
        task_id = demo.submit(repo.base)
        candidate = kill_mid_push(demo, repo, task_id)
        kill_mid_deploy(demo, task_id)
        final = wait_for_end(demo, task_id)
        account(demo, repo, final, candidate)
        demo.close()
        stop_runner_first(children)
        children.stop_all()
        killed = tuple(
            n for n in children.all if n.startswith("supervisor") and n != demo.supervisor.name
        )
        # the stand-in and the receiver are test doubles (uvicorn ends the receiver by
        # re-raising SIGTERM): how they die proves nothing
        bad = children.exited_badly(ignoring=(*killed, "stand-in-model", "receiver"))
        expect(not bad, "after SIGTERM: " + ", ".join(bad))
        say("")
        say(f"tether-supervisor check: {ledger_check(demo.db)}")
        say(
            "demo-effects ok: the supervisor was killed twice mid-delivery; the push and the"
            f" deploy each happened once ({deadline.spent():.1f} s)"
        )

    return run_guarded(
        "demo-effects",
        body,
        folder=folder,
        children=children,
        close=demo.close,
        keep=keep,
        kept="logs, ledger, receiver state and repositories",
    )


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m examples.demo_effects",
        description="Run a supervisor, the stand-in model, a runner and a local receiver on"
        " 127.0.0.1; an agent step fixes a failing test in a local git repository, then a"
        " git.push effect moves its branch to the verified candidate and an http effect deploys"
        " it, the supervisor SIGKILLed in the middle of each delivery; each happens once.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    return run(keep=args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
