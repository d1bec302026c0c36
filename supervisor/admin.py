"""Commands on the ledger file itself, for operators on the owned box: init, tokens, check,
backup, budgets, repositories. They run the ledger's own rules through `Transactions`, beside a
running supervisor if there is one (WAL and `BEGIN IMMEDIATE` serialise the writers).

Only `init_ledger` and `create_token(..., init=True)` create a ledger file: every other command
refuses a path with no ledger, so a mistyped `--db` cannot leave an empty ledger behind."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from supervisor import repos
from supervisor.ledger import LedgerConfig, LedgerError, Tx, invariants, repositories, tokens
from supervisor.ledger.batch import Transactions
from supervisor.ledger.operator import budget_of, set_budget
from supervisor.ledger.schema import connect, integrity_problems, open_ledger_file
from supervisor.ledger.tx import ReadSession


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


def init_ledger(path: Path) -> bool:
    """Create the ledger file at `path` if there is none; return whether it was created. An
    existing file is only opened (checked and migrated), so a script may run this twice."""
    new_file = not path.exists()
    with ledger_file(path, must_exist=False):
        pass
    return new_file


def create_token(
    path: Path, scope: str, role: str, *, name: str | None = None, init: bool = False
) -> tokens.NewToken:
    """With `init`, the first token may create the ledger file; a refused one leaves no new
    file behind."""
    new_file = not path.exists()
    try:
        with ledger_file(path, must_exist=not init) as db:
            created: tokens.NewToken = run_rule(
                db, lambda tx: tokens.create_token(tx, scope, role, name)
            )
    except AdminError:
        if new_file:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
        raise
    return created


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def list_tokens(path: Path) -> list[str]:
    """`ID TENANT ROLE CREATED [revoked] name=NAME last_used=TIME`, one line per token: the
    first fields as they always were, then `name=-` for a token without a name and
    `last_used=never` for one never used (names hold no spaces and no `=`)."""
    with ledger_file(path) as db:
        records = tokens.list_tokens(ReadSession(db))
    return [
        " ".join(
            [
                r.id, r.scope, r.role.value, _utc(r.created_at),
                *(["revoked"] if r.revoked else []),
                f"name={r.name or '-'}",
                f"last_used={'never' if r.last_used_at is None else _utc(r.last_used_at)}",
            ]
        )
        for r in records
    ]  # fmt: skip


def revoke_token(path: Path, token: str) -> tokens.TokenRecord:
    """Revoke a token by its id, or by its name while one live token holds it."""
    with ledger_file(path) as db:
        revoked: tokens.TokenRecord = run_rule(db, lambda tx: tokens.revoke_token(tx, token))
    return revoked


def set_tenant_budget(path: Path, tenant: str, budget: int | None) -> None:
    with ledger_file(path) as db:  # a budget on a mistyped path would bind nobody
        run_rule(db, lambda tx: set_budget(tx, tenant, budget))


def show_budget(path: Path, tenant: str) -> str:
    """`tenant=T spent=N budget=B left=L`, with `unlimited` for B and L when there is no
    budget."""
    with ledger_file(path) as db:
        try:
            found = budget_of(ReadSession(db), tenant)
        except LedgerError as exc:
            raise AdminError(str(exc)) from None
    unlimited = "unlimited"
    return (
        f"tenant={found.tenant} spent={found.spent}"
        f" budget={unlimited if found.budget is None else found.budget}"
        f" left={unlimited if found.left is None else found.left}"
    )


def add_repository(
    path: Path, tenant: str, name: str, url: str
) -> tuple[repositories.Repository, str | None, bool]:
    """Check that git can read `url` (`git ls-remote`), then record it as `tenant`'s
    repository `name`; return the record, the remote's HEAD (None for an empty repository)
    and whether it is new. A relative path that exists is made absolute first: the supervisor
    reads it later from another working directory."""
    if "://" not in url and Path(url).exists() and not Path(url).is_absolute():
        url = str(Path(url).resolve())
    with ledger_file(path) as db:
        try:  # the rule checks these again; here so a bad name costs no network round trip
            repositories.check_repository_name(name)
            repositories.check_url(url)
        except LedgerError as exc:
            raise AdminError(str(exc)) from None
        try:
            refs = anyio.run(repos.ls_remote, url)
        except repos.MirrorError as exc:
            raise AdminError(str(exc)) from None
        added: tuple[repositories.Repository, bool] = run_rule(
            db, lambda tx: repositories.add_repository(tx, tenant, name, url)
        )
    return added[0], refs.get("HEAD"), added[1]


def list_repositories(path: Path) -> list[str]:
    """`TENANT NAME URL ADDED`, one line per repository (URLs hold no password: `repo add`
    refuses one)."""
    with ledger_file(path) as db:
        records = repositories.list_repositories(ReadSession(db))
    return [f"{r.tenant} {r.name} {r.url} {_utc(r.added_at)}" for r in records]


def remove_repository(path: Path, tenant: str, name: str) -> repositories.Repository:
    with ledger_file(path) as db:
        removed: repositories.Repository = run_rule(
            db, lambda tx: repositories.remove_repository(tx, tenant, name)
        )
    return removed


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
            problems += invariants.find_violations(ReadSession(db))
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
