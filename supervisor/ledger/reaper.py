"""The substrate domain: a borrowed server vanished mid-step.

Its lease expires on the supervisor's clock; the reaper fences it out and re-queues the step
with the same step id, for a new attempt under a new fence. After a supervisor restart every
open lease gets a fresh TTL, because no runner could renew while the supervisor was down.
"""

from __future__ import annotations

from supervisor.ledger.decisions import Decision
from supervisor.ledger.fencing import about_step, end_attempt, requeue
from supervisor.ledger.states import AttemptState
from supervisor.ledger.tx import Tx


def expire(tx: Tx) -> int:
    """Reap every lease past its deadline or never acknowledged in time; return how many."""
    rows = tx.all("leases_to_reap", (tx.now, tx.now))
    for step in rows:
        unacknowledged = step["accept_deadline"] is not None and step["accept_deadline"] <= tx.now
        why = "not acknowledged" if unacknowledged else "lease expired"
        end_attempt(tx, step["id"], step["fence"], AttemptState.EXPIRED, why)
        tx.note(Decision.EXPIRED, **about_step(tx, step), why=why)
        requeue(tx, step, counted=True, why=why)
    return len(rows)


def next_deadline(tx: Tx) -> float | None:
    row = tx.one("next_lease_deadline")
    return None if row is None or row["d"] is None else float(row["d"])


# At each start the fence counter moves to at least the supervisor's clock in microseconds. A
# ledger restored from a backup knows nothing of the fences granted after that backup, and a
# runner may still hold one; were the counter only kept above the fences in the file, the next
# grants would hand out the same numbers again and a stale holder could pass for the current
# one. Fences granted since any earlier start are below that start's clock reading plus the
# grants since (never one a microsecond), so below any later start's. Within a file the
# counter only grows, whatever the clock does. (2026 is about 1.8e15: exact in JSON numbers
# until the year 2255.)
FENCE_FLOOR_PER_S = 1_000_000


def refresh_after_restart(tx: Tx) -> int:
    """Give every open lease a fresh TTL (and acceptance window, if not yet acknowledged), and
    move the fence counter above every fence the file knows and to at least the clock's
    reading in microseconds (see `FENCE_FLOOR_PER_S`)."""
    cfg = tx.config
    changed = tx.run("refresh_leases", (tx.now + cfg.lease_ttl_s, tx.now + cfg.accept_window_s))
    tx.run("raise_fence_floor", (int(tx.now * FENCE_FLOOR_PER_S),))
    return changed
