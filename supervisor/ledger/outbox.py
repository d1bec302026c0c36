"""The outbox of effect steps (docs/design.md, Effects): the states an outbox row moves
through, what the dispatcher is handed, and what it answers.

An effect step is never leased to a runner. When it becomes due, the transaction that makes it
due writes its rendered request to the outbox (`lifecycle.make_due`, `outbox_render`); the
supervisor's dispatcher takes rows, records each delivery attempt before it sends, and records
the receiver's answer (`outbox_delivery`); an operator opens gates and resolves uncertain
effects (`outbox_gates`); the moves these share are in `outbox_rows`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class OutboxState(enum.StrEnum):
    DUE = "due"  # keyed, ready to be taken
    GATED = "gated"  # unkeyed, waiting for an operator to open the gate
    OPEN = "open"  # gate opened for one digest; ready to be taken
    SENDING = "sending"  # a dispatcher holds it; a delivery attempt may be in flight
    UNCERTAIN = "uncertain"  # a send may have reached the receiver; only an operator resolves it
    DELIVERED = "delivered"
    FAILED = "failed"
    WITHDRAWN = "withdrawn"  # its task ended before anything of it was sent


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outgoing:
    """One effect handed to a dispatcher by `take_effects`."""

    effect_id: str  # the step id
    task_id: str
    tenant: str
    kind: str
    effect_key: str
    keyed: bool
    request: dict[str, Any]  # as rendered at due time (credentials by name)
    digest: str
    deadline_at: float  # wall time; no attempt starts after it


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delivered:
    """The receiver applied the effect (or answered that it already had: `replayed`)."""

    status: int | None
    detail: str
    replayed: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Undeliverable:
    """It fails for good: the receiver refused it, or the deliverer would not send it (a
    destination not allowed, a credential missing); the step fails with `code`."""

    status: int | None
    detail: str
    code: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unanswered:
    """No usable answer; `sent` is whether the request may have reached the receiver."""

    detail: str
    sent: bool
    status: int | None = None


Answer = Delivered | Undeliverable | Unanswered


# Rows an ending task settles at once (`end_with_task`): no dispatcher holds them.
UNHELD = (OutboxState.DUE, OutboxState.GATED, OutboxState.OPEN)

# The states a row's delivery ends in (`outbox_rows.set_state` records when).
ENDS = frozenset({OutboxState.DELIVERED, OutboxState.FAILED, OutboxState.WITHDRAWN})
