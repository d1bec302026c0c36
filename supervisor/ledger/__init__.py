"""The ledger: every rule about intents, fences, effects and states, in one folder.

Failure domains of SPEC §3, one module each: `identity` (payload drift), `effects` (ack lost,
replay), `fencing` (the clock: stale tokens), `reaper` (the substrate vanished). `states` holds
the task state machine, `journal` the event log, `verification` the success gate. `store` runs
these rules behind one writer with group commit; `port` is the interface adapters use.
"""

from supervisor.ledger.effects import Report
from supervisor.ledger.errors import (
    IdempotencyConflict,
    IntegrityCheckFailed,
    InvalidRequest,
    InvalidTransition,
    LedgerError,
    NotFound,
    PayloadDrift,
    PlanMismatch,
    Refused,
    SchemaTooNew,
    StaleFence,
    StorageError,
    TerminalState,
)
from supervisor.ledger.fencing import Renewal
from supervisor.ledger.identity import Created, StepSpec, TaskSpec
from supervisor.ledger.port import Ledger
from supervisor.ledger.states import ALLOWED, TERMINAL, AttemptState, StepState, TaskState
from supervisor.ledger.store import SqliteLedger
from supervisor.ledger.tokens import Principal, Role
from supervisor.ledger.tx import PLANTS, Checks, LedgerConfig, Tx
from tether.wire import Lease

__all__ = [
    "ALLOWED",
    "PLANTS",
    "TERMINAL",
    "AttemptState",
    "Checks",
    "Created",
    "IdempotencyConflict",
    "IntegrityCheckFailed",
    "InvalidRequest",
    "InvalidTransition",
    "Lease",
    "Ledger",
    "LedgerConfig",
    "LedgerError",
    "NotFound",
    "PayloadDrift",
    "PlanMismatch",
    "Principal",
    "Refused",
    "Renewal",
    "Report",
    "Role",
    "SchemaTooNew",
    "SqliteLedger",
    "StaleFence",
    "StepSpec",
    "StepState",
    "StorageError",
    "TaskSpec",
    "TaskState",
    "TerminalState",
    "Tx",
]
