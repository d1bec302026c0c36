"""Commands on the ledger file itself, for operators on the owned box: tokens, check, backup,
budgets. They run the ledger's own rules through `Transactions`, beside a running supervisor
if there is one (WAL and `BEGIN IMMEDIATE` serialise the writers)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from supervisor.ledger import LedgerConfig, LedgerError, Tx, invariants, tokens
from supervisor.ledger.batch import Transactions
from supervisor.ledger.operator import set_budget
from supervisor.ledger.schema import connect, integrity_problems, open_ledger_file


class AdminError(Exception):
    """An admin command cannot proceed; the message is the one line to print."""


@contextlib.contextmanager
def ledger_file(path: Path, *, must_exist: bool = True) -> Iterator[sqlite3.Connection]:
    if must_exist and not path.exists():
        raise AdminError(f"no ledger file at {path}")
    try:
        db = open_ledger_file(path)
    except (LedgerError, sqlite3.DatabaseError) as exc:
        raise AdminError(f"cannot open ledger {path}: {exc}") from None
    try:
        yield db
    finally:
        db.close()


def run_rule(db: sqlite3.Connection, rule: Callable[[Tx], Any]) -> Any:
    """Run one ledger rule on the wall clock and commit it; a refusal becomes an `AdminError`."""
    try:
        return Transactions(db=db, config=LedgerConfig(), clock=time.time).one(rule)
    except LedgerError as exc:
        raise AdminError(str(exc)) from None


def create_token(path: Path, scope: str, role: str) -> str:
    """The first token creates the ledger file; a refused one leaves no new file behind."""
    new_file = not path.exists()
    try:
        with ledger_file(path, must_exist=False) as db:
            _token_id, secret = run_rule(db, lambda tx: tokens.create_token(tx, scope, role))
    except AdminError:
        if new_file:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
        raise
    return str(secret)


def list_tokens(path: Path) -> list[str]:
    with ledger_file(path) as db:
        records = tokens.list_tokens(db)
    return [
        " ".join(
            [
                r.id, r.scope, r.role.value,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.created_at)),
                *(["revoked"] if r.revoked else []),
            ]
        )
        for r in records
    ]  # fmt: skip


def revoke_token(path: Path, token_id: str) -> None:
    with ledger_file(path) as db:
        run_rule(db, lambda tx: tokens.revoke_token(tx, token_id))


def set_tenant_budget(path: Path, tenant: str, budget: int | None) -> None:
    with ledger_file(path) as db:  # a budget on a mistyped path would bind nobody
        run_rule(db, lambda tx: set_budget(tx, tenant, budget))


def check(path: Path) -> list[str]:
    """Integrity and every ledger invariant; an empty list means the file is sound."""
    if not path.exists():
        raise AdminError(f"no ledger file at {path}")
    try:
        db = connect(path, readonly=True)
    except sqlite3.DatabaseError as exc:
        return [f"integrity: {exc}"]
    try:
        problems = [f"integrity: {p}" for p in integrity_problems(db)]
        if not problems:
            problems += invariants.find_violations(db)
    except sqlite3.DatabaseError as exc:
        problems = [f"integrity: {exc}"]
    finally:
        db.close()
    return problems


def backup(path: Path, dest: Path) -> None:
    """An online, consistent copy through SQLite's backup API, checked after it is written."""
    if dest.exists():
        raise AdminError(f"{dest} exists; refusing to overwrite a backup")
    if not path.exists():
        raise AdminError(f"no ledger file at {path}")
    try:
        source = connect(path, readonly=True)
    except sqlite3.DatabaseError as exc:
        raise AdminError(f"cannot read ledger {path}: {exc}") from None
    try:
        dest.touch(mode=0o600, exist_ok=False)  # a copy of the ledger: its owner's only
        target = sqlite3.connect(str(dest))
    except OSError as exc:
        source.close()
        raise AdminError(f"cannot write {dest}: {exc.strerror or exc}") from None
    except sqlite3.Error as exc:
        source.close()
        raise AdminError(f"cannot write {dest}: {exc}") from None
    try:
        source.backup(target)
        problems = integrity_problems(target)
    except sqlite3.Error as exc:
        problems = [str(exc)]
    finally:
        target.close()
        source.close()
    if problems:
        # A copy that is not sound must not be mistaken for a backup later.
        dest.unlink(missing_ok=True)
        raise AdminError(f"the backup of {path} to {dest} failed: {problems[0]}")
