"""Read models over the ledger: the task view with what the task waits for, listings, the
pools' queues and runners, the event journal and the review record. Pure reads; they run on a
read-only connection and never block writes. They report what the rules decide and decide
nothing themselves; `now` is the supervisor's clock, passed in by the store."""

from __future__ import annotations

import datetime
import sqlite3
from collections.abc import Iterable
from typing import Any, Final

from supervisor.ledger import operator
from supervisor.ledger.errors import InvalidRequest, NotFound
from supervisor.ledger.outbox import OutboxState
from supervisor.ledger.states import TERMINAL, StepState, TaskState
from supervisor.ledger.tx import loads
from supervisor.ledger.verification import check_runs_at, findings, problems_of, review_verdict
from tether.messages import PoolStatus, RunnerSeen

PAGE_MAX = 200

# A runner counts as seen recently (status, /metrics) if it claimed within this: an idle runner
# claims at least every `claim_wait_max_s` (30 s by default), so two minutes is four missed
# claims. A runner whose every slot runs a long step does not claim either, so it drops out of
# this count until a slot frees; `task show` still says when it was last seen.
RUNNER_RECENT_S: Final = 120.0

SKIPPED: Final = "skipped"
# A step's state as views show it: the steps a failed or cancelled task never ran are
# `skipped`. The ledger leaves them `waiting` (failed) or marks them `cancelled` (cancelled);
# either way they wait for nothing and must not count as waiting or queued work.
_SHOWN_STATE = (
    f"CASE WHEN t.state IN ('{TaskState.FAILED}', '{TaskState.CANCELLED}') AND s.attempt = 0"
    f" AND s.state IN ('{StepState.WAITING}', '{StepState.QUEUED}', '{StepState.CANCELLED}')"
    f" THEN '{SKIPPED}' ELSE s.state END"
)


def iso(at: float | None) -> str | None:
    """An epoch time as ISO 8601 in UTC to the millisecond, e.g. `2025-01-02T03:04:05.678Z`."""
    if at is None:
        return None
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


def waiting_for(db: sqlite3.Connection, task: sqlite3.Row, now: float) -> dict[str, Any] | None:
    """What keeps the task's next step from running, or None when a step runs, the task is
    verifying, or it has ended. `reason` is one of:

    - `approval`: the plan is not approved yet;
    - `budget`: the tenant has spent its token budget (`spent` >= `budget`), so the claim rule
      (`fencing.claim`) grants none of its steps;
    - `gate`: an unkeyed effect (`step`) waits for an operator to open its gate for the
      request's `digest`; `uncertain`: an effect may have reached its receiver (an unkeyed
      one whose send went unanswered, or a keyed one still unanswered at its deadline) and
      only an operator can say whether it happened (docs/design.md, Effects);
    - `runner`: a step is queued for a runner of `pool` serving `kind`. `last_seen_s` is how
      long ago such a runner last claimed (null: never); `pool_last_seen_s` the same for any
      runner of the pool, so a pool whose runners serve other kinds can be told from an empty
      one. A runner seen a moment ago means the pool is busy with earlier work.

    Checked in the order that releases a task: approval, then a gate or an uncertain effect,
    then the budget, then a runner.
    """
    state = TaskState(task["state"])
    if state is TaskState.PLANNED:
        return {"reason": "approval"}
    if state not in (TaskState.QUEUED, TaskState.RUNNING):
        return None
    operator_word = db.execute(
        "SELECT s.name, o.state, o.digest FROM outbox o JOIN steps s ON s.id = o.step_id"
        " WHERE o.task_id = ? AND o.state IN (?, ?) ORDER BY s.position LIMIT 1",
        (task["id"], OutboxState.GATED.value, OutboxState.UNCERTAIN.value),
    ).fetchone()
    if operator_word is not None:
        reason = "gate" if operator_word["state"] == OutboxState.GATED else "uncertain"
        return {"reason": reason, "step": operator_word["name"], "digest": operator_word["digest"]}
    step = db.execute(
        "SELECT kind, state FROM steps WHERE task_id = ? AND state IN (?, ?)"
        " ORDER BY position LIMIT 1",
        (task["id"], StepState.QUEUED.value, StepState.LEASED.value),
    ).fetchone()
    if step is None or step["state"] == StepState.LEASED:
        return None
    spending = db.execute(
        "SELECT token_budget, tokens_used FROM tenants WHERE name = ?", (task["tenant"],)
    ).fetchone()
    if (
        spending is not None
        and spending["token_budget"] is not None
        and spending["tokens_used"] >= spending["token_budget"]
    ):
        return {
            "reason": "budget", "tenant": task["tenant"], "spent": spending["tokens_used"],
            "budget": spending["token_budget"],
        }  # fmt: skip
    seen = db.execute(
        "SELECT MAX(last_seen) AS any_kind,"
        " MAX(CASE WHEN EXISTS (SELECT 1 FROM json_each(kinds_json) WHERE value = ?)"
        " THEN last_seen END) AS this_kind FROM runners WHERE pool = ?",
        (step["kind"], task["pool"]),
    ).fetchone()
    return {
        "reason": "runner", "pool": task["pool"], "kind": step["kind"],
        "last_seen_s": _ago(now, seen["this_kind"]),
        "pool_last_seen_s": _ago(now, seen["any_kind"]),
    }  # fmt: skip


