"""Seeding a ledger file before a measurement starts, and reading figures back from it.

Tasks are created (and, if asked, approved) through the ledger's own rules with
`Transactions`, straight on the file and before the supervisor opens it, so seeding is never
part of what is timed. Each measurement gets its own pool, so runners of one measurement never
take another's tasks. Every task is one `chat` step (`agent_rss` seeds `agent` steps); the
stand-in model replies at once (unless a measurement sets its latency, as `overhead.paced`
does).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tether.supervisor.ledger import (
    LedgerConfig,
    StepSpec,
    TaskSpec,
    Tx,
    identity,
    operator,
    repositories,
    tokens,
)
from tether.supervisor.ledger.batch import Transactions
from tether.supervisor.ledger.schema import connect, open_ledger_file
from tether.supervisor.ledger.states import TERMINAL

TENANT = "bench"
CHUNK = 500
# A task not yet ended, from the state machine's own set of end states.
NOT_ENDED = "state NOT IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(TERMINAL)))


def spec(key: str, pool: str) -> TaskSpec:
    payload = {"messages": [{"role": "user", "content": f"no-op {key}"}]}
    return TaskSpec(
        tenant=TENANT,
        idempotency_key=key,
        steps=(StepSpec(name="noop", kind="chat", payload=payload),),
        pool=pool,
    )


def _open(path: Path, synchronous: str = "OFF") -> sqlite3.Connection:
    """The file, created and migrated if new; an existing one is not integrity-checked again
    (that scans the whole file) since only this suite writes it."""
    if path.exists():
        return connect(path, synchronous=synchronous)
    return open_ledger_file(path, synchronous=synchronous)


def _run(db: sqlite3.Connection, rules: Sequence[Callable[[Tx], Any]]) -> list[Any]:
    values = []
    for outcome in Transactions(db=db, config=LedgerConfig(), clock=time.time).run(rules).outcomes:
        if outcome.error is not None:
            raise outcome.error
        values.append(outcome.value)
    return values


def create_tasks(
    path: Path,
    pool: str,
    count: int,
    *,
    approve: bool,
    make: Callable[[str, str], TaskSpec] = spec,
    base_sha: str | None = None,
) -> list[tuple[str, str]]:
    """Create `count` one-step tasks in `pool` (each `make(key, pool)`, a `chat` step unless
    told); approve them (queue them) if `approve`, repository-bound ones on `base_sha` (taken
    as the head the supervisor read). Return `(task_id, plan_hash)` of each, for approving
    them later over HTTP."""
    db = _open(path)
    ids: list[tuple[str, str]] = []
    try:
        for start in range(0, count, CHUNK):
            specs = [make(f"{pool}-{i}", pool) for i in range(start, min(count, start + CHUNK))]
            created = _run(db, [_creator(s) for s in specs])
            ids += [(c.task_id, s.plan_hash) for s, c in zip(specs, created, strict=True)]
            if approve:
                _run(
                    db,
                    [
                        _approver(s, c.task_id, base_sha)
                        for s, c in zip(specs, created, strict=True)
                    ],
                )
    finally:
        db.close()
    return ids


def _creator(s: TaskSpec) -> Callable[[Tx], Any]:
    return lambda tx: identity.create_task(tx, s)


def _approver(s: TaskSpec, task_id: str, base_sha: str | None) -> Callable[[Tx], Any]:
    return lambda tx: operator.approve(tx, TENANT, task_id, s.plan_hash, base_sha, base_sha)


def add_repository(path: Path, name: str, url: str) -> None:
    """Register the bench tenant's repository `name`, read from `url` (`repo add`)."""
    db = _open(path)
    try:
        _run(db, [lambda tx: repositories.add_repository(tx, TENANT, name, url)])
    finally:
        db.close()


def create_token(path: Path, scope: str, role: str, dest: Path) -> Path:
    db = _open(path)
    try:
        [new] = _run(db, [lambda tx: tokens.create_token(tx, scope, role)])
    finally:
        db.close()
    dest.write_text(new.secret + "\n", encoding="utf-8")
    dest.chmod(0o600)
    return dest


def succeeded(path: Path, pool: str) -> int:
    db = connect(path, readonly=True)
    try:
        row = db.execute(
            "SELECT count(*) FROM tasks WHERE pool = ? AND state = 'SUCCEEDED'", (pool,)
        ).fetchone()
        return int(row[0])
    finally:
        db.close()


