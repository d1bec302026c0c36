"""The ledger's SQL: every statement is a named query in the `.sql` files of `sql/queries/`.

One file per topic, procrastinate's `queries.sql` the model: each query is a `-- name:` line,
one comment line saying what it is for, then the statement.

    -- name: next_fence
    -- Take the next fencing token.
    UPDATE counters SET value = value + 1 WHERE name = 'fence' RETURNING value;

`<topic>.sql` holds the queries both backends run as written; `<topic>.sqlite.sql` and
`<topic>.postgresql.sql` hold, side by side, the ones whose text differs (a name must then be
in both, and in no shared file), and the few of `FOLDS`: one statement of one dialect doing
what the other runs as several, the code asking `name in tx.sql`. States are never written
as literals: `{StepState.QUEUED}` is bound, when the files are loaded, to that member of
`states.py`'s enums, so a renamed state fails at import rather than matching nothing.

Parameters are named, `:step_id`, and a value used twice in a statement is named twice, not
passed twice; a `?` is refused. `Query.params` lists each query's names, which `Tx` checks
every call's keywords against:

    -- name: extend_lease
    -- Extend a step's lease to a new deadline; a renew also acknowledges it.
    UPDATE steps SET lease_deadline = :lease_deadline, accept_deadline = NULL WHERE id = :step_id;

    tx.run("extend_lease", lease_deadline=deadline, step_id=step_id)

The PostgreSQL text gets psycopg's `%(step_id)s`, with a literal `%` doubled, and is given
the keywords. SQLite's gets a `?` for each use of a name and is given a tuple of the values
(`binder`): sqlite3 reads a mapping by making a string of each parameter's name at every
call, 3.6% more instructions per step in bench.groupcommit's loop. Neither a `::` cast nor
a colon inside a quoted string or a comment names a parameter.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, Literal

from tether.supervisor.ledger.states import AttemptState, StepState, TaskState

Dialect = Literal["sqlite", "postgresql"]
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql")
# The queries only one dialect has, by name: its one statement for several the other runs
# apart (issue 28: PostgreSQL's data-modifying CTEs, which SQLite's `WITH` cannot hold).
FOLDS: Mapping[str, Dialect] = {
    "grant_lease": "postgresql",
    "commit_result": "postgresql",
    "count_usage": "postgresql",
}

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$")
_BOUND = re.compile(r"\{([A-Za-z]+)\.([A-Z_]+)\}")
# A named parameter: a colon and a name, the colon not one of a `::` cast's.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class QueryFileError(ValueError):
    """A query file breaks the rules above; raised when the files are loaded."""


class QueryParamsError(TypeError):
    """A call gave a query other parameters than its text names: a mistake in the code."""


@dataclasses.dataclass(frozen=True, slots=True)
class Query:
    """One named query as a dialect runs it."""

    name: str
    purpose: str
    text: str  # given as in its file; kept in `dialect`'s placeholders
    source: str  # the file it came from
    params: tuple[str, ...] = ()  # its parameters' names, each once, in order of first use
    # What the text is given for the keywords of a call (`Tx`): on SQLite their values in the
    # order of the text's `?`s, on PostgreSQL the keywords (`%(name)s`). A KeyError when one
    # of `params` is missing; `values` compares the number given with `size` for the unexpected.
    bind: Callable[[Mapping[str, Any]], Any] = dataclasses.field(init=False, compare=False)
    size: int = dataclasses.field(init=False)
    # The same names as a set (`wrong_params`).
    names: frozenset[str] = dataclasses.field(init=False)
    dialect: Dialect = "sqlite"
    # The record types whose fields this query's columns were checked against
    # (`records.from_row`).
    read_as: set[type] = dataclasses.field(default_factory=set, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(self.params))
        object.__setattr__(self, "size", len(self.params))
        if self.dialect == "postgresql":
            object.__setattr__(self, "text", to_pyformat(self.text))
            object.__setattr__(self, "bind", _given(self.params))
        else:
            text, order = to_qmark(self.text)
            object.__setattr__(self, "text", text)
            object.__setattr__(self, "bind", binder(order))

    def values(self, params: Mapping[str, Any]) -> Any:
        """What the text is given for the keywords `params` of a call; `QueryParamsError` when
        they are not this query's parameters."""
        try:
            values = self.bind(params)
        except KeyError:
            raise self.wrong_params(params) from None
        if len(params) != self.size:
            raise self.wrong_params(params)
        return values

    def wrong_params(self, given: Iterable[str]) -> QueryParamsError:
        """The error for a call whose keywords are not this query's parameters."""
        given = set(given)
        missing, unexpected = sorted(self.names - given), sorted(given - self.names)
        parts = [f"missing {', '.join(missing)}" if missing else "", ""]
        if unexpected:
            parts[1] = f"unexpected {', '.join(unexpected)}"
        said = "; ".join(p for p in parts if p)
        return QueryParamsError(f"query {self.name} ({self.source}): {said}")