def tenant_budget(db: sqlite3.Connection, tenant: str) -> dict[str, Any] | None:
    """The tenant's `Budget` (`operator.budget_of`) as a task view shows it; None for a
    tenant the ledger holds no row for."""
    try:
        found = operator.budget_of(db, tenant)
    except NotFound:
        return None
    return {"tenant": tenant, "spent": found.spent, "budget": found.budget, "left": found.left}


def _ago(now: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, now - at), 1)


def task_view(
    db: sqlite3.Connection, task_id: str, tenant: str | None = None, *, now: float
) -> dict[str, Any]:
    """The task with its steps, attempts, fences, last sequence number and what it waits for.
    Attempts' times are ISO 8601 (UTC); a failed or cancelled task's unrun steps are
    `skipped`. Each step shows its candidate, bundle, check runs, the problems the
    supervisor's evidence found against its result and its last checkpoint (turn, fence);
    `findings` are what verification holds against the task (`verification.findings`)."""
    row = _task_row(db, tenant, task_id)
    steps = db.execute(
        f"SELECT s.*, {_SHOWN_STATE} AS shown_state, e.effect_key FROM steps s"
        " JOIN tasks t ON t.id = s.task_id LEFT JOIN effects e ON e.step_id = s.id"
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
                "granted_at": iso(a["granted_at"]), "ended_at": iso(a["ended_at"]),
                "usage": loads(a["usage_json"]),
            }
        )  # fmt: skip
    checks: dict[str, list[dict[str, Any]]] = {}
    for c in db.execute(
        "SELECT c.* FROM check_runs c JOIN steps s ON s.id = c.step_id WHERE s.task_id = ?"
        " ORDER BY c.step_id, c.name",
        (task_id,),
    ):
        checks.setdefault(c["step_id"], []).append(
            {
                "name": c["name"], "log": c["log_digest"], "exit_code": c["exit_code"],
                "duration_s": c["duration_s"],
            }
        )  # fmt: skip
    held = {
        r["step_id"]: {"turn": r["turn"], "fence": r["fence"]}
        for r in db.execute(
            "SELECT k.step_id, k.turn, k.fence FROM checkpoints k JOIN steps s"
            " ON s.id = k.step_id WHERE s.task_id = ?",
            (task_id,),
        )
    }
    effects = effect_views(db, task_id)
    rejections = [
        {"step_id": r["step_id"], "fence": r["fence"], "code": r["code"], "detail": r["detail"]}
        for r in db.execute(
            "SELECT * FROM rejections WHERE task_id = ? ORDER BY id", (task_id,)
        ).fetchall()
    ]
    return {
        **_summary(row),
        "waiting_for": waiting_for(db, row, now),
        "budget": tenant_budget(db, row["tenant"]),
        "steps": [
            {
                "id": s["id"], "name": s["name"], "kind": s["kind"], "state": s["shown_state"],
                "payload_hash": s["payload_hash"], "effect_key": s["effect_key"],
                "fence": s["fence"], "output": loads(s["output_json"]),
                "candidate_sha": s["candidate_sha"], "bundle": s["bundle"],
                "checks": checks.get(s["id"], []),
                "problems": [p.as_dict() for p in problems_of(s["evidence_json"])],
                "checkpoint": held.get(s["id"]), "attempts": attempts.get(s["id"], []),
                "effect": effects.get(s["id"]),
            }
            for s in steps
        ],
        "findings": [p.as_dict() for p in findings(db, row)],
        "rejections": rejections,
    }  # fmt: skip


