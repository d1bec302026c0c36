"""The ledger: every rule about intents, fences, effects and states, in one folder.

Failure domains (docs/design.md, Failure domains), one module each: `identity` (payload drift),
`effects` (ack lost, replay), `fencing` (the clock: stale tokens), `reaper` (the substrate
vanished). `states` holds the task state machine, `journal` the event log, `verification` the
success gate and the review verdict. `batch` is the one way rules run (a transaction per batch
of rules); `store` runs them behind one writer with group commit and logs each committed
decision (`decisions`); `port` is the interface adapters use.
"""

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
    StaleBase,
    StaleFence,
    StorageError,
    TerminalState,
)
from supervisor.ledger.identity import Created, StepSpec, TaskSpec
from supervisor.ledger.port import Ledger
from supervisor.ledger.repositories import Binding
from supervisor.ledger.states import ALLOWED, TERMINAL, AttemptState, StepState, TaskState
from supervisor.ledger.store import SqliteLedger
from supervisor.ledger.tokens import Principal, Role
from supervisor.ledger.tx import LedgerConfig, Tx
from supervisor.ledger.verification import Evidence, Finding, Problem
from tether.messages import Lease, Renewal, Report

__all__ = [
    "ALLOWED",
    "TERMINAL",
    "AttemptState",
    "Binding",
    "Created",
    "Evidence",
    "Finding",
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
    "Problem",
    "Refused",
    "Renewal",
    "Report",
    "Role",
    "SchemaTooNew",
    "SqliteLedger",
    "StaleBase",
    "StaleFence",
    "StepSpec",
    "StepState",
    "StorageError",
    "TaskSpec",
    "TaskState",
    "TerminalState",
    "Tx",
]
