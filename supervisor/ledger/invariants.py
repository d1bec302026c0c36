"""The ledger's invariants, checked over a whole ledger file.

Used by `tether-supervisor check` (exit 1 on any violation) and by the schedule explorer after
every event. Each check is one query that finds counter-examples; no row is a pass.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from supervisor.ledger.outbox import OutboxState
from supervisor.ledger.states import TERMINAL
from tether.wire import effect_key

_TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in TERMINAL)

# name -> (query returning offending rows, how to describe one)
_QUERIES: dict[str, tuple[str, Callable[[sqlite3.Row], str]]] = {
    "one-effect-per-step": (
        "SELECT step_id, COUNT(*) AS n FROM effects GROUP BY step_id HAVING n > 1",
        lambda r: f"step {r['step_id']} has {r['n']} effects",
    ),
    "committed-has-effect": (
        "SELECT s.id FROM steps s WHERE s.state = 'committed'"
        " AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.step_id = s.id)",
        lambda r: f"step {r['id']} is committed without an effect",
    ),
    "effect-has-commit": (
        "SELECT e.step_id FROM effects e JOIN steps s ON s.id = e.step_id"
        " WHERE s.state != 'committed'",
        lambda r: f"step {r['step_id']} has an effect but is not committed",
    ),
    "effect-matches-intent": (
        "SELECT e.step_id FROM effects e JOIN steps s ON s.id = e.step_id"
        " WHERE e.payload_hash != s.payload_hash",
        lambda r: f"step {r['step_id']}'s effect does not match its intent's payload hash",
    ),
    "no-stale-commit": (
        "SELECT e.step_id, e.fence, (SELECT MAX(a.fence) FROM attempts a"
        "  WHERE a.step_id = e.step_id AND a.granted_at <= e.created_at) AS latest"
        " FROM effects e WHERE e.step_id NOT IN (SELECT step_id FROM outbox)"
        " AND (e.fence != latest OR latest IS NULL"
        " OR NOT EXISTS (SELECT 1 FROM attempts a WHERE a.step_id = e.step_id"
        "  AND a.fence = e.fence AND a.state = 'committed'))",
        lambda r: (
            f"step {r['step_id']} committed under fence {r['fence']},"
            f" its current fence was {r['latest']}"
        ),
    ),
    "idempotency-key-unique": (
        "SELECT tenant, idempotency_key, COUNT(*) AS n FROM tasks"
        " GROUP BY tenant, idempotency_key HAVING n > 1",
        lambda r: f"tenant {r['tenant']} key {r['idempotency_key']!r} names {r['n']} tasks",
    ),
    "one-live-lease-per-step": (
        "SELECT step_id, COUNT(*) AS n FROM attempts WHERE state = 'leased'"
        " GROUP BY step_id HAVING n > 1",
        lambda r: f"step {r['step_id']} has {r['n']} live leases",
    ),
    "live-lease-is-the-steps": (
        "SELECT a.step_id, a.fence, s.state FROM attempts a JOIN steps s ON s.id = a.step_id"
        " WHERE a.state = 'leased' AND (s.state != 'leased' OR s.fence IS NOT a.fence)",
        lambda r: (
            f"step {r['step_id']} is {r['state']} but its attempt under fence {r['fence']}"
            " is still leased"
        ),
    ),
    "leased-step-has-its-lease": (
        "SELECT s.id, s.fence FROM steps s WHERE s.state = 'leased' AND NOT EXISTS"
        " (SELECT 1 FROM attempts a WHERE a.step_id = s.id AND a.fence = s.fence"
        "  AND a.state = 'leased')",
        lambda r: f"step {r['id']} is leased under fence {r['fence']} with no such live attempt",
    ),
    "fences-increase": (
        "SELECT a.step_id, a.attempt, a.fence FROM attempts a JOIN attempts b"
        " ON b.step_id = a.step_id AND b.attempt = a.attempt + 1 WHERE b.fence <= a.fence",
        lambda r: f"step {r['step_id']} attempt {r['attempt'] + 1} did not get a higher fence",
    ),
    "fence-counter-ahead": (
        "SELECT (SELECT value FROM counters WHERE name = 'fence') AS counter,"
        " (SELECT MAX(fence) FROM attempts) AS top WHERE counter < top",
        lambda r: f"fence counter {r['counter']} is below an issued fence {r['top']}",
    ),
    "success-is-complete": (
        "SELECT t.id FROM tasks t WHERE t.state = 'SUCCEEDED' AND EXISTS"
        " (SELECT 1 FROM steps s WHERE s.task_id = t.id AND s.state != 'committed')",
        lambda r: f"task {r['id']} SUCCEEDED with an uncommitted step",
    ),
    # A SUCCEEDED repository task has a final candidate (the latest step's, by position) whose
    # report came with evidence finding no problem, and a passing run of each expected check.
    "success-is-verified": (
        "SELECT t.id FROM tasks t LEFT JOIN steps f ON f.id = (SELECT s.id FROM steps s"
        "  WHERE s.task_id = t.id AND s.candidate_sha IS NOT NULL ORDER BY s.position DESC LIMIT 1)"
        " WHERE t.state = 'SUCCEEDED' AND t.repository IS NOT NULL AND ("
        " f.id IS NULL OR f.evidence_json IS NULL"
        " OR json_array_length(f.evidence_json, '$.problems') > 0"
        " OR EXISTS (SELECT 1 FROM json_each(t.expected_checks_json) c WHERE NOT EXISTS ("
        "  SELECT 1 FROM check_runs r JOIN steps s ON s.id = r.step_id WHERE s.task_id = t.id"
        "  AND r.name = c.value AND r.candidate_sha = f.candidate_sha AND r.exit_code = 0)))",
        lambda r: f"task {r['id']} SUCCEEDED without matching verification evidence",
    ),
    "checkpoint-of-an-attempt": (
        "SELECT k.step_id, k.fence FROM checkpoints k WHERE NOT EXISTS"
        " (SELECT 1 FROM attempts a WHERE a.step_id = k.step_id AND a.fence = k.fence)",
        lambda r: f"step {r['step_id']}'s checkpoint names fence {r['fence']}, not an attempt",
    ),
    # (A head that moved before the approval does not count: the approval read the head; nor
    # does a head at the candidate the task's own git.push sent, `tasks.pushed_sha`.)
    "success-on-approved-base": (
        "SELECT t.id FROM tasks t JOIN events v ON v.task_id = t.id AND v.kind = 'state'"
        " AND v.state = 'SUCCEEDED' WHERE t.repository IS NOT NULL AND EXISTS ("
        "  SELECT 1 FROM events b WHERE b.task_id = t.id AND b.kind = 'base_changed'"
        "  AND b.seq < v.seq AND json_extract(b.data_json, '$.head_sha') != t.approved_base_sha"
        "  AND json_extract(b.data_json, '$.head_sha') IS NOT t.pushed_sha"
        "  AND b.seq > (SELECT MAX(a.seq) FROM events a WHERE a.task_id = t.id"
        "   AND a.kind = 'state' AND a.state = 'APPROVED')"
        "  AND NOT EXISTS (SELECT 1 FROM events b2 WHERE b2.task_id = t.id"
        "   AND b2.kind = 'base_changed' AND b2.seq > b.seq AND b2.seq < v.seq))",
        lambda r: f"task {r['id']} SUCCEEDED after its repository moved off the approved base",
    ),
    "terminal-is-final": (
        f"SELECT t.task_id, t.state AS first, l.state AS later FROM events t JOIN events l"
        f" ON l.task_id = t.task_id AND l.seq > t.seq AND l.kind = 'state'"
        f" WHERE t.kind = 'state' AND t.state IN ({_TERMINAL_SQL})",
        lambda r: f"task {r['task_id']} moved from terminal {r['first']} to {r['later']}",
    ),
    "task-state-is-last-event": (
        "SELECT t.id, t.state, (SELECT e.state FROM events e WHERE e.task_id = t.id"
        " AND e.kind = 'state' ORDER BY e.seq DESC LIMIT 1) AS last FROM tasks t"
        " WHERE last IS NULL OR t.state != last",
        lambda r: f"task {r['id']} is {r['state']} but its journal says {r['last']}",
    ),
    # Effect steps (docs/design.md, Effects): the supervisor delivers them, no runner does.
    "delivered-effect-has-one-effect": (
        "SELECT o.step_id, (SELECT COUNT(*) FROM effects e WHERE e.step_id = o.step_id) AS n"
        " FROM outbox o WHERE (o.state = 'delivered' AND n != 1)"
        " OR (o.state != 'delivered' AND n != 0)",
        lambda r: f"effect {r['step_id']} is recorded with {r['n']} effect rows",
    ),
    "unkeyed-sent-once-per-opening": (
        "SELECT d.step_id, d.opening, COUNT(*) AS n FROM deliveries d JOIN outbox o"
        " ON o.step_id = d.step_id WHERE o.keyed = 0 AND (d.sent IS NULL OR d.sent = 1)"
        " GROUP BY d.step_id, d.opening HAVING n > 1 OR d.opening < 1",
        lambda r: (
            f"unkeyed effect {r['step_id']} has {r['n']} attempts that may have sent"
            f" under gate opening {r['opening']}"
        ),
    ),
    "no-idle-sending-of-ended-task": (
        "SELECT o.step_id FROM outbox o JOIN tasks t ON t.id = o.task_id"
        f" WHERE o.state = 'sending' AND t.state IN ({_TERMINAL_SQL})"
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.step_id = o.step_id)",
        lambda r: f"effect {r['step_id']} of an ended task is held with no delivery begun",
    ),
    # An operator's word settles the attempts before it (`settled_attempts`).
    "withdrawn-effect-sent-nothing": (
        "SELECT o.step_id, d.attempt FROM outbox o JOIN deliveries d ON d.step_id = o.step_id"
        f" WHERE o.state = '{OutboxState.WITHDRAWN.value}' AND d.attempt > o.settled_attempts"
        " AND (d.sent IS NULL OR d.sent = 1)",
        lambda r: (
            f"effect {r['step_id']} is withdrawn, yet its attempt {r['attempt']} may have"
            " reached the receiver"
        ),
    ),
    "effect-step-never-leased": (
        "SELECT DISTINCT a.step_id FROM attempts a JOIN outbox o ON o.step_id = a.step_id",
        lambda r: f"effect step {r['step_id']} was leased to a runner",
    ),
    "task-has-steps": (
        "SELECT t.id FROM tasks t WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE s.task_id = t.id)",
        lambda r: f"task {r['id']} has no steps: its plan's intents are missing",
    ),
}


def find_violations(db: sqlite3.Connection) -> list[str]:
    """Every invariant violation in the ledger, as `name: description` lines."""
    found: list[str] = []
    for name, (sql, describe) in _QUERIES.items():
        found.extend(f"{name}: {describe(row)}" for row in db.execute(sql).fetchall())
    for row in db.execute("SELECT effect_key, step_id, payload_hash FROM effects").fetchall():
        if row["effect_key"] != effect_key(row["step_id"], row["payload_hash"]):
            found.append(
                f"effect-key-is-identity: step {row['step_id']}'s effect key is not"
                " sha256(step_id, payload_hash)"
            )
    return found


INVARIANTS: tuple[str, ...] = (*_QUERIES, "effect-key-is-identity")
