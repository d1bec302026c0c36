"""Preemption notice -> another runner holding the step, and agent turns lost (issue 27: at most
2 x `preemption_poll_s` + 1 s, and no turn lost when the notice comes mid model call).

One supervisor on its own ledger file, the stand-in model and the stand-in metadata service
(examples/standin_metadata.py, in AWS's shape), each a process on 127.0.0.1. Each round: an
`agent` task (no repository) is queued, then runner `spot` starts with `preemption = "aws"`
at the default poll (2 s) and takes it; the model answers its first turn and holds its second.
Runner `other` (no preemption) starts and waits in a claim. The metadata service announces the
reclaim (two minutes ahead); the model's held answer goes out once `spot` has logged the
notice (and no sooner than `ANSWER_AFTER_S` after it), inside the notice's window, so the
notice comes mid model call by construction (an answer before the runner heard the notice
would let it finish the step). The figures, all on this machine's clock: notice -> `spot`'s
attempt ended (released), notice -> `other`'s attempt granted (the step held again), and the
turns lost: model turns of the round asked more than once (the stand-in logs every request by
how many answers its conversation already holds). Both runners stop after each round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench import seed
from bench.procs import children, free_port
from bench.stack import Stack, wait_ready
from tether.supervisor.ledger import StepSpec, TaskSpec

POOL = "spot"
POLL_S = 2.0  # the runner's default preemption_poll_s
ANSWER_AFTER_S = 0.5  # the held model answer arrives this long after the notice
TIMEOUT_S = 60.0
SCENARIO: dict[str, Any] = {
    "turns": [
        {
            "name": "first",
            "assistant_turns": 0,
            "tool_calls": [{"name": "write_file", "arguments": {"path": "a.md", "content": "a"}}],
        },
        {
            "name": "held",
            "assistant_turns": 1,
            "hold_s": 600,
            "holds": 1,
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "b.md", "content": "b"}},
                {"name": "list_files", "arguments": {"path": "."}},
            ],
        },
        {"name": "done", "assistant_turns": 2, "text": "done"},
    ]
}


def target_s(poll_s: float = POLL_S) -> float:
    return 2 * poll_s + 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preemption:
    poll_s: float
    rounds: int
    heard_s: tuple[float, ...]  # notice -> the runner logged it, per round
    released_s: tuple[float, ...]  # notice -> the preempted attempt ended, per round
    held_s: tuple[float, ...]  # notice -> another runner's attempt granted, per round
    turns_lost: int  # model turns asked more than once, over every round
    succeeded: int  # rounds whose task succeeded
    p50_held_s: float
    max_held_s: float
    target_s: float


def _spec(key: str, pool: str) -> TaskSpec:
    payload = {"messages": [{"role": "user", "content": f"notes {key}"}], "allowed_commands": []}
    return TaskSpec(
        tenant=seed.TENANT,
        idempotency_key=key,
        steps=(StepSpec(name="notes", kind="agent", payload=payload),),
        pool=pool,
    )


def _attempts(db: Path, task_id: str) -> list[tuple[str, str, float, float | None]]:
    """(runner_id, state, granted_at, ended_at) of the task's attempts, in order."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT a.runner_id, a.state, a.granted_at, a.ended_at FROM attempts a"
            " JOIN steps s ON s.id = a.step_id WHERE s.task_id = ? ORDER BY a.attempt",
            (task_id,),
        ).fetchall()
    return [(str(r[0]), str(r[1]), float(r[2]), r[3]) for r in rows]


def _held_by(db: Path, task_id: str, runner_id: str) -> list[Any]:
    """The task's attempts once `runner_id` has one, else nothing."""
    attempts = _attempts(db, task_id)
    return attempts if any(a[0] == runner_id for a in attempts) else []


def _ended(db: Path, key: str) -> str | None:
    return seed.ended(db, POOL).get(key)


def _heard(log: Path) -> float | None:
    """When the runner logged the notice (its JSON line's timestamp, this machine's clock)."""
    for line in log.read_text(errors="replace").splitlines():
        if '"event": "preemption notice:' in line:
            stamp = str(json.loads(line)["timestamp"]).replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    return None


def _claiming(db: Path, runner_id: str) -> bool:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT 1 FROM runners WHERE runner_id = ?", (runner_id,)).fetchone()
    return row is not None


