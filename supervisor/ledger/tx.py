"""The context every ledger rule runs in: one open write transaction and the supervisor's clock.

Rules are plain synchronous functions of a `Tx`. The store runs them on its writer thread inside
`BEGIN IMMEDIATE`; the schedule explorer runs the very same functions on a temporary file with a
virtual clock. Nothing in a rule reads the wall clock or generates randomness on its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from tether.supervisor.ledger import queries
from tether.supervisor.ledger.decisions import Decision, Note
from tether.supervisor.ledger.destinations import PUBLIC_HOSTS, Destinations
from tether.supervisor.ledger.queries import Query
from tether.supervisor.ledger.records import Record, from_row
from tether.wire.payloads import EFFECT_KINDS


@dataclasses.dataclass(frozen=True, kw_only=True)
class LedgerConfig:
    """The ledger's tunables (docs/design.md, Command line and settings)."""

    lease_ttl_s: float = 30.0
    accept_window_s: float = 10.0
    max_attempts: int = 5
    max_steps: int = 256
    # A task may name a kind announced by a runner of its pool seen within this (identity).
    runner_seen_window_s: float = 3600.0
    # Plan step kinds the supervisor delivers itself (docs/design.md, Effects): never leased.
    effect_kinds: frozenset[str] = EFFECT_KINDS
    # How long a dispatcher's hold on an effect lasts without a refresh.
    effect_hold_s: float = 60.0
    # Where `http` and `git.push` effects may go (settings `effect_allowed_hosts*`).
    effect_destinations: Destinations = PUBLIC_HOSTS

    @property
    def renew_every_s(self) -> float:
        """A third of the TTL, and often enough to acknowledge within the acceptance window."""
        return min(self.lease_ttl_s / 3, self.accept_window_s / 2)


ALL_POOLS = "*"  # pools are names of runner tokens' scopes, which cannot be empty or "*"
# Woken (`Tx.wake`) when an effect may be ready for the dispatcher: no pool has this name.
EFFECTS = ""


