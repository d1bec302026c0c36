"""The ledger's decisions as log lines: one JSON line per decision that became durable.

Rules note their decisions on the `Tx` (`tx.note(Decision.GRANTED, ...)`); a refusal that is
recorded in `rejections` gets its note from the batch that records it. The store logs the notes
of a batch on the event loop once the batch has committed, so a decision rolled back is never
logged. A new decision is a member of `Decision` (and of `WARNINGS` if it is a refusal or a
failure). Notes carry ids, states, codes and reasons, never a payload, an output or a secret.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import structlog


class Decision(enum.StrEnum):
    """Each value is the log line's `event`."""

    CREATED = "task created"
    APPROVED = "task approved"
    GRANTED = "step granted"
    COMMITTED = "step committed"
    CHECKPOINTED = "step checkpointed"
    REPLAYED = "result replayed"
    REFUSED = "refused"  # logged as "<request> refused", e.g. "renew refused", with its `code`
    EXPIRED = "lease expired"
    RELEASED = "lease released"
    REQUEUED = "step requeued"
    FAILED = "task failed"
    CANCELLED = "task cancelled"
    VERIFIED = "task verified"
    EFFECT_DUE = "effect due"
    EFFECT_UNCERTAIN = "effect uncertain"
    GATE_OPENED = "gate opened"
    VERIFIER_ASKED = "verifier asked"
    CHECKS_DISPUTED = "checks disputed"


WARNINGS: frozenset[Decision] = frozenset(
    {
        Decision.REFUSED,
        Decision.EXPIRED,
        Decision.FAILED,
        Decision.EFFECT_UNCERTAIN,
        Decision.CHECKS_DISPUTED,
    }
)

Note = tuple[Decision, dict[str, Any]]

log = structlog.get_logger("tether.ledger")


def log_decisions(notes: Sequence[Note]) -> None:
    """Write one line per note: info, or warning for refusals and failures."""
    if not notes:
        return
    # One logger per batch: each call on the module's lazy proxy would build a new one, which
    # costs more than a line that the level then drops.
    bound = log.bind()
    for decision, fields in notes:
        if decision is Decision.REFUSED:
            rest = {k: v for k, v in fields.items() if k != "request"}
            bound.warning(f"{fields.get('request', 'request')} refused", **rest)
        elif decision in WARNINGS:
            bound.warning(decision.value, **fields)
        else:
            bound.info(decision.value, **fields)