def effect_views(db: sqlite3.Connection, task_id: str) -> dict[str, dict[str, Any]]:
    """The task's effects by step id, as `tether.messages.EffectView`: the request as rendered
    (credentials appear only as their `{{ credential.<name> }}` placeholders, never their
    values), its digest and key, every delivery attempt, the last gate opening and the
    operator's word on an uncertain effect."""
    deliveries: dict[str, list[dict[str, Any]]] = {}
    for d in db.execute(
        "SELECT d.* FROM deliveries d JOIN outbox o ON o.step_id = d.step_id"
        " WHERE o.task_id = ? ORDER BY d.step_id, d.attempt",
        (task_id,),
    ):
        deliveries.setdefault(d["step_id"], []).append(
            {
                "attempt": d["attempt"], "started_at": iso(d["started_at"]),
                "ended_at": iso(d["ended_at"]), "answer": d["answer"],
                "sent": None if d["sent"] is None else bool(d["sent"]), "status": d["status"],
                "detail": d["detail"], "error": d["error"], "opening": d["opening"],
            }
        )  # fmt: skip
    gates: dict[str, dict[str, Any]] = {}
    resolved: dict[str, dict[str, Any]] = {}
    for a in db.execute(
        "SELECT a.* FROM effect_decisions a JOIN outbox o ON o.step_id = a.step_id"
        " WHERE o.task_id = ? ORDER BY a.id",
        (task_id,),
    ):
        if a["action"] == "open":
            gates[a["step_id"]] = {
                "opened_by": a["by"], "opened_at": iso(a["at"]), "digest": a["digest"],
            }  # fmt: skip
        else:
            resolved[a["step_id"]] = {
                "by": a["by"], "at": iso(a["at"]), "happened": a["action"] == "happened",
            }  # fmt: skip
    return {
        o["step_id"]: {
            "kind": o["kind"], "keyed": bool(o["keyed"]), "state": o["state"],
            "request": loads(o["request_json"]), "digest": o["digest"], "key": o["effect_key"],
            "deadline_at": iso(o["deadline_at"]), "openings": o["openings"],
            "deliveries": deliveries.get(o["step_id"], []),
            "gate": gates.get(o["step_id"]), "resolved": resolved.get(o["step_id"]),
        }
        for o in db.execute("SELECT * FROM outbox WHERE task_id = ?", (task_id,))
    }  # fmt: skip


