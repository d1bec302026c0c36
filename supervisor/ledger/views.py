"""Read models over the ledger: the task view, listings, the event journal and the review
record. Pure reads; they run on a read-only connection and never block writes. They report what
the rules decide and decide nothing themselves."""

from __future__ import annotations

import sqlite3
from typing import Any

from supervisor.ledger.errors import InvalidRequest, NotFound
from supervisor.ledger.states import TERMINAL, TaskState
from supervisor.ledger.tx import loads
from supervisor.ledger.verification import review_verdict

PAGE_MAX = 200


def _task_row(db: sqlite3.Connection, tenant: str | None, task_id: str) -> sqlite3.Row:
    row: sqlite3.Row | None
    if tenant is None:
        row = db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    else:
        row = db.execute(
            "SELECT * FROM tasks WHERE id = ? AND tenant = ?", (task_id, tenant)
        ).fetchone()
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row


def _summary(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "tenant": row["tenant"],
        "idempotency_key": row["idempotency_key"],
        "state": row["state"],
        "reason": row["reason"],
        "plan_hash": row["plan_hash"],
        "base_sha": row["approved_base_sha"] or row["declared_base_sha"],
        "repository": row["repository"],
        "pool": row["pool"],
        "seq": row["last_seq"],
        "created_at": row["created_at"],
    }


def task_view(db: sqlite3.Connection, task_id: str, tenant: str | None = None) -> dict[str, Any]:
    """The task with its steps, attempts, fences and last sequence number."""
    row = _task_row(db, tenant, task_id)
    steps = db.execute(
        "SELECT s.*, e.effect_key FROM steps s LEFT JOIN effects e ON e.step_id = s.id"
        " WHERE s.task_id = ? ORDER BY s.position",
        (task_id,),
    ).fetchall()
    attempts: dict[str, list[dict[str, Any]]] = {}
    for a in db.execute(
        "SELECT a.* FROM attempts a JOIN steps s ON s.id = a.step_id WHERE s.task_id = ?"
        " ORDER BY a.step_id, a.attempt",
        (task_id,),
    ):
        attempts.setdefault(a["step_id"], []).append(
            {
                "attempt": a["attempt"], "fence": a["fence"], "runner_id": a["runner_id"],
                "token_id": a["token_id"], "state": a["state"], "reason": a["reason"],
            }
        )  # fmt: skip
    rejections = [
        {"step_id": r["step_id"], "fence": r["fence"], "code": r["code"], "detail": r["detail"]}
        for r in db.execute(
            "SELECT * FROM rejections WHERE task_id = ? ORDER BY id", (task_id,)
        ).fetchall()
    ]
    return {
        **_summary(row),
        "steps": [
            {
                "id": s["id"], "name": s["name"], "kind": s["kind"], "state": s["state"],
                "payload_hash": s["payload_hash"], "effect_key": s["effect_key"],
                "fence": s["fence"], "output": loads(s["output_json"]),
                "candidate_sha": s["candidate_sha"], "attempts": attempts.get(s["id"], []),
            }
            for s in steps
        ],
        "rejections": rejections,
    }  # fmt: skip


def list_tasks(
    db: sqlite3.Connection, tenant: str, state: str | None, cursor: int | None, limit: int
) -> dict[str, Any]:
    """The tenant's tasks, newest first; `next` is the cursor for the following page."""
    if state is not None and state not in TaskState.__members__:
        raise InvalidRequest(f"state must be one of {', '.join(TaskState.__members__)}")
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidRequest(f"limit must be 1..{PAGE_MAX}")
    sql = "SELECT * FROM tasks WHERE tenant = ?"
    params: list[Any] = [tenant]
    if state is not None:
        sql += " AND state = ?"
        params.append(state)
    if cursor is not None:
        sql += " AND created_order < ?"
        params.append(cursor)
    sql += " ORDER BY created_order DESC LIMIT ?"
    params.append(limit + 1)
    rows = db.execute(sql, params).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "tasks": [_summary(r) for r in rows],
        "next": str(rows[-1]["created_order"]) if more else None,
    }


def events_after(
    db: sqlite3.Connection, task_id: str, after: int, limit: int = 500
) -> list[dict[str, Any]]:
    return [
        {
            "seq": r["seq"], "task_id": r["task_id"], "kind": r["kind"], "state": r["state"],
            "data": loads(r["data_json"]), "at": r["at"],
        }
        for r in db.execute(
            "SELECT * FROM events WHERE task_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (task_id, after, limit),
        ).fetchall()
    ]  # fmt: skip


def _field(value: Any, kind: str) -> dict[str, Any]:
    return {"value": value, "kind": kind}


def review(db: sqlite3.Connection, task_id: str, tenant: str | None = None) -> dict[str, Any]:
    """The review record (docs/design.md, Review record). `expectation`: declared before the
    run; `observation`: recorded by the ledger. `verdict` is `verification.review_verdict`."""
    task = _task_row(db, tenant, task_id)
    state = TaskState(task["state"])
    verdict = review_verdict(db, task)
    artifacts = {
        r["name"]: r["digest"]
        for r in db.execute(
            "SELECT name, digest FROM artifacts WHERE task_id = ? AND candidate_sha = ?",
            (task_id, verdict.candidate_sha),
        )
    }
    attempts = db.execute(
        "SELECT a.state, COUNT(*) AS n FROM attempts a JOIN steps s ON s.id = a.step_id"
        " WHERE s.task_id = ? GROUP BY a.state",
        (task_id,),
    ).fetchall()
    rejected = db.execute(
        "SELECT COUNT(*) FROM rejections WHERE task_id = ?", (task_id,)
    ).fetchone()[0]

    questions: list[str] = []
    if task["repository"]:
        missing = [c for c in loads(task["expected_checks_json"]) if c not in artifacts]
        if missing:
            questions.append(f"no artifact at the candidate for: {', '.join(missing)}")
    if rejected:
        questions.append(f"{rejected} rejected attempt(s) recorded; see the task's rejections")
    if state not in TERMINAL:
        questions.append(f"task is still {state}")

    return {
        "task_id": task_id,
        "owner": _field(task["owner"], "expectation"),
        "repository": _field(task["repository"], "expectation"),
        "base_commit": _field(
            task["approved_base_sha"] or task["declared_base_sha"], "expectation"
        ),
        "repository_head": _field(verdict.head_sha, "observation"),
        "candidate_sha": _field(verdict.candidate_sha, "observation"),
        "requirement_revision": _field(task["requirement_revision"], "expectation"),
        "allowed_paths": _field(loads(task["allowed_paths_json"]), "expectation"),
        "start_time": _field(task["started_at"], "observation"),
        "stop_time": _field(task["finished_at"], "observation"),
        "expected_checks": _field(loads(task["expected_checks_json"]), "expectation"),
        "observed_checks": _field(artifacts, "observation"),
        "observed_terminal_state": _field(
            state.value if state in TERMINAL else None, "observation"
        ),
        "reviewer_decision": _field(loads(task["reviewer_decision"]), "observation"),
        "cleanup_proof": _field(
            {
                "live_leases": verdict.live_leases,
                "attempts_by_state": {r["state"]: r["n"] for r in attempts},
            },
            "observation",
        ),
        "unresolved_questions": _field(questions, "observation"),
        "verdict": {"acceptable": verdict.acceptable, "reasons": list(verdict.reasons)},
    }


def queue_depth(db: sqlite3.Connection) -> dict[str, int]:
    return {
        r["state"]: r["n"]
        for r in db.execute("SELECT state, COUNT(*) AS n FROM steps GROUP BY state").fetchall()
    }
