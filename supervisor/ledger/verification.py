"""Verification (VERIFYING -> SUCCEEDED): no success without matching evidence.

Every step committed with exactly one effect; and when the task names a repository, the
approved base is still the repository's head (else `stale_base`, explicitly), a candidate SHA
was reported by the committed steps, and every expected check has an artifact digest reported
for that same candidate SHA.
"""

from __future__ import annotations

from supervisor.ledger.tx import Tx, loads


def verify(tx: Tx, task_id: str) -> str | None:
    """Answer None when the task may succeed, else the reason it fails."""
    if not tx.checks.verification:
        return None
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
    head = tx.one(
        "SELECT head_sha FROM repositories WHERE tenant = ? AND name = ?",
        (task["tenant"], task["repository"]),
    )
    if head is None or head["head_sha"] != task["approved_base_sha"]:
        current = head["head_sha"] if head else "unknown"
        return f"stale_base: approved {task['approved_base_sha']}, repository is at {current}"
    candidate = tx.one(
        "SELECT candidate_sha FROM steps WHERE task_id = ? AND candidate_sha IS NOT NULL"
        " ORDER BY position DESC LIMIT 1",
        (task_id,),
    )
    if candidate is None:
        return "unverified: no step reported a candidate SHA"
    sha = candidate["candidate_sha"]
    for check in loads(task["expected_checks_json"]):
        found = tx.one(
            "SELECT 1 FROM artifacts WHERE task_id = ? AND candidate_sha = ? AND name = ?",
            (task_id, sha, check),
        )
        if found is None:
            return f"unverified: no artifact for check {check!r} at candidate {sha}"
    return None
