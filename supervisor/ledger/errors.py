"""The ledger's exceptions, grouped by what the caller should do.

    LedgerError
    ├── Refused              the request is refused and changed nothing; do not retry it as is
    │   ├── InvalidRequest       a field is missing or has a wrong value       (invalid_field)
    │   ├── NotFound             no such task, step or token for this caller  (not_found)
    │   ├── IdempotencyConflict  same key, another plan                       (idempotency_conflict)
    │   ├── PlanMismatch         approval names another plan hash             (plan_mismatch)
    │   ├── InvalidTransition    the state machine forbids it                 (invalid_transition)
    │   ├── TerminalState        the task already ended                        (terminal)
    │   ├── StaleFence           not the step's current fencing token          (stale_fence)
    │   ├── StaleBase            the approved base is not the repository's head (stale_base)
    │   ├── PayloadDrift         payload hash differs from the intent          (payload_drift)
    │   ├── EffectNotHeld        the caller does not hold this effect           (effect_not_held)
    │   ├── GateMismatch         the digest is not the effect's request's       (gate_mismatch)
    │   ├── EffectNotGated       no gate or uncertain effect to act on          (invalid_transition)
    │   └── QuotaExceeded        the uploader's artifacts would pass its quota  (quota_exceeded)
    └── StorageError         the ledger file itself is at fault; the operator must act
        ├── IntegrityCheckFailed
        └── SchemaTooNew

Each class's docstring is its default message.
"""

from __future__ import annotations

from typing import ClassVar

from tether.wire import ErrorCode


class LedgerError(Exception):
    """The ledger could not carry out the request."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or (self.__doc__ or self.__class__.__name__).strip()
        super().__init__(self.detail)


class Refused(LedgerError):
    """The request was refused and nothing changed."""

    code = ErrorCode.BAD_REQUEST
    # Whether the store writes this refusal to `rejections`, in the same batch, after the
    # refused rule's own writes are rolled back (docs/design.md, Fencing and leases).
    recorded: ClassVar[bool] = False
    task_id: str | None = None
    step_id: str | None = None
    fence: int | None = None

    def about(
        self, *, task_id: str | None = None, step_id: str | None = None, fence: int | None = None
    ) -> Refused:
        """Attach what the refusal concerns, for the rejection record."""
        self.task_id, self.step_id, self.fence = task_id, step_id, fence
        return self


class InvalidRequest(Refused):
    """A field is missing or has a wrong value."""

    code = ErrorCode.INVALID_FIELD


class NotFound(Refused):
    """No such object for this caller."""

    code = ErrorCode.NOT_FOUND


class IdempotencyConflict(Refused):
    """This idempotency key already names a task with another plan."""

    code = ErrorCode.IDEMPOTENCY_CONFLICT


class PlanMismatch(Refused):
    """The approval names a plan hash other than the task's."""

    code = ErrorCode.PLAN_MISMATCH


class InvalidTransition(Refused):
    """The task state machine does not allow this transition."""

    code = ErrorCode.INVALID_TRANSITION
    recorded = True


class TerminalState(Refused):
    """The task has already reached a terminal state."""

    code = ErrorCode.TERMINAL
    recorded = True


class StaleFence(Refused):
    """The fencing token is not the step's current one; the lease is no longer yours."""

    code = ErrorCode.STALE_FENCE
    recorded = True


class LeaseOver(StaleFence):
    """The step is committed under this very fence: the holder's renewal crossed its own
    result on the way (the runner renews while its result is out). Answered as a stale fence,
    but not recorded: nobody but the holder was refused, and its step succeeded."""

    recorded = False


class StaleBase(Refused):
    """The base named is not the repository's head; approve the head, or rebase the plan."""

    code = ErrorCode.STALE_BASE


class PayloadDrift(Refused):
    """The reported payload hash differs from the step's durable intent; do not retry."""

    code = ErrorCode.PAYLOAD_DRIFT
    recorded = True


class EffectNotHeld(Refused):
    """This dispatcher does not hold the effect (another took it over, or its task ended)."""

    code = ErrorCode.EFFECT_NOT_HELD


class GateMismatch(Refused):
    """The digest is not the digest of the effect's rendered request; nothing was opened."""

    code = ErrorCode.GATE_MISMATCH


class EffectNotGated(Refused):
    """The effect is not waiting for this operator action."""

    code = ErrorCode.INVALID_TRANSITION


class QuotaExceeded(Refused):
    """The artifact store holds as many of this pool's (or tenant's) bytes as it may."""

    code = ErrorCode.QUOTA_EXCEEDED


class StorageError(LedgerError):
    """The ledger's storage failed; an operator must look at the database file."""


class IntegrityCheckFailed(StorageError):
    """PRAGMA integrity_check reported damage; refusing to use this ledger file."""


class SchemaTooNew(StorageError):
    """The ledger file was written by a newer tether; refusing to downgrade it."""