def _enums() -> Mapping[str, type[enum.Enum]]:
    return {"TaskState": TaskState, "StepState": StepState, "AttemptState": AttemptState}


def parse(text: str, source: str) -> list[tuple[str, str, str]]:
    """The (name, purpose, statement) of each query in one file's `text`."""
    found: list[tuple[str, str, str]] = []
    name: str | None = None
    purpose = ""
    body: list[str] = []

    def finish() -> None:
        statement = "\n".join(body).strip().rstrip(";").strip()
        if name is None:
            if statement:
                raise QueryFileError(f"{source}: text before the first '-- name:' line")
            return
        if not purpose:
            raise QueryFileError(f"{source}: query {name} has no line saying what it is for")
        if not statement:
            raise QueryFileError(f"{source}: query {name} has no statement")
        if ";" in statement:
            raise QueryFileError(f"{source}: query {name} holds more than one statement")
        found.append((name, purpose, statement))

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            finish()
            name, purpose, body = match.group(1), "", []
        elif name is not None and not purpose and not body and line.startswith("-- "):
            purpose = line[3:].strip()
        elif not line.lstrip().startswith("--"):
            body.append(line)
    finish()
    return found


def bind_states(statement: str, source: str) -> str:
    """Replace each `{Enum.MEMBER}` with that member's value as an SQL string literal."""
    enums = _enums()

    def literal(match: re.Match[str]) -> str:
        kind, member = match.group(1), match.group(2)
        if kind not in enums or member not in enums[kind].__members__:
            raise QueryFileError(f"{source}: {{{kind}.{member}}} names no state")
        return "'" + str(enums[kind][member].value) + "'"

    bound = _BOUND.sub(literal, statement)
    if "{" in bound or "}" in bound:
        raise QueryFileError(f"{source}: a brace that binds no state: {bound!r}")
    return bound


def _scan(statement: str) -> Iterator[tuple[str, bool]]:
    """`statement` in pieces, each with whether it is quoted text or a comment (where a `:`
    or a `?` is only a character)."""
    start, i, n = 0, 0, len(statement)
    while i < n:
        char = statement[i]
        if char in "'\"":
            end = statement.find(char, i + 1)
            end = n if end < 0 else end + 1
        elif statement.startswith("--", i):
            end = statement.find("\n", i)
            end = n if end < 0 else end
        else:
            i += 1
            continue
        if start < i:
            yield statement[start:i], False
        yield statement[i:end], True
        start = i = end
    if start < n:
        yield statement[start:], False


def params_of(statement: str, source: str, name: str) -> tuple[str, ...]:
    """The names of `statement`'s parameters, each once, in order of first use."""
    found: dict[str, None] = {}
    marks = False
    for piece, quoted in _scan(statement):
        if not quoted:
            marks = marks or "?" in piece
            found.update(dict.fromkeys(m.group(1) for m in _PARAM.finditer(piece)))
    if marks:
        how = "mixes `?` with named parameters" if found else "has a `?` parameter"
        raise QueryFileError(f"{source}: query {name} {how}; name each one (`:step_id`)")
    return tuple(found)