class Row(Protocol):
    """A row as both backends give it: by column name or position (`sqlite3.Row`, and the
    PostgreSQL adapter's rows)."""

    def __getitem__(self, key: int | str, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...
    def keys(self) -> list[str]: ...


R = TypeVar("R", bound=Record)


class Statements(Protocol):
    """What reads run named queries (`queries`) on: a `Tx`, or a read-only session. The
    query's name is positional only (a query may have a parameter called `name`); its
    parameters are keywords, exactly those its text names (`queries.QueryParamsError`)."""

    def one(self, name: str, /, **params: Any) -> Row | None: ...
    def all(self, name: str, /, **params: Any) -> list[Row]: ...


class TypedReads(Statements, Protocol):
    """`Statements` that also give rows as typed records (`records`): a `Tx`, or a
    `ReadSession`."""

    def one_as(self, record: type[R], name: str, /, **params: Any) -> R | None: ...
    def all_as(self, record: type[R], name: str, /, **params: Any) -> list[R]: ...


class Connection(Protocol):
    """The DB-API surface the ledger uses: `sqlite3.Connection`, or the PostgreSQL adapter's.
    The named queries pass their parameters by name; the backends' own statements, in order."""

    def execute(self, sql: str, parameters: Mapping[str, Any] | Sequence[Any] = (), /) -> Any: ...
    def executemany(
        self, sql: str, parameters: Iterable[Mapping[str, Any] | Sequence[Any]], /
    ) -> Any: ...


def _default_queries() -> Mapping[str, Query]:
    return queries.load("sqlite")


class NamedReads:
    """The reads of `Statements` and `TypedReads` over `db` and its named queries `sql`, for
    `ReadSession` and `Tx`."""

    __slots__ = ()
    db: Connection
    sql: Mapping[str, Query]

    def one(self, name: str, /, **params: Any) -> Row | None:
        """Run the query `name`; its first row, or None."""
        query = self.sql[name]
        values = query.values(params)
        row: Row | None = self.db.execute(query.text, values).fetchone()
        return row

    def all(self, name: str, /, **params: Any) -> list[Row]:
        """Run the query `name`; every row."""
        query = self.sql[name]
        values = query.values(params)
        rows: list[Row] = self.db.execute(query.text, values).fetchall()
        return rows

    def one_as(self, record: type[R], name: str, /, **params: Any) -> R | None:
        """`one`, its row as a `record` (`records.from_row`)."""
        row = self.one(name, **params)
        return None if row is None else from_row(record, row, self.sql[name])

    def all_as(self, record: type[R], name: str, /, **params: Any) -> list[R]:
        """`all`, each row as a `record` (`records.from_row`)."""
        query = self.sql[name]
        return [from_row(record, row, query) for row in self.all(name, **params)]


@dataclasses.dataclass(frozen=True, slots=True)
class ReadSession(NamedReads):
    """Named queries on a read-only connection (the store's reader, `check`, the explorer)."""

    db: Connection
    sql: Mapping[str, Query] = dataclasses.field(default_factory=_default_queries)


@dataclasses.dataclass(kw_only=True, slots=True)
class Tx(NamedReads):
    """One write transaction: the connection, the time it happens at, what it woke up, and the
    decisions it made (logged by the store once the transaction is durable)."""

    db: Connection
    now: float
    config: LedgerConfig
    new_id: Callable[[], str]
    # The named queries in this connection's dialect (`queries.load`).
    sql: Mapping[str, Query] = dataclasses.field(default_factory=_default_queries)
    # Set by rules so the store can wake long-pollers after the commit is durable: the pools
    # whose claims may now find work (ALL_POOLS for every pool). The tasks given events are
    # `evented`.
    woken_pools: set[str] = dataclasses.field(default_factory=set)
    notes: list[Note] = dataclasses.field(default_factory=list)
    # What the rule does ("renew", "result", ...), named in the log line of its refusal.
    request: str = "request"
    # Writes that stand even if the rule is refused: the batch runs them after rolling the
    # rule back, beside its rejection (the tokens a fenced-out attempt spent; `steps.charge`).
    after_refusal: list[Callable[[Tx], object]] = dataclasses.field(default_factory=list)
    # The events this rule appended (`journal.append_event`), in order, as (task id, kind,
    # state, data as JSON): written when the rule ends (`journal.settle`), with each task's
    # `tasks.last_seq`, rather than one statement per event; dropped when the rule is rolled
    # back, as are the tasks given events (`evented`).
    events: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    evented: set[str] = dataclasses.field(default_factory=set)

    def wake(self, pool: str) -> None:
        """Claims waiting in `pool` may find work once this transaction is durable."""
        self.woken_pools.add(pool)

    def note(self, decision: Decision, **fields: Any) -> None:
        """Log `decision` with `fields` once this transaction is durable (`decisions`)."""
        self.notes.append((decision, fields))

    def run(self, name: str, /, **params: Any) -> None:
        """Run the write `name`. It asks nothing back, so on PostgreSQL it is sent with the
        rule's next statement that does (`count`, a read, the rule's end)."""
        query = self.sql[name]
        values = query.values(params)
        self.db.execute(query.text, values)

    def count(self, name: str, /, **params: Any) -> int:
        """Run the write `name`; return the number of rows it changed."""
        query = self.sql[name]
        values = query.values(params)
        count: int = self.db.execute(query.text, values).rowcount
        return count

    def many(self, name: str, rows: Iterable[Mapping[str, Any]], /) -> None:
        """Run the write `name` once per row of parameters; nothing at all for no rows."""
        query = self.sql[name]
        values = [query.values(row) for row in rows]
        if values:
            self.db.executemany(query.text, values)


_encode = msgspec.json.Encoder(order="sorted").encode


def dumps(value: Any) -> str:
    """`value` as the ledger stores JSON: sorted keys, compact, non-ASCII as is. The same text
    as `json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` but for
    a float's exponent (`1e16`, not `1e+16`), read back alike by `loads`; about 5x cheaper.

    Nothing compares stored JSON with a new encoding except a runner's `kinds_json` (a list of
    strings), and hashes use `tether.wire.canonical_json`. What msgspec would encode otherwise
    (a NaN or an infinity, as null) or not at all (a dict with non-string keys) goes through
    `json.dumps`, as before.
    """
    try:
        data = _encode(value)
    except TypeError:
        return _json_dumps(value)
    if b"null" in data and _non_finite(value):
        return _json_dumps(value)
    return data.decode()


def _json_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_SEQUENCES = (list, tuple)
_WALKED = (float, dict, list, tuple)


def _non_finite(value: Any) -> bool:
    """Whether `value` holds a NaN or an infinity. A plain loop and a tuple of types: `any`
    over a generator, or `isinstance` with a union, costs as much as the encoding saves."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, _SEQUENCES):
        return False
    for item in value:  # noqa: SIM110 - see above
        if isinstance(item, _WALKED) and _non_finite(item):
            return True
    return False


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
