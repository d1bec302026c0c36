"""The ledger: every rule about intents, fences, effects and states, in one folder.

Failure domains (docs/design.md, Failure domains), one module each: `identity` (payload drift),
`effects` (ack lost, replay), `fencing` (the clock: stale tokens), `reaper` (the substrate
vanished). `states` holds the task state machine (`transitions` applies it), `journal` the event
log, `verification` the success gate and the review verdict; `steps` and `lifecycle` are what
the rules share (the layers: docs/contributing.md, Where code lives). `batch` is the one way
rules run (a transaction per batch of rules); `store` runs them behind one writer with group
commit and logs each committed decision (`decisions`); its `LedgerStore` is what adapters use.
"""

from tether.supervisor.ledger.errors import (
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
from tether.supervisor.ledger.identity import Created, StepSpec, TaskSpec
from tether.supervisor.ledger.repositories import Binding
from tether.supervisor.ledger.states import ALLOWED, TERMINAL, AttemptState, StepState, TaskState
from tether.supervisor.ledger.store import LedgerStore, SqliteLedger
from tether.supervisor.ledger.tokens import Principal, Role
from tether.supervisor.ledger.tx import LedgerConfig, Tx
from tether.supervisor.ledger.verification import Evidence, Finding, Problem
from tether.wire.records import Lease, Renewal, Report

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
    "LedgerConfig",
    "LedgerError",
    "LedgerStore",
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
