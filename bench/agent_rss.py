"""Runner RSS with 10 `agent` steps in flight (issue 12: at most 64 MB).

One `tether-runner` at concurrency 10 takes 10 agent tasks, each a tool loop in its own scratch
workspace (an agent step without a repository) under a cache directory of the work folder. The
stand-in model plays the same four turns to every step (`SCENARIO`): write a file, list, read
and search the tree, run an allowed command, answer; and it holds every answer `hold_s`, so
all 10 loops are mid-way at once. The runner's RSS (the process alone, and with the commands
it started) is sampled every `SAMPLE_S` while all 10 steps are leased; the peak is the figure.
The steps then finish, and how many succeeded is recorded beside it.

The runner is given `commands_without_sandbox` (`TETHER_COMMANDS_WITHOUT_SANDBOX=1`): where
bubblewrap works it changes nothing (commands run in it); where it does not, the steps would
otherwise be refused and released `operator`, and the runner would pause claiming instead of
running them (runner/agent/sandbox_policy.py). Which sandbox ran is in the JSON (`sandbox`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import seed
from bench.procs import children, rss_mb, tree_rss_mb
from bench.stack import Stack, wait_succeeded
from tether.supervisor.ledger import StepSpec, TaskSpec

IN_FLIGHT = 10
TARGET_MB = 64.0
SAMPLE_S = 0.2
COMMAND = "ls -la notes"
SCENARIO: dict[str, Any] = {
    "turns": [
        {
            "name": "write",
            "assistant_turns": 0,
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": "notes/plan.md", "content": "# plan\n" * 200},
                }
            ],
        },
        {
            "name": "look",
            "assistant_turns": 1,
            "tool_calls": [
                {"name": "list_files", "arguments": {"path": ".", "recursive": True}},
                {"name": "read_file", "arguments": {"path": "notes/plan.md"}},
                {"name": "search", "arguments": {"pattern": "plan"}},
            ],
        },
        {
            "name": "run",
            "assistant_turns": 2,
            "tool_calls": [{"name": "run", "arguments": {"command": COMMAND}}],
        },
        {"name": "done", "assistant_turns": 3, "text": "done"},
    ]
}
TURNS = len(SCENARIO["turns"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentRss:
    in_flight_mb: float  # the runner process alone, peak while all steps were leased
    with_children_mb: float  # the same, plus the git and command processes it had started
    in_flight: int  # steps leased at the peak sample (IN_FLIGHT when the reading is valid)
    samples: int  # samples taken while all IN_FLIGHT steps were leased
    hold_s: float
    model_calls: int  # the stand-in's answers: TURNS per step when every loop ran to its end
    succeeded: int
    sandbox: str  # what the steps' commands ran in ("bubblewrap", or "none" without one)


def agent_spec(key: str, pool: str) -> TaskSpec:
    payload = {
        "messages": [{"role": "user", "content": f"take notes ({key})"}],
        "allowed_commands": [COMMAND],
        "max_turns": TURNS + 2,
    }
    return TaskSpec(
        tenant=seed.TENANT,
        idempotency_key=key,
        steps=(StepSpec(name="agent", kind="agent", payload=payload),),
        pool=pool,
    )


def run(stack: Stack, *, hold_s: float, timeout_s: float = 120.0) -> AgentRss:
    pool = "agent-rss"
    seed.create_tasks(stack.db, pool, IN_FLIGHT, approve=True, make=agent_spec)
    stack.token(pool)
    script = stack.workdir / "agent-scenario.json"
    script.write_text(json.dumps(SCENARIO), encoding="utf-8")
    model = Stack(
        kids=stack.kids, workdir=stack.workdir, db=stack.db, supervisor_url=stack.supervisor_url
    )
    model.start_model(latency_s=hold_s, scenario=script)
    cache = stack.workdir / "agent-cache"
    env = {"CACHE_DIRECTORY": str(cache), "TETHER_COMMANDS_WITHOUT_SANDBOX": "1"}
    [runner] = model.start_runners(pool, pool, IN_FLIGHT, 1, env=env)
    alone = with_children = 0.0
    leased = samples = 0
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(seed.ended(stack.db, pool)) < IN_FLIGHT:
            now_leased = seed.steps_in_state(stack.db, pool, "leased")
            if now_leased >= IN_FLIGHT:
                try:
                    alone = max(alone, rss_mb(runner.pid))
                    with_children = max(with_children, tree_rss_mb(runner.pid))
                except psutil.NoSuchProcess:
                    break
                leased, samples = now_leased, samples + 1
            if runner.poll() is not None:
                raise RuntimeError(f"the agent runner exited {runner.returncode}")
            time.sleep(SAMPLE_S)
        succeeded = wait_succeeded(stack.db, pool, IN_FLIGHT, timeout_s=5.0)
        stats = httpx.get(model.model_url.removesuffix("/v1") + "/_admin/stats", timeout=5)
        calls = sum(1 for turn in stats.json()["turns"] if turn is not None)
        sandbox = seed.output_field(stack.db, pool, "sandbox")
    finally:
        stack.kids.stop(runner, grace_s=10)
        if model.model is not None:
            stack.kids.stop(model.model)
        seed.cancel_pool(stack.db, pool)
    return AgentRss(
        in_flight_mb=alone,
        with_children_mb=with_children,
        in_flight=leased,
        samples=samples,
        hold_s=hold_s,
        model_calls=calls,
        succeeded=succeeded,
        sandbox=sandbox,
    )


def _main() -> None:
    """`python -m bench.agent_rss`: this measurement alone, on a fresh supervisor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hold", type=float, default=2.0, metavar="S", help="model hold")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-agent-"))
    try:
        db = workdir / "ledger.db"
        seed.create_tasks(db, "warm", 1, approve=False)
        with children(workdir) as kids:
            stack = Stack(kids=kids, workdir=workdir, db=db)
            stack.token("agent-rss")
            stack.start_supervisor()
            print(json.dumps(dataclasses.asdict(run(stack, hold_s=args.hold)), indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _main()