def _until(what: str, check: Any, timeout_s: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise RuntimeError(f"waited {timeout_s:.0f} s for {what}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Round:
    heard_s: float
    released_s: float | None  # None: the first attempt did not end released
    held_s: float
    turns_lost: int
    succeeded: bool


def run(stack: Stack, *, rounds: int, poll_s: float = POLL_S) -> Preemption:
    """Measure on `stack`'s running supervisor and model; the `POOL` token must exist before
    the supervisor started."""
    metadata_port = free_port()
    argv = [sys.executable, "-m", "examples.standin_metadata", "--port", str(metadata_port)]
    metadata = stack.kids.start("metadata", argv)
    metadata_url = f"http://127.0.0.1:{metadata_port}"
    wait_ready(f"{metadata_url}/_admin/stats", metadata)
    try:
        done = [_round(stack, n, metadata_url, poll_s) for n in range(rounds)]
    finally:
        stack.kids.stop(metadata)
    held = [r.held_s for r in done]
    return Preemption(
        poll_s=poll_s,
        rounds=rounds,
        heard_s=tuple(r.heard_s for r in done),
        released_s=tuple(r.released_s for r in done if r.released_s is not None),
        held_s=tuple(held),
        turns_lost=sum(r.turns_lost for r in done),
        succeeded=sum(r.succeeded for r in done),
        p50_held_s=statistics.median(held),
        max_held_s=max(held),
        target_s=target_s(poll_s),
    )


def _round(stack: Stack, n: int, metadata_url: str, poll_s: float) -> Round:
    """One round (see the module docstring), on a task of its own and two fresh runners."""
    model = stack.model_url.removesuffix("/v1")
    cache = Path(tempfile.mkdtemp(prefix="preempt-cache-", dir=stack.workdir))
    httpx.delete(f"{metadata_url}/_admin/notice").raise_for_status()
    httpx.post(f"{model}/_admin/scenario", json=SCENARIO).raise_for_status()
    since = len(httpx.get(f"{model}/_admin/stats").json()["asked"])

    def asked() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = httpx.get(f"{model}/_admin/stats").json()["asked"]
        return found[since:]

    key = f"round-{n}"
    [(task_id, _hash)] = seed.create_tasks(
        stack.db, POOL, 1, approve=True, make=lambda _key, pool: _spec(key, pool)
    )
    watching = {"TETHER_PREEMPTION": "aws", "TETHER_PREEMPTION_URL": metadata_url}
    env = {"CACHE_DIRECTORY": str(cache), "TETHER_PREEMPTION_POLL_S": str(poll_s)}
    spot = stack.start_runners(f"spot{n}", POOL, 1, 1, env={**env, **watching})
    other: list[Any] = []
    try:
        _until("spot's held call", lambda: [a["turn"] for a in asked()] == ["first", "held"])
        other = stack.start_runners(f"other{n}", POOL, 1, 1, env=env)
        _until("the other runner's claim", lambda: _claiming(stack.db, f"other{n}-0"))
        notice_at = time.time()
        httpx.post(f"{metadata_url}/_admin/notice", json={"in_s": 120}).raise_for_status()
        time.sleep(ANSWER_AFTER_S)
        heard_at = _until("spot to hear it", lambda: _heard(stack.workdir / f"spot{n}-0.log"))
        httpx.post(f"{model}/_admin/release").raise_for_status()
        attempts = _until("the grant", lambda: _held_by(stack.db, task_id, f"other{n}-0"))
        _runner, state, _granted, ended_at = attempts[0]
        end = _until("the task to end", lambda: _ended(stack.db, key))
        counts = Counter(a["turn_index"] for a in asked())
    finally:
        stack.kids.stop_all([*spot, *other], grace_s=10)
        shutil.rmtree(cache, ignore_errors=True)
    return Round(
        heard_s=heard_at - notice_at,
        released_s=ended_at - notice_at if state == "released" and ended_at else None,
        held_s=attempts[-1][2] - notice_at,
        turns_lost=sum(c - 1 for c in counts.values()),
        succeeded=end.startswith("SUCCEEDED"),
    )


def measure(workdir: Path, *, rounds: int) -> Preemption:
    """This measurement on its own supervisor and ledger file under `workdir`."""
    folder = workdir / "preemption"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "ledger.db"
    seed.create_tasks(db, "warm", 1, approve=False)  # create and migrate the file
    with children(folder) as kids:
        stack = Stack(kids=kids, workdir=folder, db=db)
        stack.token(POOL)
        stack.start_supervisor()
        stack.start_model()
        try:
            return run(stack, rounds=rounds)
        finally:
            stack.stop_supervisor()


def describe(found: Preemption) -> str:
    met = "PASS" if found.max_held_s <= found.target_s and found.turns_lost == 0 else "MISS"
    released = statistics.median(found.released_s) if found.released_s else float("nan")
    return (
        f"preemption notice -> another runner holding the step: p50 {found.p50_held_s:.2f} s,"
        f" max {found.max_held_s:.2f} s over {found.rounds} rounds (heard after p50"
        f" {statistics.median(found.heard_s):.2f} s, released after {released:.2f} s); turns"
        f" lost {found.turns_lost}; target <= {found.target_s:g} s (2 x poll {found.poll_s:g} s"
        f" + 1 s) and 0 lost: {met}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.preemption", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where the work folder goes")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its logs)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-preemption-", dir=args.dir))
    try:
        found = measure(workdir, rounds=args.rounds)
    finally:
        if args.keep:
            print(f"work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(dataclasses.asdict(found), indent=2))
    print(describe(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
