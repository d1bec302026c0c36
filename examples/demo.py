"""`make demo`: a revoked server mid-step, and the ledger's account of what happened.

A supervisor, the stand-in model and two runners run as separate processes on 127.0.0.1 only.
The demo submits a four-step chat task whose later steps use the earlier outputs, SIGKILLs the
runner holding a middle step, as a cloud provider reclaiming the server would, and shows the
supervisor's clock ending that lease and the other runner replaying the step, same step id,
new fence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from examples.processes import (
    CHECKOUT,
    Children,
    Deadline,
    DemoError,
    call,
    child_environment,
    create_token,
    free_port,
    ledger_check,
    program,
    say,
    wait_until_up,
    write_secret,
)
from tether.cli import Parser
from tether.wire import content_hash, effect_key

DEADLINE_S = 45.0  # the run itself; stopping adds at most processes.STOP_BUDGET_S
# A runner killed before its first renew is never acknowledged within the accept window; a
# renewed lease would run out its TTL. Either way the step is re-queued within seconds.
LEASE_TTL_S = 4
ACCEPT_WINDOW_S = 2
MODEL_LATENCY_S = 1.0  # the stand-in's delay, so the kill lands mid-call
CLAIM_WAIT_S = 2
RUNNER_IDS = ("demo-runner-a", "demo-runner-b")
KILL_STEP = 1  # zero-based: the second step, once the first has committed
TENANT = "demo"
POOL = "default"
SERVE_ARGS = ("--host", "127.0.0.1", "--port")

PLAN: dict[str, Any] = {
    "steps": [
        {
            "name": "outline",
            "kind": "chat",
            "payload": {
                "messages": [
                    {"role": "system", "content": "You are a careful release engineer."},
                    {"role": "user", "content": "Outline a rollout of billing-api v2.3.1."},
                ]
            },
        },
        {
            "name": "risks",
            "kind": "chat",
            "payload": {
                "messages": [{"role": "user", "content": "Name the riskiest step above."}],
                "use_outputs": True,
            },
        },
        {
            "name": "rollback",
            "kind": "chat",
            "payload": {
                "messages": [{"role": "user", "content": "Write its rollback procedure."}],
                "use_outputs": True,
            },
        },
        {
            "name": "announce",
            "kind": "chat",
            "payload": {
                "messages": [{"role": "user", "content": "Draft the change announcement."}],
                "use_outputs": True,
            },
        },
    ]
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
    db: Path
    supervisor_url: str
    operator_token: str


def start_everything(children: Children, folder: Path, deadline: Deadline) -> Setup:
    db = folder / "ledger.db"
    operator_token = create_token(db, TENANT, "operator")
    runner_token_file = write_secret(folder / "runner-token", create_token(db, POOL, "runner"))

    sup_port, model_port = free_port(), free_port()
    supervisor_url = f"http://127.0.0.1:{sup_port}"
    supervisor = children.start(
        "supervisor",
        [program("tether-supervisor"), "serve", "--db", str(db), *SERVE_ARGS, str(sup_port)],
        child_environment(
            TETHER_LEASE_TTL_S=str(LEASE_TTL_S), TETHER_ACCEPT_WINDOW_S=str(ACCEPT_WINDOW_S)
        ),
    )
    model = children.start(
        "stand-in-model", standin_argv(model_port), child_environment(PYTHONPATH=str(CHECKOUT))
    )
    wait_until_up(f"{supervisor_url}/healthz", supervisor, deadline)
    wait_until_up(f"http://127.0.0.1:{model_port}/healthz", model, deadline)
    say(f"supervisor   {supervisor_url}  ledger {db}  lease TTL {LEASE_TTL_S} s")
    say(f"stand-in     http://127.0.0.1:{model_port}/v1  (a test double, ~{MODEL_LATENCY_S:g} s)")

    for runner_id in RUNNER_IDS:
        children.start(
            runner_id,
            runner_argv(runner_id, supervisor_url, runner_token_file, model_port),
            # A short claim long-poll, so the supervisor's shutdown does not wait on one.
            child_environment(TETHER_CLAIM_WAIT_S=str(CLAIM_WAIT_S), TETHER_LOG_FORMAT="json"),
        )
        say(f"runner       {runner_id}  (token in {runner_token_file.name}, mode 0600)")
    return Setup(db=db, supervisor_url=supervisor_url, operator_token=operator_token)


def runner_argv(
    runner_id: str, supervisor_url: str, token_file: Path, model_port: int
) -> list[str]:
    argv = [program("tether-runner"), "run", "--runner-id", runner_id]
    argv += ["--supervisor", supervisor_url]
    argv += ["--token-file", str(token_file), "--concurrency", "1"]
    argv += ["--model-url", f"http://127.0.0.1:{model_port}/v1", "--model", "stand-in"]
    return argv


def standin_argv(port: int) -> list[str]:
    argv = [sys.executable, "-m", "examples.standin_model", "--port", str(port)]
    argv += ["--latency", str(MODEL_LATENCY_S)]
    return argv


def submit(http: httpx.Client) -> str:
    body = {"idempotency_key": f"demo-{os.getpid()}-{time.time_ns()}", "plan": PLAN, "pool": POOL}
    task = call(http, "POST", "/v1/tasks", json=body)
    approved = call(
        http,
        "POST",
        f"/v1/tasks/{task['id']}/approve",
        json={"plan_hash": content_hash(PLAN), "base_sha": None},
    )
    steps = len(PLAN["steps"])
    say(f"task         {task['id']}  {steps} chat steps, approved: {approved['state']}")
    return str(task["id"])


class Progress:
    """Prints each attempt's changes once, as the task view shows them."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int, str]] = set()

    def show(self, view: dict[str, Any]) -> None:
        for position, step in enumerate(view["steps"], start=1):
            for attempt in step["attempts"]:
                key = (step["id"], attempt["attempt"], attempt["state"])
                if key in self._seen:
                    continue
                self._seen.add(key)
                say(
                    f"  step {position} {step['name']:<9} attempt {attempt['attempt']}"
                    f"  fence {attempt['fence']:<16} {attempt['runner_id']:<14} {attempt['state']}"
                )


