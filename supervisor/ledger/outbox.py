"""The outbox of effect steps (docs/design.md, Effects): what the dispatcher is handed, what it
answers, and the states an outbox row moves through.

An effect step is never leased to a runner. When it becomes due, the transaction that makes it
due writes its rendered request here; the supervisor's dispatcher takes rows, records each
delivery attempt before it sends, and records the receiver's answer.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from supervisor.ledger.errors import EffectNotHeld, GateMismatch
from supervisor.ledger.tx import Tx

__all__ = [
    "Answer",
    "Delivered",
    "EffectNotHeld",
    "GateMismatch",
    "OutboxState",
    "Outgoing",
    "Refused",
    "Unanswered",
]


class OutboxState(enum.StrEnum):
    DUE = "due"  # keyed, ready to be taken
    GATED = "gated"  # unkeyed, waiting for an operator to open the gate
    OPEN = "open"  # gate opened for one digest; ready to be taken
    SENDING = "sending"  # a dispatcher holds it; a delivery attempt may be in flight
    UNCERTAIN = "uncertain"  # an unkeyed send may have happened; only an operator resolves it
    DELIVERED = "delivered"
    FAILED = "failed"
    WITHDRAWN = "withdrawn"  # cancelled before any send


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
class Refused:
    """The receiver refused it for good: the step fails with `code`."""

    status: int | None
    detail: str
    code: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unanswered:
    """No usable answer; `sent` is whether the request may have reached the receiver."""

    detail: str
    sent: bool
    status: int | None = None


Answer = Delivered | Refused | Unanswered


# -- the dispatcher's rules (filled in below the types; see docs/design.md, Effects) --------


def take(tx: Tx, holder: str, limit: int) -> list[Outgoing]:
    raise NotImplementedError


def begin_attempt(tx: Tx, effect_id: str, holder: str, digest: str) -> int:
    raise NotImplementedError


def record_attempt(tx: Tx, effect_id: str, attempt: int, holder: str, answer: Answer) -> None:
    raise NotImplementedError


def give_up(tx: Tx, effect_id: str, holder: str, reason: str) -> None:
    raise NotImplementedError


def release(tx: Tx, effect_id: str, holder: str) -> None:
    raise NotImplementedError


def open_gate(tx: Tx, tenant: str, task_id: str, step_name: str, digest: str, by: str) -> None:
    raise NotImplementedError


def resolve(tx: Tx, tenant: str, task_id: str, step_name: str, happened: bool, by: str) -> None:
    raise NotImplementedError