def step_rows(path: Path, pool: str) -> list[tuple[float, float]]:
    """(granted_at of the committing attempt, effect created_at) for each committed step."""
    db = connect(path, readonly=True)
    try:
        rows = db.execute(
            "SELECT a.granted_at, e.created_at FROM effects e"
            " JOIN attempts a ON a.step_id = e.step_id AND a.fence = e.fence"
            " JOIN tasks t ON t.id = e.task_id WHERE t.pool = ?",
            (pool,),
        ).fetchall()
        return [(float(r[0]), float(r[1])) for r in rows]
    finally:
        db.close()


def step_rows_with_messages(path: Path, pool: str) -> list[tuple[float, float, Any]]:
    """As `step_rows`, with each step's payload messages (what its model request carried)."""
    db = connect(path, readonly=True)
    try:
        rows = db.execute(
            "SELECT a.granted_at, e.created_at, s.payload_json FROM effects e"
            " JOIN attempts a ON a.step_id = e.step_id AND a.fence = e.fence"
            " JOIN steps s ON s.id = e.step_id"
            " JOIN tasks t ON t.id = e.task_id WHERE t.pool = ?",
            (pool,),
        ).fetchall()
        return [(float(r[0]), float(r[1]), json.loads(r[2])["messages"]) for r in rows]
    finally:
        db.close()


def first_grants(path: Path, pool: str) -> dict[str, float]:
    """Each task's idempotency key -> when its first step's first attempt was granted."""
    db = connect(path, readonly=True)
    try:
        rows = db.execute(
            "SELECT t.idempotency_key, min(a.granted_at) FROM attempts a"
            " JOIN steps s ON s.id = a.step_id JOIN tasks t ON t.id = s.task_id"
            " WHERE t.pool = ? AND s.position = 0 GROUP BY t.id",
            (pool,),
        ).fetchall()
        return {str(r[0]): float(r[1]) for r in rows}
    finally:
        db.close()


def ended(path: Path, pool: str) -> dict[str, str]:
    """Each ended task's idempotency key -> its state and reason (`FAILED: ...`)."""
    db = connect(path, readonly=True)
    try:
        rows = db.execute(
            "SELECT idempotency_key, state, reason FROM tasks WHERE pool = ?"
            " AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')",
            (pool,),
        ).fetchall()
        return {str(r[0]): f"{r[1]}: {r[2] or ''}" for r in rows}
    finally:
        db.close()


def output_field(path: Path, pool: str, field: str) -> str:
    """The distinct values of `field` in the committed outputs of `pool`'s steps, joined by
    "/" ("" when none committed)."""
    db = connect(path, readonly=True)
    try:
        rows = db.execute(
            "SELECT DISTINCT json_extract(e.output_json, '$.' || ?) FROM effects e"
            " JOIN tasks t ON t.id = e.task_id WHERE t.pool = ?",
            (field, pool),
        ).fetchall()
        return "/".join(sorted(str(r[0]) for r in rows))
    finally:
        db.close()


def window(path: Path, pool: str) -> tuple[int, float]:
    """Committed steps of `pool`, and the seconds from its first grant to its last commit."""
    rows = step_rows(path, pool)
    if not rows:
        return 0, 0.0
    first = min(g for g, _ in rows)
    last = max(c for _, c in rows)
    return len(rows), last - first


def steps_in_state(path: Path, pool: str, state: str) -> int:
    """Cheap for 'queued' and 'leased' (partial indexes); a scan for other states."""
    db = connect(path, readonly=True)
    try:
        row = db.execute(
            "SELECT count(*) FROM steps s JOIN tasks t ON t.id = s.task_id"
            " WHERE t.pool = ? AND s.state = ?",
            (pool, state),
        ).fetchone()
        return int(row[0])
    finally:
        db.close()


def cancel_pool(path: Path, pool: str) -> int:
    """Cancel every task of `pool` that has not ended, so leftovers of one measurement never
    sit in the queue (or hold leases) during the next. Safe beside a running supervisor."""
    db = _open(path, "FULL")
    try:
        open_ids = [
            r[0]
            for r in db.execute(
                f"SELECT id FROM tasks WHERE pool = ? AND {NOT_ENDED}",
                (pool,),
            ).fetchall()
        ]
        for start in range(0, len(open_ids), CHUNK):
            _run(db, [_canceller(t) for t in open_ids[start : start + CHUNK]])
    finally:
        db.close()
    return len(open_ids)


def _canceller(task_id: str) -> Callable[[Tx], Any]:
    return lambda tx: operator.cancel(tx, TENANT, task_id, "benchmark over")
