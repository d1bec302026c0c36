"""Commands on the ledger itself, for operators on the owned box: init, tokens, check, backup,
budgets, repositories. They run the ledger's own rules through `Transactions`, beside running
supervisors if there are any (on SQLite, WAL and `BEGIN IMMEDIATE` serialise the writers; on
PostgreSQL, the advisory lock every batch takes). `--db` is a file, `sqlite:///path` or
`postgresql://...` (`backends.open_backend`).

Only `init_ledger` and `create_token(..., init=True)` create a ledger (a file, or the tables in
an empty database): every other command refuses a place with no ledger, so a mistyped `--db`
cannot leave an empty ledger behind."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from tether.supervisor import durable, repos
from tether.supervisor.ledger import (
    LedgerConfig,
    LedgerError,
    Tx,
    invariants,
    prefixes,
    repositories,
    tokens,
    views,
)
from tether.supervisor.ledger import queries as named_queries
from tether.supervisor.ledger.backend_protocol import Backend, WriteConnection
from tether.supervisor.ledger.backends import LedgerUrlError, SqliteBackend, open_backend
from tether.supervisor.ledger.batch import Transactions
from tether.supervisor.ledger.operator import budget_of, set_budget, set_verify_pool
from tether.supervisor.ledger.schema import connect, integrity_problems, newest_migration
from tether.supervisor.ledger.tx import ReadSession
from tether.supervisor.repos import Mirrors, diffs


class AdminError(Exception):
    """An admin command cannot proceed; the message is the one line to print."""


def backend_of(db: Path | str) -> Backend:
    """The storage `--db` names; a bad one is an `AdminError` with the line to print."""
    try:
        return open_backend(db)
    except LedgerUrlError as exc:
        raise AdminError(str(exc)) from None


def ledger_exists(db: Path | str) -> bool:
    backend = backend_of(db)
    try:
        return backend.exists()
    except LedgerError as exc:
        raise AdminError(f"cannot open ledger {backend.where}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class OpenLedger:
    """A ledger opened for one admin command: its backend and the connection rules run on."""

    backend: Backend
    db: WriteConnection

    def reads(self) -> ReadSession:
        return ReadSession(self.db, named_queries.load(self.backend.dialect))


@contextlib.contextmanager
def ledger_file(db: Path | str, *, must_exist: bool = True) -> Iterator[OpenLedger]:
    """The ledger `db` names, checked and migrated (a file, or a database)."""
    backend = backend_of(db)
    if must_exist and not ledger_exists(db):
        raise AdminError(f"no ledger {'file ' if is_file(backend) else ''}at {backend.where}")
    try:
        conn = backend.open_writer()
    except (LedgerError, sqlite3.DatabaseError) as exc:
        raise AdminError(f"cannot open ledger {backend.where}: {exc}") from None
    try:
        yield OpenLedger(backend, conn)
    finally:
        backend.close_writer(conn)


@contextlib.contextmanager
def ledger_reads(db: Path | str) -> Iterator[ReadSession]:
    """The ledger `db` names, for a command that only reads it. A file at this tether's schema
    is opened read-only, so the command works on a read-only copy and beside a running
    supervisor without writing anything; an older file is migrated first (`ledger_file`), as
    every other command does; a database is read through its writer connection."""
    backend = backend_of(db)
    if not ledger_exists(db):
        raise AdminError(f"no ledger {'file ' if is_file(backend) else ''}at {backend.where}")
    if isinstance(backend, SqliteBackend):
        try:
            conn = connect(backend.path, readonly=True)
        except sqlite3.DatabaseError as exc:
            raise AdminError(f"cannot open ledger {backend.where}: {exc}") from None
        try:
            if int(conn.execute("PRAGMA user_version").fetchone()[0]) >= newest_migration():
                yield ReadSession(conn)
                return
        finally:
            conn.close()
    with ledger_file(db) as opened:
        yield opened.reads()


def is_file(backend: Backend) -> bool:
    return isinstance(backend, SqliteBackend)


def run_rule(ledger: OpenLedger, rule: Callable[[Tx], Any]) -> Any:
    """Run one ledger rule on the wall clock and commit it; a refusal becomes an `AdminError`."""
    transactions = Transactions(
        db=ledger.db, config=LedgerConfig(), clock=time.time, backend=ledger.backend
    )
    try:
        return transactions.one(rule)
    except LedgerError as exc:
        raise AdminError(str(exc)) from None


def init_ledger(path: Path | str) -> bool:
    """Create the ledger at `path` if there is none; return whether it was created. An
    existing one is only opened (checked and migrated), so a script may run this twice."""
    new_ledger = not ledger_exists(path)
    with ledger_file(path, must_exist=False):
        pass
    return new_ledger


def create_token(
    path: Path | str, scope: str, role: str, *, name: str | None = None, init: bool = False
) -> tokens.NewToken:
    """With `init`, the first token may create the ledger; a refused one leaves no new file
    behind (a database keeps its new, empty tables)."""
    backend = backend_of(path)
    new_file = is_file(backend) and not ledger_exists(path)
    try:
        with ledger_file(path, must_exist=not init) as db:
            created: tokens.NewToken = run_rule(
                db, lambda tx: tokens.create_token(tx, scope, role, name)
            )
    except AdminError:
        if new_file:
            file = Path(backend.where)
            for leftover in (file, Path(f"{file}-wal"), Path(f"{file}-shm")):
                leftover.unlink(missing_ok=True)
        raise
    return created


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def list_tokens(path: Path | str) -> list[str]:
    """`ID TENANT ROLE CREATED [revoked] name=NAME last_used=TIME`, one line per token: the
    first fields as they always were, then `name=-` for a token without a name and
    `last_used=never` for one never used (names hold no spaces and no `=`)."""
    with ledger_reads(path) as reads:
        records = tokens.list_tokens(reads)
    return [
        " ".join(
            [
                r.id,
                r.scope,
                r.role.value,
                _utc(r.created_at),
                *(["revoked"] if r.revoked else []),
                f"name={r.name or '-'}",
                f"last_used={'never' if r.last_used_at is None else _utc(r.last_used_at)}",
            ]
        )
        for r in records
    ]


def revoke_token(path: Path | str, token: str) -> tokens.TokenRecord:
    """Revoke a token by its id, or by its name while one live token holds it."""
    with ledger_file(path) as db:
        revoked: tokens.TokenRecord = run_rule(db, lambda tx: tokens.revoke_token(tx, token))
    return revoked


def set_tenant_budget(path: Path | str, tenant: str, budget: int | None) -> None:
    with ledger_file(path) as db:  # a budget on a mistyped path would bind nobody
        run_rule(db, lambda tx: set_budget(tx, tenant, budget))


def set_tenant_verify_pool(path: Path | str, tenant: str, pool: str | None) -> None:
    with ledger_file(path) as db:
        run_rule(db, lambda tx: set_verify_pool(tx, tenant, pool))


def show_budget(path: Path | str, tenant: str) -> str:
    """`tenant=T spent=N budget=B left=L`, with `unlimited` for B and L when there is no
    budget."""
    with ledger_reads(path) as reads:
        try:
            found = budget_of(reads, tenant)
        except LedgerError as exc:
            raise AdminError(str(exc)) from None
    unlimited = "unlimited"
    return (
        f"tenant={found.tenant} spent={found.spent}"
        f" budget={unlimited if found.budget is None else found.budget}"
        f" left={unlimited if found.left is None else found.left}"
    )


def add_repository(
    path: Path | str, tenant: str, name: str, url: str, setup: tuple[str, ...] | None = None
) -> tuple[repositories.Repository, str | None, bool]:
    """Check that git can read `url` (`git ls-remote`), then record it as `tenant`'s
    repository `name` with its `setup` commands (given: they replace a known repository's);
    return the record, the remote's HEAD (None for an empty repository) and whether it is new.
    A relative path that exists is made absolute first: the supervisor reads it later from
    another working directory."""
    if "://" not in url and Path(url).exists() and not Path(url).is_absolute():
        url = str(Path(url).resolve())
    with ledger_file(path) as db:
        try:  # the rule checks these again; here so a bad name costs no network round trip
            repositories.check_repository_name(name)
            repositories.check_url(url)
            if setup is not None:
                repositories.check_setup(setup)
        except LedgerError as exc:
            raise AdminError(str(exc)) from None
        try:
            refs = anyio.run(repos.ls_remote, url)
        except repos.MirrorError as exc:
            raise AdminError(str(exc)) from None
        added: tuple[repositories.Repository, bool] = run_rule(
            db, lambda tx: repositories.add_repository(tx, tenant, name, url, setup)
        )
    return added[0], refs.get("HEAD"), added[1]


def list_repositories(path: Path | str) -> list[str]:
    """`TENANT NAME URL ADDED [setup=JSON]`, one line per repository (URLs hold no password:
    `repo add` refuses one); `setup=` lists its setup commands, when it has any."""
    with ledger_reads(path) as reads:
        records = repositories.list_repositories(reads)
    return [
        f"{r.tenant} {r.name} {r.url} {_utc(r.added_at)}"
        + (f" setup={json.dumps(list(r.setup))}" if r.setup else "")
        for r in records
    ]


def remove_repository(path: Path | str, tenant: str, name: str) -> repositories.Repository:
    with ledger_file(path) as db:
        removed: repositories.Repository = run_rule(
            db, lambda tx: repositories.remove_repository(tx, tenant, name)
        )
    return removed


def check(path: Path | str) -> list[str]:
    """Integrity and every ledger invariant; an empty list means the ledger is sound. A file
    is read without writing it; a database's integrity is its server's, and its schema must
    be this tether's (a supervisor or `init` migrates it)."""
    backend = backend_of(path)
    if not ledger_exists(path):
        raise AdminError(f"no ledger {'file ' if is_file(backend) else ''}at {backend.where}")
    if not isinstance(backend, SqliteBackend):
        with ledger_file(path) as opened:  # migrated to this tether's schema first
            return invariants.find_violations(opened.reads())
    try:
        db = connect(backend.path, readonly=True)
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


def backup(db: Path | str, dest: Path) -> None:
    """An online, consistent copy through SQLite's backup API, checked after it is written."""
    backend = backend_of(db)
    if not isinstance(backend, SqliteBackend):
        raise AdminError(
            f"backup copies a ledger file; back up {backend.where} with pg_dump"
            f" (pg_dump --format=custom --file={dest} URL)"
        )
    path = backend.path
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
    try:  # its bytes (SQLite synced them at its commit; again, whatever its settings), its name
        durable.created(dest.absolute())
    except OSError as exc:
        raise AdminError(f"cannot sync the backup {dest}: {exc.strerror or exc}") from None


def candidate(
    db: Path | str, task: str, step: str | None, mirror_dir: Path | None
) -> tuple[Path, diffs.Candidate]:
    """The mirror and the candidate `task candidate --db` shows: the task by its id or a
    unique prefix (`prefixes`), its step's candidate (`diffs.pick`), in the mirror folder
    beside a ledger file unless `mirror_dir` names it (a database's has no such place)."""
    backend = backend_of(db)
    if mirror_dir is None:
        if not is_file(backend):
            raise AdminError(
                f"give the supervisor's mirror folder (--mirror-dir) for {backend.where}"
            )
        mirror_dir = Path(backend.where).parent / "mirrors"
    try:
        with ledger_reads(db) as reads:
            task_id = prefixes.resolve_task_id(reads, None, task)
            view = views.task_view(reads, task_id, None, now=time.time())
            binding = repositories.binding_of_task(reads, None, task_id)
    except LedgerError as exc:
        raise AdminError(str(exc)) from None
    if binding is None:
        raise AdminError(f"task {task_id} names no repository: it has no candidate")
    try:
        chosen = diffs.pick(view, step)
    except diffs.CandidateError as exc:
        raise AdminError(str(exc)) from None
    return Mirrors(mirror_dir).path(binding.url), chosen