def to_qmark(statement: str) -> tuple[str, tuple[str, ...]]:
    """Each `:name` as `?`, and the names in the order of the `?`s, a name used twice twice."""
    out: list[str] = []
    order: list[str] = []

    def mark(match: re.Match[str]) -> str:
        order.append(match.group(1))
        return "?"

    for piece, quoted in _scan(statement):
        out.append(piece if quoted else _PARAM.sub(mark, piece))
    return "".join(out), tuple(order)


def binder(order: Sequence[str]) -> Callable[[Mapping[str, Any]], Sequence[Any]]:
    """The values of `order`'s names in a mapping, as a tuple (`operator.itemgetter`)."""
    if not order:
        return _no_values
    if len(order) == 1:
        [key] = order
        return lambda params: (params[key],)
    return operator.itemgetter(*order)


def _no_values(params: Mapping[str, Any]) -> Sequence[Any]:
    return ()


def _given(names: Sequence[str]) -> Callable[[Mapping[str, Any]], Any]:
    """The mapping itself, once each of `names` is found in it (psycopg's `%(name)s`)."""
    getter = binder(names)

    def given(params: Mapping[str, Any]) -> Any:
        getter(params)
        return params

    return given


def to_pyformat(statement: str) -> str:
    """Each `:name` as psycopg's `%(name)s`, and a literal `%` doubled (quoted text included:
    psycopg reads every `%`). A `?`, which no named query holds, becomes `%s`: the explorer's
    and the tests' own statements are written with `?` and given a tuple."""
    out: list[str] = []
    for piece, quoted in _scan(statement):
        text = piece.replace("%", "%%")
        out.append(text if quoted else _PARAM.sub(r"%(\1)s", text).replace("?", "%s"))
    return "".join(out)


_Found = tuple[str, str, str, tuple[str, ...]]  # purpose, statement, file, parameters


@functools.cache
def load(dialect: Dialect) -> Mapping[str, Query]:
    """Every query, by name, in `dialect`'s text. Cached: the files are read once."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    folder = resources.files("tether.supervisor.ledger").joinpath("sql", "queries")
    shared: dict[str, _Found] = {}
    per_dialect: dict[Dialect, dict[str, _Found]] = {d: {} for d in DIALECTS}
    for entry in sorted(folder.iterdir(), key=lambda f: f.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = entry.name.split(".")
        if len(parts) == 2:
            home = shared
        elif len(parts) == 3 and parts[1] in DIALECTS:
            home = per_dialect[parts[1]]
        else:
            raise QueryFileError(f"{entry.name}: name a file <topic>.sql or <topic>.<dialect>.sql")
        for name, purpose, statement in parse(entry.read_text(encoding="utf-8"), entry.name):
            if name in home:
                raise QueryFileError(f"{entry.name}: query {name} is defined twice")
            bound = bind_states(statement, entry.name)
            params = params_of(bound, entry.name, name)
            home[name] = (purpose, bound, entry.name, params)
    sqlite_only, pg_only = set(per_dialect["sqlite"]), set(per_dialect["postgresql"])
    folds = {name for d in DIALECTS for name in per_dialect[d] if FOLDS.get(name) == d}
    if wrong := sorted((sqlite_only ^ pg_only) ^ folds | (set(FOLDS) - folds)):
        raise QueryFileError(
            "queries in one dialect's file but not the other's (each of FOLDS in its own"
            f" dialect's alone): {wrong}"
        )
    if both := sorted((sqlite_only | pg_only) & set(shared)):
        raise QueryFileError(f"queries both shared and per dialect: {both}")
    merged = {**shared, **per_dialect[dialect]}
    return {name: Query(name, *found, dialect) for name, found in merged.items()}
