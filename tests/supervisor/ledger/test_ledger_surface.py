"""The ledger package's public surface is deliberate: adding or dropping a name is a decision
made here, in a diff a reviewer sees."""

from __future__ import annotations

import tether.supervisor.ledger as ledger_pkg

PUBLIC = {
    # the state machine
    "ALLOWED",
    "TERMINAL",
    "TaskState",
    "StepState",
    "AttemptState",
    # records in and out
    "TaskSpec",
    "StepSpec",
    "Created",
    "Lease",
    "Renewal",
    "Report",
    "Principal",
    "Role",
    # what the adapters observe about a repository-bound task, and what it binds
    "Evidence",
    "Problem",
    "Finding",
    "Binding",
    # the store adapters use (over either backend), its SQLite form and its knobs
    "LedgerStore",
    "SqliteLedger",
    "LedgerConfig",
    "Tx",
    # errors
    "LedgerError",
    "Refused",
    "InvalidRequest",
    "NotFound",
    "IdempotencyConflict",
    "PlanMismatch",
    "InvalidTransition",
    "TerminalState",
    "StaleFence",
    "StaleBase",
    "PayloadDrift",
    "StorageError",
    "IntegrityCheckFailed",
    "SchemaTooNew",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(ledger_pkg.__all__) == PUBLIC
    assert len(ledger_pkg.__all__) == len(PUBLIC)  # no name listed twice


def test_every_public_name_exists() -> None:
    assert all(hasattr(ledger_pkg, name) for name in ledger_pkg.__all__)
