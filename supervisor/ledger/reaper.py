"""The substrate domain: a borrowed server vanished mid-step.

Its lease expires on the supervisor's clock; the reaper fences it out and re-queues the step
with the same step id, for a new attempt under a new fence. After a supervisor restart every
open lease gets a fresh TTL, because no runner could renew while the supervisor was down.
"""

from __future__ import annotations

from supervisor.ledger.fencing import end_attempt, requeue
from supervisor.ledger.states import AttemptState
from supervisor.ledger.tx import Tx


def expire(tx: Tx) -> int:
    """Reap every lease past its deadline or never acknowledged in time; answer how many."""
    rows = tx.all(
        "SELECT s.*, t.state AS task_state, t.pool FROM steps s JOIN tasks t ON t.id = s.task_id"
        " WHERE s.state = 'leased' AND (s.lease_deadline <= ? OR s.accept_deadline <= ?)",
        (tx.now, tx.now),
    )
    for step in rows:
        unacknowledged = step["accept_deadline"] is not None and step["accept_deadline"] <= tx.now
        why = "not acknowledged" if unacknowledged else "lease expired"
        end_attempt(tx, step["id"], step["fence"], AttemptState.EXPIRED, why)
        requeue(tx, step, counted=True, why=why)
    return len(rows)


def next_deadline(tx: Tx) -> float | None:
    row = tx.one(
        "SELECT MIN(MIN(lease_deadline), COALESCE(MIN(accept_deadline), MIN(lease_deadline)))"
        " AS d FROM steps WHERE state = 'leased'"
    )
    return None if row is None or row["d"] is None else float(row["d"])


def refresh_after_restart(tx: Tx) -> int:
    """Give every open lease a fresh TTL (and acceptance window, if not yet acknowledged), and
    keep the fence counter above every fence ever issued."""
    cfg = tx.config
    changed = tx.run(
        "UPDATE steps SET lease_deadline = ?,"
        " accept_deadline = CASE WHEN accept_deadline IS NULL THEN NULL ELSE ? END"
        " WHERE state = 'leased'",
        (tx.now + cfg.lease_ttl_s, tx.now + cfg.accept_window_s),
    )
    tx.run(
        "UPDATE counters SET value = MAX(value, (SELECT COALESCE(MAX(fence), 0) FROM attempts))"
        " WHERE name = 'fence'"
    )
    return changed