def kill_the_holder(
    http: httpx.Client, task_id: str, children: Children, progress: Progress, deadline: Deadline
) -> tuple[str, str, int]:
    """SIGKILL the runner holding step KILL_STEP mid-call; return (runner_id, step_id, fence)."""
    while True:
        view = call(http, "GET", f"/v1/tasks/{task_id}")
        progress.show(view)
        step = view["steps"][KILL_STEP]
        leased = [a for a in step["attempts"] if a["state"] == "leased"]
        if leased:
            break
        if step["state"] == "committed":
            raise DemoError(f"step {step['name']} committed before the demo saw its lease")
        deadline.check(f"step {step['name']!r} to be leased")
        time.sleep(0.05)
    holder, fence = leased[0]["runner_id"], int(leased[0]["fence"])
    if holder not in children.all:
        raise DemoError(f"step leased to {holder!r}, which is not one of the demo's runners")
    time.sleep(MODEL_LATENCY_S / 3)  # let the model call get under way
    children.all[holder].kill()
    say(
        f"  SIGKILL {holder} (pid {children.all[holder].process.pid}) while it holds step"
        f" {KILL_STEP + 1} {step['name']!r} under fence {fence}: a revoked server"
    )
    return str(holder), str(step["id"]), fence


def wait_for_end(
    http: httpx.Client, task_id: str, progress: Progress, deadline: Deadline
) -> dict[str, Any]:
    while True:
        view: dict[str, Any] = call(http, "GET", f"/v1/tasks/{task_id}")
        progress.show(view)
        if view["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            return view
        deadline.check(f"task {task_id} to end (it is {view['state']})")
        time.sleep(0.1)


def effects_by_step(db: Path) -> dict[str, list[tuple[str, int]]]:
    """The effects table itself, read-only: (effect_key, fence) per step id."""
    found: dict[str, list[tuple[str, int]]] = {}
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as ledger:
        for step_id, key, fence in ledger.execute(
            "SELECT step_id, effect_key, fence FROM effects ORDER BY fence"
        ):
            found.setdefault(step_id, []).append((key, fence))
    return found


def account(
    view: dict[str, Any], effects: dict[str, list[tuple[str, int]]], killed: tuple[str, str, int]
) -> list[str]:
    """The ledger's account as printed lines; raises DemoError on anything the ledger promises
    that did not hold."""
    killed_runner, killed_step, killed_fence = killed
    lines = [f"task {view['id']}  state {view['state']}  plan {view['plan_hash'][:12]}"]
    problems: list[str] = []
    if view["state"] != "SUCCEEDED":
        problems.append(f"the task ended {view['state']} ({view.get('reason')})")
    for position, step in enumerate(view["steps"], start=1):
        mine = effects.get(step["id"], [])
        expected_key = effect_key(step["id"], step["payload_hash"])
        lines.append(
            f"  step {position} {step['name']:<9} {step['state']:<10} id {step['id']}"
            f"  effects {len(mine)}  effect_key {(step['effect_key'] or '-')[:16]}"
        )
        for attempt in step["attempts"]:
            note = ""
            if attempt["runner_id"] == killed_runner and attempt["fence"] == killed_fence:
                note = "  <- SIGKILLed mid-step; fenced out by the supervisor's clock"
            elif step["id"] == killed_step and attempt["state"] == "committed":
                note = "  <- replayed: same step id, new attempt, higher fence"
            lines.append(
                f"      attempt {attempt['attempt']}  fence {attempt['fence']:<16}"
                f" {attempt['runner_id']:<14} {attempt['state']}{note}"
            )
        if step["state"] != "committed":
            problems.append(f"step {step['name']} is {step['state']}, not committed")
        if len(mine) != 1:
            problems.append(f"step {step['name']} has {len(mine)} effects in the ledger")
        elif mine[0][0] != expected_key or step["effect_key"] != expected_key:
            problems.append(f"step {step['name']}'s effect is not keyed sha256(step_id, hash)")
    stray = set(effects) - {s["id"] for s in view["steps"]}
    if stray:
        problems.append(f"effects for steps outside the task: {sorted(stray)}")
    replay = next((s for s in view["steps"] if s["id"] == killed_step), None)
    if replay is not None:
        states = {(a["runner_id"], a["fence"]): a["state"] for a in replay["attempts"]}
        if states.get((killed_runner, killed_fence)) == "committed":
            problems.append("the killed runner's attempt committed: the kill came too late")
        winners = [a for a in replay["attempts"] if a["state"] == "committed"]
        if len(winners) != 1 or winners[0]["runner_id"] == killed_runner:
            problems.append(f"step {replay['name']} was not replayed by the other runner")
        elif winners[0]["fence"] <= killed_fence:
            problems.append(f"step {replay['name']}'s replay did not take a higher fence")
    total = sum(len(v) for v in effects.values())
    lines.append(
        f"effects in the ledger: {total} for {len(view['steps'])} steps"
        + (" (exactly one each)" if not problems else "")
    )
    if problems:
        raise DemoError("; ".join(problems) + "\n" + "\n".join(lines))
    return lines


def stopped_cleanly(children: Children, killed_runner: str) -> list[str]:
    """After SIGTERM, the supervisor and the surviving runner must have exited 0."""
    # the stand-in is a test double: how it dies proves nothing
    return children.exited_badly(ignoring=(killed_runner, "stand-in-model"))


def run(*, keep: bool) -> int:
    """Run the demo; print the ledger's account and return 0, or 1 on any surprise.

    The account (each step, its attempts and fences, its one effect, the terminal state) is
    checked against the effects table and `tether-supervisor check`. A surprise prints one
    line saying what was off and the tail of each process's log. Every child is stopped
    before the return; the temporary folder is removed unless the demo failed (then its path
    is printed, logs inside) or `keep` is set.
    """
    deadline = Deadline(DEADLINE_S)
    folder = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    children = Children(folder)
    failure: str | None = None
    try:
        say("== tether demo: two runners, one SIGKILLed mid-step (a revoked server) ==")
        setup = start_everything(children, folder, deadline)
        with httpx.Client(
            base_url=setup.supervisor_url,
            headers={"Authorization": f"Bearer {setup.operator_token}"},
            trust_env=False,
            timeout=10.0,
        ) as http:
            task_id = submit(http)
            progress = Progress()
            killed = kill_the_holder(http, task_id, children, progress, deadline)
            final = wait_for_end(http, task_id, progress, deadline)
        children.stop_all()
        problems = stopped_cleanly(children, killed[0])
        if problems:
            raise DemoError("after SIGTERM: " + ", ".join(problems))
        say("")
        say("== the ledger's account ==")
        for line in account(final, effects_by_step(setup.db), killed):
            say(line)
        say(f"tether-supervisor check: {ledger_check(setup.db)}")
        say(
            f"demo ok: {killed[0]} was SIGKILLed mid-step, the other runner replayed it,"
            f" every step has exactly one effect, task {final['state']}"
            f" ({DEADLINE_S - deadline.left():.1f} s)"
        )
    except DemoError as exc:
        failure = str(exc)
        return 1
    except KeyboardInterrupt:
        failure = "interrupted"
        return 130
    else:
        return 0
    finally:
        children.stop_all()
        if failure is not None:
            print(f"demo: error: {failure}", file=sys.stderr)
            if failure != "interrupted":
                print(children.report(), file=sys.stderr)
            print(f"demo: logs kept in {folder}", file=sys.stderr)
        elif keep:
            say(f"logs and ledger kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="python -m examples.demo",
        description="Run a supervisor, the stand-in model and two runners on 127.0.0.1, kill"
        " the runner holding a lease mid-step, and print the ledger's account.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    return run(keep=args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