def list_tasks(
    db: sqlite3.Connection,
    tenant: str,
    state: str | None,
    cursor: int | None,
    limit: int,
    *,
    now: float,
) -> dict[str, Any]:
    """The tenant's tasks, newest first, each with its steps committed and in all and what it
    waits for; `next` is the cursor for the following page."""
    if state is not None and state not in TaskState.__members__:
        raise InvalidRequest(f"state must be one of {', '.join(TaskState.__members__)}")
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidRequest(f"limit must be 1..{PAGE_MAX}")
    sql = (
        "SELECT t.*, (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id) AS steps_total,"
        " (SELECT COUNT(*) FROM steps s WHERE s.task_id = t.id AND s.state = ?)"
        " AS steps_committed FROM tasks t WHERE t.tenant = ?"
    )
    params: list[Any] = [StepState.COMMITTED.value, tenant]
    if state is not None:
        sql += " AND t.state = ?"
        params.append(state)
    if cursor is not None:
        sql += " AND t.created_order < ?"
        params.append(cursor)
    sql += " ORDER BY t.created_order DESC LIMIT ?"
    params.append(limit + 1)
    rows = db.execute(sql, params).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "tasks": [
            {
                **_summary(r), "steps_committed": r["steps_committed"],
                "steps_total": r["steps_total"], "waiting_for": waiting_for(db, r, now),
            }
            for r in rows
        ],
        "next": str(rows[-1]["created_order"]) if more else None,
    }  # fmt: skip


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
    run; `observation`: recorded by the ledger or observed by the supervisor and its runners.
    `verdict` is `verification.review_verdict`."""
    task = _task_row(db, tenant, task_id)
    state = TaskState(task["state"])
    verdict = review_verdict(db, task)
    runs = check_runs_at(db, task_id, verdict.candidate_sha)
    expected = loads(task["expected_checks_json"])
    observed_checks = {
        name: None
        if name not in runs
        else {"log": runs[name]["log_digest"], "exit_code": runs[name]["exit_code"]}
        for name in expected
    }
    attempts = db.execute(
        "SELECT a.state, COUNT(*) AS n FROM attempts a JOIN steps s ON s.id = a.step_id"
        " WHERE s.task_id = ? GROUP BY a.state",
        (task_id,),
    ).fetchall()
    rejected = db.execute(
        "SELECT COUNT(*) FROM rejections WHERE task_id = ?", (task_id,)
    ).fetchone()[0]

    effects = effect_views(db, task_id)
    names = {
        r["id"]: r["name"] for r in db.execute("SELECT id, name FROM steps WHERE task_id = ?",
                                               (task_id,))
    }  # fmt: skip
    questions: list[str] = [p.reason for p in findings(db, task)]
    questions += [
        f"effect {names[step_id]!r} is uncertain: an operator must say whether it happened"
        for step_id, effect in effects.items()
        if effect["state"] == OutboxState.UNCERTAIN
    ]
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
        "expected_checks": _field(expected, "expectation"),
        "observed_checks": _field(observed_checks, "observation"),
        "observed_terminal_state": _field(
            state.value if state in TERMINAL else None, "observation"
        ),
        "reviewer_decision": _field(loads(task["reviewer_decision"]), "observation"),
        "cleanup_proof": _field(
            {
                "live_leases": verdict.live_leases,
                "attempts_by_state": {r["state"]: r["n"] for r in attempts},
                "removed": removal_records(db, task_id),
            },
            "observation",
        ),
        "effects": _field(
            [
                {
                    "step": names[step_id],
                    "kind": e["kind"],
                    "keyed": e["keyed"],
                    "state": e["state"],
                    "digest": e["digest"],
                    "key": e["key"],
                    "deliveries": e["deliveries"],
                    "gate": e["gate"],
                    "resolved": e["resolved"],
                }
                for step_id, e in sorted(effects.items(), key=lambda item: _position(item[0]))
            ],
            "observation",
        ),
        "unresolved_questions": _field(questions, "observation"),
        "verdict": {"acceptable": verdict.acceptable, "reasons": list(verdict.reasons)},
    }


def _position(step_id: str) -> int:
    return int(step_id.rsplit(".", 1)[1])


_REMOVAL_FIELDS = ("path", "bytes_removed", "files_removed", "gone")


def removal_records(db: sqlite3.Connection, task_id: str) -> list[dict[str, Any]]:
    """The runners' records of removing their workspaces, from the committed outputs that hold
    one (an `agent` step's `cleanup`: path, bytes and files removed, gone), by step."""
    found: list[dict[str, Any]] = []
    for row in db.execute(
        "SELECT id, output_json FROM steps WHERE task_id = ? AND state = ? ORDER BY position",
        (task_id, StepState.COMMITTED.value),
    ):
        output = loads(row["output_json"])
        cleanup = output.get("cleanup") if isinstance(output, dict) else None
        if isinstance(cleanup, dict):
            found.append({"step_id": row["id"], **{k: cleanup.get(k) for k in _REMOVAL_FIELDS}})
    return found


def queue_depth(db: sqlite3.Connection) -> dict[str, int]:
    """Steps by the state views show (a failed or cancelled task's unrun steps are `skipped`)."""
    return {
        r["state"]: r["n"]
        for r in db.execute(
            f"SELECT {_SHOWN_STATE} AS state, COUNT(*) AS n FROM steps s"
            " JOIN tasks t ON t.id = s.task_id GROUP BY 1"
        ).fetchall()
    }


# When a queued step was queued: after its last attempt ended, else when the step before it
# committed, else when its task was approved (the ledger stamps no queue time of its own).
_QUEUED_SINCE = (
    "COALESCE((SELECT MAX(a.ended_at) FROM attempts a WHERE a.step_id = s.id),"
    " (SELECT p.committed_at FROM steps p WHERE p.task_id = s.task_id"
    " AND p.position = s.position - 1), t.approved_at, t.created_at)"
)


def pool_status(db: sqlite3.Connection, now: float, also: Iterable[str] = ()) -> list[PoolStatus]:
    """Per pool, by name: steps queued and in flight in live tasks, how long the oldest queued
    step has waited, and the runners that claimed there within `RUNNER_RECENT_S`, most recent
    first. Every pool with work or a recent runner is listed, and each of `also`."""
    queues = {
        r["pool"]: r
        for r in db.execute(
            f"SELECT t.pool, SUM(s.state = ?) AS queued, SUM(s.state = ?) AS in_flight,"
            f" MIN(CASE WHEN s.state = ? THEN {_QUEUED_SINCE} END) AS oldest"
            " FROM steps s JOIN tasks t ON t.id = s.task_id"
            " WHERE s.state IN (?, ?) AND t.state IN (?, ?) GROUP BY t.pool",
            (
                StepState.QUEUED.value, StepState.LEASED.value, StepState.QUEUED.value,
                StepState.QUEUED.value, StepState.LEASED.value,
                TaskState.QUEUED.value, TaskState.RUNNING.value,
            ),
        )
    }  # fmt: skip
    runners: dict[str, list[RunnerSeen]] = {}
    for r in db.execute(
        "SELECT pool, runner_id, kinds_json, last_seen FROM runners WHERE last_seen >= ?"
        " ORDER BY pool, last_seen DESC, runner_id",
        (now - RUNNER_RECENT_S,),
    ):
        runners.setdefault(r["pool"], []).append(
            RunnerSeen(
                runner_id=r["runner_id"], kinds=tuple(loads(r["kinds_json"])),
                last_seen_s=_ago(now, r["last_seen"]) or 0.0,
            )
        )  # fmt: skip
    pools = sorted(set(queues) | set(runners) | set(also))
    return [
        PoolStatus(
            pool=pool,
            queued=int(queues[pool]["queued"]) if pool in queues else 0,
            in_flight=int(queues[pool]["in_flight"]) if pool in queues else 0,
            oldest_queued_s=_ago(now, queues[pool]["oldest"]) if pool in queues else None,
            runners=tuple(runners.get(pool, ())),
        )
        for pool in pools
    ]
