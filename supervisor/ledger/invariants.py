"""The ledger's invariants, checked over a whole ledger file.

Used by `tether-supervisor check` (exit 1 on any violation) and by the schedule explorer after
every event. Each check is one named query (`sql/queries/invariants*.sql`, named as the
invariant with `_` for `-`) that finds counter-examples; no row is a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tether.supervisor.ledger.outbox import OutboxState
from tether.supervisor.ledger.tx import Row, Statements
from tether.wire import effect_key

Describe = Callable[[Row], str]


def _check(describe: Describe, **params: str) -> tuple[Mapping[str, str], Describe]:
    """How to describe one offending row, and the outbox states the query is given."""
    return params, describe


# name -> (its query's parameters, how to describe an offending row)
_CHECKS: dict[str, tuple[Mapping[str, str], Describe]] = {
    "one-effect-per-step": _check(lambda r: f"step {r['step_id']} has {r['n']} effects"),
    "committed-has-effect": _check(lambda r: f"step {r['id']} is committed without an effect"),
    "effect-has-commit": _check(
        lambda r: f"step {r['step_id']} has an effect but is not committed"
    ),
    "effect-matches-intent": _check(
        lambda r: f"step {r['step_id']}'s effect does not match its intent's payload hash"
    ),
    "no-stale-commit": _check(
        lambda r: (
            f"step {r['step_id']} committed under fence {r['fence']},"
            f" its current fence was {r['latest']}"
        )
    ),
    "idempotency-key-unique": _check(
        lambda r: f"tenant {r['tenant']} key {r['idempotency_key']!r} names {r['n']} tasks"
    ),
    "one-live-lease-per-step": _check(lambda r: f"step {r['step_id']} has {r['n']} live leases"),
    "live-lease-is-the-steps": _check(
        lambda r: (
            f"step {r['step_id']} is {r['state']} but its attempt under fence {r['fence']}"
            " is still leased"
        )
    ),
    "leased-step-has-its-lease": _check(
        lambda r: f"step {r['id']} is leased under fence {r['fence']} with no such live attempt"
    ),
    "fences-increase": _check(
        lambda r: f"step {r['step_id']} attempt {r['attempt'] + 1} did not get a higher fence"
    ),
    "fence-counter-ahead": _check(
        lambda r: f"fence counter {r['counter']} is below an issued fence {r['top']}"
    ),
    "success-is-complete": _check(lambda r: f"task {r['id']} SUCCEEDED with an uncommitted step"),
    # A SUCCEEDED repository task has a final candidate (the latest step's, by position) whose
    # report came with evidence finding no problem, and a passing run of each expected check.
    "success-is-verified": _check(
        lambda r: f"task {r['id']} SUCCEEDED without matching verification evidence"
    ),
    # A SUCCEEDED task with a verifier pool had its checks re-run at its final candidate by a
    # runner token that made no part of it (docs/design.md, Verification).
    "success-verified-by-another": _check(
        lambda r: f"task {r['id']} SUCCEEDED without a verifier's agreement by another token"
    ),
    "checkpoint-of-an-attempt": _check(
        lambda r: f"step {r['step_id']}'s checkpoint names fence {r['fence']}, not an attempt"
    ),
    # (A head that moved before the approval does not count: the approval read the head; nor
    # does a head at the candidate the task's own git.push sent, `tasks.pushed_sha`.)
    "success-on-approved-base": _check(
        lambda r: f"task {r['id']} SUCCEEDED after its repository moved off the approved base"
    ),
    "terminal-is-final": _check(
        lambda r: f"task {r['task_id']} moved from terminal {r['first']} to {r['later']}"
    ),
    "task-state-is-last-event": _check(
        lambda r: f"task {r['id']} is {r['state']} but its journal says {r['last']}"
    ),
    # Effect steps (docs/design.md, Effects): the supervisor delivers them, no runner does.
    "delivered-effect-has-one-effect": _check(
        lambda r: f"effect {r['step_id']} is recorded with {r['n']} effect rows",
        delivered=OutboxState.DELIVERED.value,
    ),
    "unkeyed-sent-once-per-opening": _check(
        lambda r: (
            f"unkeyed effect {r['step_id']} has {r['n']} attempts that may have sent"
            f" under gate opening {r['opening']}"
        )
    ),
    "no-idle-sending-of-ended-task": _check(
        lambda r: f"effect {r['step_id']} of an ended task is held with no delivery begun",
        sending=OutboxState.SENDING.value,
    ),
    # An operator's word settles the attempts before it (`settled_attempts`).
    "withdrawn-effect-sent-nothing": _check(
        lambda r: (
            f"effect {r['step_id']} is withdrawn, yet its attempt {r['attempt']} may have"
            " reached the receiver"
        ),
        withdrawn=OutboxState.WITHDRAWN.value,
    ),
    "effect-step-never-leased": _check(
        lambda r: f"effect step {r['step_id']} was leased to a runner"
    ),
    "task-has-steps": _check(
        lambda r: f"task {r['id']} has no steps: its plan's intents are missing"
    ),
}


def find_violations(s: Statements) -> list[str]:
    """Every invariant violation in the ledger, as `name: description` lines."""
    found: list[str] = []
    for name, (params, describe) in _CHECKS.items():
        rows = s.all(name.replace("-", "_"), **params)
        found.extend(f"{name}: {describe(row)}" for row in rows)
    for row in s.all("effect_keys"):
        if row["effect_key"] != effect_key(row["step_id"], row["payload_hash"]):
            found.append(
                f"effect-key-is-identity: step {row['step_id']}'s effect key is not"
                " sha256(step_id, payload_hash)"
            )
    return found


INVARIANTS: tuple[str, ...] = (*_CHECKS, "effect-key-is-identity")
