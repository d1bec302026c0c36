"""The ledger under test, as the measurements seed it and read their figures back: a SQLite
file (`FileLedger`, `bench.seed`'s functions on the file) or a PostgreSQL database
(`PgLedger`), behind one `BenchLedger` interface, so that `bench.steps` and `bench.overhead`
measure either one unchanged.

`PgLedger` seeds through the ledger's own rules (`Transactions` on the PostgreSQL backend's
writer connection, the same path `tether-supervisor serve --db postgresql://...` writes by),
before the supervisors are timed, and reads the figures with the same SQL as `bench.seed`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from bench import seed
from tether.supervisor.ledger import LedgerConfig, Tx, identity, operator, tokens
from tether.supervisor.ledger.backends import is_postgres, open_backend
from tether.supervisor.ledger.batch import Transactions


class BenchLedger(Protocol):
    """What a measurement does to the ledger outside the processes it times."""

    def create_tasks(self, pool: str, count: int, *, approve: bool) -> list[tuple[str, str]]: ...
    def create_token(self, scope: str, role: str, dest: Path) -> Path: ...
    def succeeded(self, pool: str) -> int: ...
    def steps_in_state(self, pool: str, state: str) -> int: ...
    def step_rows(self, pool: str) -> list[tuple[float, float]]: ...
    def step_rows_with_messages(self, pool: str) -> list[tuple[float, float, Any]]: ...
    def window(self, pool: str) -> tuple[int, float]: ...
    def cancel_pool(self, pool: str) -> int: ...


class FileLedger:
    """A SQLite ledger file: `bench.seed` on it, as every SQLite measurement does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create_tasks(self, pool: str, count: int, *, approve: bool) -> list[tuple[str, str]]:
        return seed.create_tasks(self.path, pool, count, approve=approve)

    def create_token(self, scope: str, role: str, dest: Path) -> Path:
        return seed.create_token(self.path, scope, role, dest)

    def succeeded(self, pool: str) -> int:
        return seed.succeeded(self.path, pool)

    def steps_in_state(self, pool: str, state: str) -> int:
        return seed.steps_in_state(self.path, pool, state)

    def step_rows(self, pool: str) -> list[tuple[float, float]]:
        return seed.step_rows(self.path, pool)

    def step_rows_with_messages(self, pool: str) -> list[tuple[float, float, Any]]:
        return seed.step_rows_with_messages(self.path, pool)

    def window(self, pool: str) -> tuple[int, float]:
        return seed.window(self.path, pool)

    def cancel_pool(self, pool: str) -> int:
        return seed.cancel_pool(self.path, pool)


_COMMITTED = (
    "SELECT a.granted_at, e.created_at{extra} FROM effects e"
    " JOIN attempts a ON a.step_id = e.step_id AND a.fence = e.fence{join}"
    " JOIN tasks t ON t.id = e.task_id WHERE t.pool = %s"
)


class PgLedger:
    """A PostgreSQL ledger database at `url` (created and migrated by the first write)."""

    def __init__(self, url: str) -> None:
        self.url = url

    @contextmanager
    def _transactions(self) -> Iterator[Transactions]:
        backend = open_backend(self.url)
        db = backend.open_writer()
        try:
            yield Transactions(db=db, config=LedgerConfig(), clock=time.time, backend=backend)
        finally:
            backend.close_writer(db)

    def _run(self, rules: Sequence[Callable[[Tx], Any]]) -> list[Any]:
        with self._transactions() as transactions:
            return _values(transactions, rules)

    def _rows(self, query: str, params: Sequence[Any]) -> list[Any]:
        from tether.supervisor.ledger import pg_schema

        with pg_schema.connect(self.url) as conn:
            return list(conn.execute(query, tuple(params)).fetchall())

    def create_tasks(self, pool: str, count: int, *, approve: bool) -> list[tuple[str, str]]:
        ids: list[tuple[str, str]] = []
        with self._transactions() as transactions:
            for start in range(0, count, seed.CHUNK):
                keys = range(start, min(count, start + seed.CHUNK))
                specs = [seed.spec(f"{pool}-{i}", pool) for i in keys]
                created = _values(transactions, [_creator(s) for s in specs])
                pairs = [(c.task_id, s.plan_hash) for s, c in zip(specs, created, strict=True)]
                ids += pairs
                if approve:
                    _values(transactions, [_approver(t, h) for t, h in pairs])
        return ids

    def create_token(self, scope: str, role: str, dest: Path) -> Path:
        [new] = self._run([lambda tx: tokens.create_token(tx, scope, role)])
        dest.write_text(new.secret + "\n", encoding="utf-8")
        dest.chmod(0o600)
        return dest

    def succeeded(self, pool: str) -> int:
        [row] = self._rows(
            "SELECT count(*) FROM tasks WHERE pool = %s AND state = 'SUCCEEDED'", (pool,)
        )
        return int(row[0])

    def steps_in_state(self, pool: str, state: str) -> int:
        [row] = self._rows(
            "SELECT count(*) FROM steps s JOIN tasks t ON t.id = s.task_id"
            " WHERE t.pool = %s AND s.state = %s",
            (pool, state),
        )
        return int(row[0])

    def step_rows(self, pool: str) -> list[tuple[float, float]]:
        rows = self._rows(_COMMITTED.format(extra="", join=""), (pool,))
        return [(float(r[0]), float(r[1])) for r in rows]

    def step_rows_with_messages(self, pool: str) -> list[tuple[float, float, Any]]:
        query = _COMMITTED.format(
            extra=", s.payload_json", join=" JOIN steps s ON s.id = e.step_id"
        )
        rows = self._rows(query, (pool,))
        return [(float(r[0]), float(r[1]), json.loads(r[2])["messages"]) for r in rows]

    def window(self, pool: str) -> tuple[int, float]:
        rows = self.step_rows(pool)
        if not rows:
            return 0, 0.0
        return len(rows), max(c for _, c in rows) - min(g for g, _ in rows)

    def cancel_pool(self, pool: str) -> int:
        rows = self._rows(
            f"SELECT id FROM tasks WHERE pool = %s AND {seed.NOT_ENDED}",
            (pool,),
        )
        open_ids = [str(r[0]) for r in rows]
        with self._transactions() as transactions:
            for start in range(0, len(open_ids), seed.CHUNK):
                _values(transactions, [_canceller(t) for t in open_ids[start : start + seed.CHUNK]])
        return len(open_ids)


def _values(transactions: Transactions, rules: Sequence[Callable[[Tx], Any]]) -> list[Any]:
    values = []
    for outcome in transactions.run(rules).outcomes:
        if outcome.error is not None:
            raise outcome.error
        values.append(outcome.value)
    return values


def _creator(s: identity.TaskSpec) -> Callable[[Tx], Any]:
    return lambda tx: identity.create_task(tx, s)


def _approver(task_id: str, plan_hash: str) -> Callable[[Tx], Any]:
    return lambda tx: operator.approve(tx, seed.TENANT, task_id, plan_hash, None, None)


def _canceller(task_id: str) -> Callable[[Tx], Any]:
    return lambda tx: operator.cancel(tx, seed.TENANT, task_id, "benchmark over")


def ledger_for(db: Path | str) -> BenchLedger:
    """The ledger `--db` names: a `postgresql://` URL, or a SQLite file."""
    if is_postgres(db):
        return PgLedger(str(db))
    return FileLedger(Path(db))
