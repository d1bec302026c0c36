"""Verification (VERIFYING -> SUCCEEDED) and the review verdict: no success, and no acceptance,
without matching evidence (docs/design.md, Verification and Review record).
"""

from __future__ import annotations

import dataclasses
import sqlite3

from supervisor.ledger.states import TERMINAL, TaskState
from supervisor.ledger.tx import Tx, loads


def repository_head(db: sqlite3.Connection, task: sqlite3.Row) -> str | None:
    """The head SHA last known for the task's repository."""
    row = db.execute(
        "SELECT head_sha FROM repositories WHERE tenant = ? AND name = ?",
        (task["tenant"], task["repository"]),
    ).fetchone()
    return None if row is None else str(row["head_sha"])


def candidate_sha(db: sqlite3.Connection, task_id: str) -> str | None:
    """The candidate SHA the task's result stands for: the last one a committed step reported."""
    row = db.execute(
        "SELECT candidate_sha FROM steps WHERE task_id = ? AND candidate_sha IS NOT NULL"
        " ORDER BY position DESC LIMIT 1",
        (task_id,),
    ).fetchone()
    return None if row is None else str(row["candidate_sha"])


def verify(tx: Tx, task_id: str) -> str | None:
    """Return None when the task may succeed, else the reason it fails.

    Every step must be committed with exactly one effect. When the task names a repository, the
    approved base must still be its head (else `stale_base`), the committed steps must have
    reported a candidate SHA, and every expected check needs an artifact for that candidate.
    """
    task = tx.one("SELECT * FROM tasks WHERE id = ?", (task_id,))
    assert task is not None
    uneven = tx.one(
        "SELECT s.id, (SELECT COUNT(*) FROM effects e WHERE e.step_id = s.id) AS n"
        " FROM steps s WHERE s.task_id = ? AND (s.state != 'committed' OR n != 1) LIMIT 1",
        (task_id,),
    )
    if uneven is not None:
        return f"unverified: step {uneven['id']} does not have exactly one effect"
    if not task["repository"]:
        return None
    head = repository_head(tx.db, task)
    if head is None or head != task["approved_base_sha"]:
        current = "unknown" if head is None else head
        return f"stale_base: approved {task['approved_base_sha']}, repository is at {current}"
    sha = candidate_sha(tx.db, task_id)
    if sha is None:
        return "unverified: no step reported a candidate SHA"
    for check in loads(task["expected_checks_json"]):
        found = tx.one(
            "SELECT 1 FROM artifacts WHERE task_id = ? AND candidate_sha = ? AND name = ?",
            (task_id, sha, check),
        )
        if found is None:
            return f"unverified: no artifact for check {check!r} at candidate {sha}"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a reviewer may accept a task's result, with the observations it rests on.

    A reviewer may reject anything, but accept only what the ledger can vouch for: a task that
    succeeded, whose runners' authority is revoked, and whose repository is at the approved
    base or the candidate that names the reviewed revision.
    """

    head_sha: str | None
    candidate_sha: str | None
    live_leases: int
    reasons: tuple[str, ...]

    @property
    def acceptable(self) -> bool:
        return not self.reasons


def review_verdict(db: sqlite3.Connection, task: sqlite3.Row) -> Verdict:
    """The verdict on `task` (a row of `tasks`), from what the ledger holds now."""
    state = TaskState(task["state"])
    head = repository_head(db, task)
    candidate = candidate_sha(db, task["id"])
    live_leases = int(
        db.execute(
            "SELECT COUNT(*) FROM attempts a JOIN steps s ON s.id = a.step_id"
            " WHERE s.task_id = ? AND a.state = 'leased'",
            (task["id"],),
        ).fetchone()[0]
    )
    reasons: list[str] = []
    if state in TERMINAL and live_leases:
        reasons.append("a runner still holds a lease on an ended task: authority not revoked")
    if task["repository"] and state is TaskState.SUCCEEDED:
        if head not in (task["approved_base_sha"], candidate):
            reasons.append(f"repository head {head} is neither the approved base nor the candidate")
        if candidate is None:
            reasons.append("the evidence names no candidate revision")
    if state is not TaskState.SUCCEEDED:
        reasons.append(f"task ended {state}" if state in TERMINAL else "task has not ended")
    return Verdict(
        head_sha=head, candidate_sha=candidate, live_leases=live_leases, reasons=tuple(reasons)
    )
