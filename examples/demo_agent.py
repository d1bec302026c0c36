"""`make demo-agent`: an agent step doing real repository work, killed mid-loop, resumed from its
checkpoint, and its candidate verified by the supervisor instead of believed.

A supervisor, the stand-in model (scripted: read the file, write the fix, run the tests, answer
done) and two runners run as separate processes on 127.0.0.1. The repository is a local bare
git repository holding a small Python package whose test fails. The runner holding the step is
SIGKILLed after it wrote the fix and checkpointed that turn, while the model holds its next
answer; the other runner resumes from the checkpoint, and the stand-in's call log shows it never
asked again for the turns already done. Then a second task sees the repository's head move
while its step runs and fails `stale_base`. Every line printed is checked first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from examples.demo import Progress, effects_by_step
from examples.demo_evidence import Declared, review_record, show_check_log, verified_candidate
from examples.demo_repo import (
    FIXED,
    TEST_COMMAND,
    Repository,
    make_repository,
    tests_at,
)
from examples.processes import (
    CHECKOUT,
    Child,
    Children,
    Deadline,
    DemoError,
    admin,
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
from tether.runner.agent.sandbox import Bubblewrap
from tether.wire import content_hash

DEADLINE_S = 120.0  # the run itself (30-45 s here, unloaded); stopping adds at most STOP_BUDGET_S
LEASE_TTL_S = 4  # the killed runner's lease ends within this after its last renew
ACCEPT_WINDOW_S = 2
CLAIM_WAIT_S = 2
RUNNER_IDS = ("agent-runner-a", "agent-runner-b")
TENANT, POOL, OWNER = "demo", "default", "demo-operator"
REPOSITORY = "calc"
REQUIREMENT = "calc-add-r1"
CHECKPOINT_TURN = 2  # read, then write: the kill comes after the write's checkpoint
STALE_HOLD_S = 4.0  # the second run's first answer waits this long; the head moves meanwhile
WITHOUT_SANDBOX = "TETHER_COMMANDS_WITHOUT_SANDBOX"
CHECKS = {"tests": TEST_COMMAND}
DECLARED = Declared(
    owner=OWNER,
    repository=REPOSITORY,
    requirement_revision=REQUIREMENT,
    allowed_paths=("src/",),
    checks=tuple(CHECKS),
)

PLAN: dict[str, Any] = {
    "steps": [
        {
            "name": "fix",
            "kind": "agent",
            "payload": {
                "messages": [
                    {"role": "system", "content": "You fix Python code. Change only src/."},
                    {"role": "user", "content": "Make the failing test pass."},
                ],
                "allowed_commands": [TEST_COMMAND],
                "max_turns": 8,
                "run_timeout_s": 60,
                "check_timeout_s": 60,
            },
        }
    ]
}


def scenario(hold: str, hold_s: float) -> dict[str, Any]:
    """The stand-in's script: one turn per model call of the loop, matched by the number of
    turns already done, so a resumed loop gets the turns it has not had yet. Turn `hold`
    holds its first answer `hold_s` seconds."""
    turns: list[dict[str, Any]] = [
        {
            "name": "read",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "src/calc.py"}}],
        },
        {
            "name": "write",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "src/calc.py", "content": FIXED}}
            ],
        },
        {"name": "test", "tool_calls": [{"name": "run", "arguments": {"command": TEST_COMMAND}}]},
        {"name": "done", "text": "Done: add() adds now, and the test passes."},
    ]
    for index, turn in enumerate(turns):
        turn["assistant_turns"] = index
        if turn["name"] == hold:
            turn |= {"hold_s": hold_s, "holds": 1}
    return {"turns": turns}


def sandbox_environment(folder: Path) -> dict[str, str]:
    """Probe bubblewrap as the runner does (`true` under the same options); the runners'
    extra environment: nothing when it works, else the setting that lets them run commands
    without it (printed, so nobody mistakes the run for a sandboxed one)."""
    found = shutil.which("bwrap")
    why = "bwrap is not installed"
    if found is not None:
        probe = folder / "probe"
        probe.mkdir()
        box = Bubblewrap(bwrap=found, read_only=(Path(sys.prefix), Path(sys.base_prefix)))
        try:
            done = subprocess.run(
                box.wrap(["true"], tree=probe, home=probe),
                check=False,
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            why = "bwrap's probe timed out"
        else:
            if done.returncode == 0:
                say("sandbox      bwrap works here: the agent's commands and the checks run in it")
                return {}
            why = f"bwrap's probe failed: {' '.join(done.stderr.split())[-160:]}"
    say(
        f"sandbox      NONE: {why}; the demo's runners run commands without a sandbox"
        f" ({WITHOUT_SANDBOX}=true)"
    )
    return {WITHOUT_SANDBOX: "true"}


def add_repository(db: Path, repo: Repository) -> None:
    """Register the demo's bare repository as `REPOSITORY` of `TENANT` (`tether-supervisor repo
    add`)."""
    added = admin(
        "repo", "add", REPOSITORY, "--url", str(repo.bare), "--tenant", TENANT, "--db", str(db)
    )
    if added.returncode != 0:
        raise DemoError(f"repo add failed: {added.stderr.strip()}")
    say(f"repo add     {REPOSITORY} --url {repo.bare} --tenant {TENANT}")


def start_runner(
    children: Children,
    folder: Path,
    runner_id: str,
    supervisor_url: str,
    token_file: Path,
    model_port: int,
    runner_env: dict[str, str],
) -> None:
    """Start a runner of one slot on the stand-in model, its cache in the demo's folder."""
    # The check `python -m pytest -q` runs this installation's interpreter, which has pytest.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    argv = [program("tether-runner"), "run", "--runner-id", runner_id]
    argv += ["--supervisor", supervisor_url, "--token-file", str(token_file)]
    argv += ["--concurrency", "1", "--model", "stand-in"]
    argv += ["--model-url", f"http://127.0.0.1:{model_port}/v1"]
    env = child_environment(
        TETHER_CLAIM_WAIT_S=str(CLAIM_WAIT_S),
        TETHER_LOG_FORMAT="json",
        CACHE_DIRECTORY=str(folder / f"cache-{runner_id}"),
        PATH=path,
        **runner_env,
    )
    children.start(runner_id, argv, env)


class Demo:
    """The running demo: its processes, folder, ledger and the two HTTP clients."""

    def __init__(self, folder: Path, children: Children, deadline: Deadline) -> None:
        self.folder, self.children, self.deadline = folder, children, deadline
        self.db = folder / "ledger.db"
        self.token_file = folder / "operator-token"
        self.url = ""
        self.http: httpx.Client
        self.model: httpx.Client

    def start(self, repo: Repository, runner_env: dict[str, str]) -> None:
        token = create_token(self.db, TENANT, "operator")
        write_secret(self.token_file, token)
        runner_token = write_secret(
            self.folder / "runner-token", create_token(self.db, POOL, "runner")
        )
        add_repository(self.db, repo)

        sup_port, model_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{sup_port}"
        supervisor = self.children.start(
            "supervisor",
            [program("tether-supervisor"), "serve", "--db", str(self.db), "--port", str(sup_port)],
            child_environment(
                TETHER_LEASE_TTL_S=str(LEASE_TTL_S), TETHER_ACCEPT_WINDOW_S=str(ACCEPT_WINDOW_S)
            ),
        )
        model = self.children.start(
            "stand-in-model",
            [sys.executable, "-m", "examples.standin_model", "--port", str(model_port)],
            child_environment(PYTHONPATH=str(CHECKOUT)),
            stop_signal=signal.SIGKILL,  # it may hold a killed runner's request for an hour
        )
        wait_until_up(f"{self.url}/healthz", supervisor, self.deadline)
        wait_until_up(f"http://127.0.0.1:{model_port}/healthz", model, self.deadline)
        say(f"supervisor   {self.url}  ledger {self.db}  lease TTL {LEASE_TTL_S} s")
        say(f"stand-in     http://127.0.0.1:{model_port}/v1  (a test double: scripted tool calls)")
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            trust_env=False,
            timeout=10.0,
        )
        self.model = httpx.Client(
            base_url=f"http://127.0.0.1:{model_port}", trust_env=False, timeout=10.0
        )
        for runner_id in RUNNER_IDS:
            start_runner(
                self.children,
                self.folder,
                runner_id,
                self.url,
                runner_token,
                model_port,
                runner_env,
            )
            say(f"runner       {runner_id}  (cache {self.folder.name}/cache-{runner_id})")

    def close(self) -> None:
        for client in ("http", "model"):
            if hasattr(self, client):
                getattr(self, client).close()

    def script(self, body: dict[str, Any]) -> None:
        call(self.model, "POST", "/_admin/scenario", json=body)

    def asked(self) -> list[dict[str, Any]]:
        stats: dict[str, Any] = call(self.model, "GET", "/_admin/stats")
        return list(stats["asked"])

    def answered_turns(self) -> list[str | None]:
        stats: dict[str, Any] = call(self.model, "GET", "/_admin/stats")
        return list(stats["turns"])

    def view(self, task_id: str) -> dict[str, Any]:
        found: dict[str, Any] = call(self.http, "GET", f"/v1/tasks/{task_id}")
        return found

    def submit(self, key: str, base: str) -> str:
        body = {
            "idempotency_key": f"{key}-{os.getpid()}-{time.time_ns()}",
            "plan": PLAN,
            "pool": POOL,
            "owner": OWNER,
            "repository": REPOSITORY,
            "base_sha": base,
            "requirement_revision": REQUIREMENT,
            "allowed_paths": list(DECLARED.allowed_paths),
            "checks": CHECKS,
        }
        task = call(self.http, "POST", "/v1/tasks", json=body)
        approval = {"plan_hash": content_hash(PLAN), "base_sha": base}
        approved = call(self.http, "POST", f"/v1/tasks/{task['id']}/approve", json=approval)
        say(
            f'task         {task["id"]}  one agent step, allowed_paths ["src/"], check tests:'
            f" {TEST_COMMAND!r}; approved on {base[:12]}: {approved['state']}"
        )
        return str(task["id"])

    def wait_for_end(self, task_id: str, progress: Progress) -> dict[str, Any]:
        while True:
            view = self.view(task_id)
            progress.show(view)
            if view["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
                return view
            self.deadline.check(f"task {task_id} to end (it is {view['state']})")
            time.sleep(0.1)


def checkpoint_row(db: Path, step_id: str) -> dict[str, Any]:
    """The step's accepted checkpoint as the ledger holds it (read-only)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as ledger:
        ledger.row_factory = sqlite3.Row
        row = ledger.execute(
            "SELECT fence, turn, transcript, bundle, sha FROM checkpoints WHERE step_id = ?",
            (step_id,),
        ).fetchone()
    expect(row is not None, f"step {step_id} has no checkpoint in the ledger")
    return dict(row)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kill:
    """Whom the demo killed: the runner, its attempt's fence, and how many calls the stand-in's
    log held at that moment (the killed attempt's; every later one is the resumed attempt's)."""

    holder: str
    fence: int
    asked: int


def kill_after_checkpoint(demo: Demo, task_id: str, progress: Progress) -> Kill:
    """Wait until the step's write is checkpointed and the model holds the next answer, then
    SIGKILL the runner holding the step."""
    while True:
        view = demo.view(task_id)
        progress.show(view)
        step = view["steps"][0]
        mark = step.get("checkpoint") or {}
        held = [a for a in demo.asked() if a["turn"] == "test" and a["hold_s"] > 0]
        if mark.get("turn", 0) >= CHECKPOINT_TURN and held:
            break
        expect(view["state"] in {"QUEUED", "RUNNING"}, f"task is {view['state']} before the kill")
        demo.deadline.check("the checkpoint of the write and the held model call")
        time.sleep(0.1)
    leased = [a for a in step["attempts"] if a["state"] == "leased"]
    expect(len(leased) == 1, f"step fix has {len(leased)} leased attempts at the kill")
    holder, fence = str(leased[0]["runner_id"]), int(leased[0]["fence"])
    row = checkpoint_row(demo.db, step["id"])
    expect(row["turn"] == CHECKPOINT_TURN, f"checkpointed turn {row['turn']}, not 2")
    expect(row["fence"] == fence, "the checkpoint is not the leased attempt's")
    expect(row["bundle"] is not None, "the write's checkpoint holds no bundle")
    say(
        f"  checkpoint   turn {row['turn']} (read, write) under fence {fence}: transcript"
        f" {row['transcript'][:12]}, bundle {row['bundle'][:12]} (wip {row['sha'][:12]})"
    )
    asked_before = len(demo.asked())
    child = demo.children.all[holder]
    child.kill()
    say(
        f"  SIGKILL {holder} (pid {child.process.pid}) while the stand-in holds its turn-3"
        " call: a revoked server"
    )
    return Kill(holder=holder, fence=fence, asked=asked_before)


def resume_proof(demo: Demo, killed: Kill, final: dict[str, Any]) -> None:
    """Print the stand-in's call log and check from it that the resumed attempt did not ask
    again for the turns its checkpoint held."""
    asked = demo.asked()
    before, after = asked[: killed.asked], asked[killed.asked :]
    step = final["steps"][0]
    winner = next(a for a in step["attempts"] if a["state"] == "committed")
    say("")
    say("== the stand-in's call log (GET /_admin/stats, 'asked': each request on arrival) ==")
    for number, line in enumerate(asked, start=1):
        who = killed.holder if number <= killed.asked else winner["runner_id"]
        held = f"  held {line['hold_s']:g} s, never answered" if line["hold_s"] else ""
        say(
            f"  #{number} turn_index {line['turn_index']}  {line['turn']:<6} messages"
            f" {line['messages']:<2} digest {line['digest']}  {who}{held}"
        )
    turns = demo.answered_turns()
    expect(
        [a["turn"] for a in before] == ["read", "write", "test"],
        f"the killed attempt asked {[a['turn'] for a in before]}",
    )
    expect(
        [a["turn"] for a in after] == ["test", "done"],
        f"the resumed attempt asked {[a['turn'] for a in after]}",
    )
    expect(
        all(a["turn_index"] >= CHECKPOINT_TURN for a in after),
        "the resumed attempt asked for a turn its checkpoint held",
    )
    expect(
        after[0]["digest"] == before[-1]["digest"],
        "the resumed attempt's first call differs from the killed attempt's last",
    )
    expect(turns.count("read") == 1 and turns.count("write") == 1, f"turns answered: {turns}")
    output = step["output"]
    resumed = output.get("resumed_from") or {}
    expect(
        resumed == {"turn": CHECKPOINT_TURN, "fence": killed.fence},
        f"the step's output says resumed_from {resumed}",
    )
    say(
        f"resume proof: {winner['runner_id']} resumed from turn {resumed['turn']} of fence"
        f" {resumed['fence']} (its output's resumed_from); its calls all have turn_index >="
        f" {CHECKPOINT_TURN}, its first is the killed call again (same digest), and 'read' and"
        " 'write' were answered once each"
    )


def stale_run(demo: Demo, repo: Repository) -> None:
    """The second run: a task approved on the head, the head moved while its step runs; the
    step's result is recorded once and the task fails `stale_base`, naming both commits."""
    say("")
    say("== second run: the repository's head moves after the approval ==")
    demo.script(scenario("read", STALE_HOLD_S))
    asked_before = len(demo.asked())
    task_id = demo.submit("demo-agent-stale", repo.base)
    progress = Progress()
    while not any(a["hold_s"] > 0 for a in demo.asked()[asked_before:]):
        progress.show(demo.view(task_id))
        demo.deadline.check("the second task's first model call")
        time.sleep(0.05)
    answered = len(demo.answered_turns())
    moved = repo.push_commit("README.md", "# calc\n\nA colleague's edit.\n", "README: edit")
    expect(repo.head() == moved, "the push did not move the remote's head")
    expect(len(demo.answered_turns()) == answered, "the step's first call was answered early")
    say(f"  git push: {repo.bare.name} main is now {moved[:12]}, while the step waits on the model")
    final = demo.wait_for_end(task_id, progress)
    step = final["steps"][0]
    reason = str(final.get("reason") or "")
    expect(final["state"] == "FAILED", f"the second task ended {final['state']} ({reason})")
    expect(
        reason.startswith("stale_base:") and repo.base in reason and moved in reason,
        f"the second task failed with {reason!r}",
    )
    expect(step["state"] == "committed", f"its step is {step['state']}, not committed")
    expect(len(effects_by_step(demo.db).get(step["id"], [])) == 1, "its step has not one effect")
    expect(
        "stale_base" in {f["code"] for f in final.get("findings") or []},
        f"findings {final.get('findings')}",
    )
    say(f"task {task_id}  state FAILED  reason {reason}")
    say(
        f"  its step's result was recorded once (candidate {step['candidate_sha'][:12]}), and the"
        " task failed at that report: the head the supervisor read was not the approved base"
    )
    again = demo.http.post(
        "/v1/tasks",
        json={
            "idempotency_key": f"demo-agent-late-{time.time_ns()}",
            "plan": PLAN,
            "repository": REPOSITORY,
            "allowed_paths": ["src/"],
            "pool": POOL,
        },
    )
    expect(again.status_code == 201, f"creating a third task answered {again.status_code}")
    refused = demo.http.post(
        f"/v1/tasks/{again.json()['id']}/approve",
        json={"plan_hash": content_hash(PLAN), "base_sha": repo.base},
    )
    body = refused.json()
    expect(
        refused.status_code == 409
        and body.get("error") == "stale_base"
        and moved in body.get("detail", ""),
        f"approving on the old base answered {refused.text[:200]}",
    )
    say(f"  approving another task on the old base now: 409 stale_base ({body['detail'][:90]}…)")


def first_run(demo: Demo, repo: Repository) -> str:
    """The first run: kill mid-loop after the write's checkpoint, resume, verify, review.
    Returns the killed runner's id."""
    code, last = tests_at(repo.work, repo.base)
    expect(code != 0, f"the tests pass at the base already ({last})")
    say(f"base         {repo.base[:12]}: {TEST_COMMAND} exits {code} ({last})")
    say("")
    say("== first run: the runner is SIGKILLed mid-loop, after its write's checkpoint ==")
    demo.script(scenario("test", 3600.0))
    task_id = demo.submit("demo-agent", repo.base)
    progress = Progress()
    killed = kill_after_checkpoint(demo, task_id, progress)
    final = demo.wait_for_end(task_id, progress)
    resume_proof(demo, killed, final)
    log = verified_candidate(final, repo, demo.folder / "mirrors")
    show_check_log(demo.url, demo.token_file, log)
    review_record(demo.http, final, repo, DECLARED, log)
    return killed.holder


def sandbox_used(child: Child) -> str:
    """Which sandbox a stopped runner said its agent steps used (its `sandbox` log line)."""
    for line in child.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == "sandbox":
                return str(entry.get("sandbox"))
    raise DemoError(f"{child.name} never logged which sandbox its commands ran in")


def run(*, keep: bool) -> int:
    """Run the demo; return 0 when every claim it printed held, else print one line saying
    what was off (and where the logs are kept) and return 1.

    Every child is stopped before the return; the temporary folder is removed unless the demo
    failed (then its path is printed, logs inside) or `keep` is set.
    """
    deadline = Deadline(DEADLINE_S)
    folder = Path(tempfile.mkdtemp(prefix="tether-demo-agent-"))
    children = Children(folder)
    demo = Demo(folder, children, deadline)

    def body() -> None:
        say("== tether agent demo: a repository task, a runner SIGKILLed mid-loop, verified ==")
        runner_env = sandbox_environment(folder)
        repo = make_repository(folder / "git")
        demo.start(repo, runner_env)
        killed = first_run(demo, repo)
        stale_run(demo, repo)
        demo.close()
        children.stop_all()
        # the stand-in is a test double: how it dies proves nothing
        bad = children.exited_badly(ignoring=(killed, "stand-in-model"))
        expect(not bad, "after SIGTERM: " + ", ".join(bad))
        survivor = next(r for r in RUNNER_IDS if r != killed)
        used = sandbox_used(children.all[survivor])
        expect(used == ("none" if runner_env else "bwrap"), f"{survivor} used sandbox {used}")
        say("")
        say(f"{survivor}'s log: its commands and checks ran in sandbox={used}")
        say(f"tether-supervisor check: {ledger_check(demo.db)}")
        say(
            "demo-agent ok: killed after its checkpoint, resumed without asking again for done"
            f" turns, candidate verified, stale base refused ({deadline.spent():.1f} s)"
        )

    return run_guarded(
        "demo-agent",
        body,
        folder=folder,
        children=children,
        close=demo.close,
        keep=keep,
        kept="logs, ledger and repositories",
    )


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m examples.demo_agent",
        description="Run a supervisor, the stand-in model and two runners on 127.0.0.1; an"
        " agent step fixes a failing test in a local git repository, its runner is killed"
        " mid-loop and the other resumes from the checkpoint; then a moved head fails a"
        " second task stale_base.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    return run(keep=args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
