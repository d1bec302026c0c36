"""The substrate domain: a borrowed server vanished mid-step.

Its lease expires on the supervisor's clock; the reaper fences it out and re-queues the step
with the same step id, for a new attempt under a new fence. Time during which no supervisor
served the ledger does not count against a lease: no runner could renew then. Each reaper turn
stamps the counter 'alive'; a starting supervisor moves every open deadline later by the time
since that stamp, less `ALIVE_GRACE_S` (`refresh_after_restart`).
"""

from __future__ import annotations

from tether.supervisor.ledger.decisions import Decision
from tether.supervisor.ledger.lifecycle import requeue
from tether.supervisor.ledger.records import StepOfTask
from tether.supervisor.ledger.states import AttemptState
from tether.supervisor.ledger.steps import about_step, end_attempt
from tether.supervisor.ledger.tx import Tx

# The reaper's longest pause between turns (supervisor/service.py); each turn stamps 'alive'.
TURN_MAX_S = 1.0
# How long since the last stamp a supervisor that still serves may show: two turns.
ALIVE_GRACE_S = 2 * TURN_MAX_S
ALIVE_PER_S = 1_000_000  # 'alive' is kept in microseconds: counters hold integers


def expire(tx: Tx) -> int:
    """Stamp 'alive', then reap every lease past its deadline or never acknowledged in time;
    return how many were reaped."""
    tx.run("stamp_alive", alive=int(tx.now * ALIVE_PER_S))
    rows = tx.all_as(StepOfTask, "leases_to_reap", now=tx.now)
    for step in rows:
        unacknowledged = step.accept_deadline is not None and step.accept_deadline <= tx.now
        why = "not acknowledged" if unacknowledged else "lease expired"
        assert step.fence is not None, "a leased step has a fence"
        end_attempt(tx, step.id, step.fence, AttemptState.EXPIRED, why)
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
    """Move every open lease's deadline (and acceptance window, if not yet acknowledged) later by
    the time no supervisor served the ledger, stamp 'alive', and move the fence counter above
    every fence the file knows and to at least the clock's reading in microseconds (see
    `FENCE_FLOOR_PER_S`). Return how many leases were moved.

    The unattended time is `now - alive - ALIVE_GRACE_S`, at least 0: with another supervisor
    serving (PostgreSQL) or after a quick restart, nothing moves, so restarts, however many,
    never keep a lost runner's lease alive. A ledger never stamped (written before the stamp
    existed) gives every open lease a fresh TTL, as it did then.
    """
    cfg = tx.config
    row = tx.one("last_alive")
    if row is None:
        changed = tx.count(
            "refresh_leases",
            lease_deadline=tx.now + cfg.lease_ttl_s,
            accept_deadline=tx.now + cfg.accept_window_s,
        )
    else:
        unattended = tx.now - row["value"] / ALIVE_PER_S - ALIVE_GRACE_S
        changed = tx.count("extend_leases", unattended=unattended) if unattended > 0 else 0
    tx.run("stamp_alive", alive=int(tx.now * ALIVE_PER_S))
    tx.run("raise_fence_floor", floor=int(tx.now * FENCE_FLOOR_PER_S))
    return changed
