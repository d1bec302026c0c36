"""The effect domain: a step's result becomes its one effect, exactly once.

A commit is one transaction: the fence is current, the payload hash equals the intent's, the
task has not ended, the effect is inserted under `effect_key = sha256(step_id, payload_hash)`,
the step is committed and the event appended. A report for a step already committed returns
`replayed` and writes nothing: delivery is at-least-once, the effect is exactly-once.
"""

from __future__ import annotations

import sqlite3

from supervisor.ledger.decisions import Decision
from supervisor.ledger.errors import InvalidRequest, PayloadDrift, TerminalState
from supervisor.ledger.fencing import (
    about_step,
    charge,
    end_attempt,
    find_step,
    require_current,
)
from supervisor.ledger.journal import append_event
from supervisor.ledger.states import TERMINAL, AttemptState, StepState, TaskState, transition
from supervisor.ledger.tx import Tx, dumps
from supervisor.ledger.verification import verify
from tether.messages import Report
from tether.wire import Outcome, effect_key


def effect_identity(tx: Tx, step: sqlite3.Row, rep: Report) -> str | None:
    """The key the report's effect is stored under: the step's identity, so a step has one
    effect whichever attempt commits it. None when the step is committed already: a replay."""
    if step["state"] == StepState.COMMITTED:
        # Only the attempt that committed may hear `replayed`: a fenced-out worker that
        # reports late must learn the step is not its own, and the refusal is recorded.
        require_current(tx, step, rep.fence)
        return None
    return effect_key(rep.step_id, rep.payload_hash)


def report(tx: Tx, rep: Report, pool: str | None = None) -> Outcome:
    """Commit the step's one effect, or return `replayed` if it is already committed. The
    report's usage counts toward the tenant's budget once per attempt, committed or refused."""
    tx.request = "result"
    step = find_step(tx, rep.step_id, pool)
    spent = charge(tx, step, rep.fence, rep.usage)
    about = {"task_id": step["task_id"], "step_id": rep.step_id, "fence": rep.fence}
    if rep.payload_hash != step["payload_hash"]:
        raise PayloadDrift(
            f"payload hash {rep.payload_hash} is not step {rep.step_id}'s intent"
            f" {step['payload_hash']}"
        ).about(**about)
    key = effect_identity(tx, step, rep)
    if key is None:
        tx.note(Decision.REPLAYED, **_committed_attempt(tx, step))
        return Outcome.REPLAYED
    if TaskState(step["task_state"]) in TERMINAL:
        raise TerminalState(f"task {step['task_id']} is {step['task_state']}").about(**about)
    require_current(tx, step, rep.fence)
    for name, digest in rep.artifacts.items():
        if not name or not digest:
            raise InvalidRequest("artifact names and digests must be non-empty")
    if rep.artifacts and not rep.candidate_sha:
        raise InvalidRequest("artifacts must name the candidate_sha they were produced for")
    tx.run(
        "INSERT INTO effects (effect_key, step_id, task_id, fence, payload_hash, output_json,"
        " usage_json, candidate_sha, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            key, rep.step_id, step["task_id"], rep.fence, rep.payload_hash, dumps(rep.output),
            dumps(rep.usage), rep.candidate_sha, tx.now,
        ),
    )  # fmt: skip
    tx.run(
        "UPDATE steps SET state = ?, output_json = ?, candidate_sha = ?, committed_at = ?,"
        " lease_deadline = NULL, accept_deadline = NULL WHERE id = ?",
        (StepState.COMMITTED.value, dumps(rep.output), rep.candidate_sha, tx.now, rep.step_id),
    )
    end_attempt(tx, rep.step_id, rep.fence, AttemptState.COMMITTED, "committed")
    tx.db.executemany(
        "INSERT OR REPLACE INTO artifacts (task_id, step_id, candidate_sha, name, digest)"
        " VALUES (?, ?, ?, ?, ?)",
        [
            (step["task_id"], rep.step_id, rep.candidate_sha, name, digest)
            for name, digest in rep.artifacts.items()
        ],
    )
    append_event(
        tx, step["task_id"], "step_committed", step["task_state"],
        {"step_id": rep.step_id, "fence": rep.fence, "effect_key": key,
         "candidate_sha": rep.candidate_sha},
    )  # fmt: skip
    tx.note(Decision.COMMITTED, **about_step(tx, step), effect_key=key, tokens=spent)
    advance(tx, step)
    return Outcome.APPLIED


def _committed_attempt(tx: Tx, step: sqlite3.Row) -> dict[str, object]:
    """`about_step` for a committed step, whose fence was cleared: the committing attempt's."""
    about = about_step(tx, step)
    row = tx.one(
        "SELECT attempt, fence, runner_id, token_id FROM attempts WHERE step_id = ?"
        " AND state = 'committed'",
        (step["id"],),
    )
    if row is not None:
        about.update(
            attempt=row["attempt"], fence=row["fence"], runner_id=row["runner_id"],
            token_id=row["token_id"],
        )  # fmt: skip
    return about


def advance(tx: Tx, step: sqlite3.Row) -> None:
    """Queue the step after `step` (just committed; a row of `find_step`), or, when every step
    is committed, verify and end the task."""
    task_id, pool = step["task_id"], step["pool"]
    about = {"task_id": task_id, "tenant": step["tenant"], "pool": pool}
    pending = tx.one(
        "SELECT id, state FROM steps WHERE task_id = ? AND state != ? ORDER BY position LIMIT 1",
        (task_id, StepState.COMMITTED.value),
    )
    if pending is not None:
        if pending["state"] == StepState.WAITING:
            tx.run(
                "UPDATE steps SET state = ? WHERE id = ?", (StepState.QUEUED.value, pending["id"])
            )
            tx.wake(pool)
        return
    transition(tx, task_id, TaskState.VERIFYING)
    failure = verify(tx, task_id)
    if failure is None:
        transition(tx, task_id, TaskState.SUCCEEDED)
        tx.note(Decision.VERIFIED, **about, state=TaskState.SUCCEEDED.value)
    else:
        transition(tx, task_id, TaskState.FAILED, reason=failure)
        tx.note(Decision.FAILED, **about, reason=failure)
