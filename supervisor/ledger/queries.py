"""The ledger's SQL: every statement is a named query in the `.sql` files of `sql/queries/`.

One file per topic, procrastinate's `queries.sql` the model: each query is a `-- name:` line,
one comment line saying what it is for, then the statement.

    -- name: next_fence
    -- Take the next fencing token.
    UPDATE counters SET value = value + 1 WHERE name = 'fence' RETURNING value;

`<topic>.sql` holds the queries both backends run as written; `<topic>.sqlite.sql` and
`<topic>.postgresql.sql` hold, side by side, the ones whose text differs (a name must then be
in both, and in no shared file). States are never written as literals: `{StepState.QUEUED}`
is bound, when the files are loaded, to that member of `states.py`'s enums, so a renamed
state fails at import rather than matching nothing. Parameters are `?` placeholders in every
file; the PostgreSQL text gets psycopg's `%s`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Literal

from tether.supervisor.ledger.states import AttemptState, StepState, TaskState

Dialect = Literal["sqlite", "postgresql"]
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql")

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$")
_BOUND = re.compile(r"\{([A-Za-z]+)\.([A-Z_]+)\}")


class QueryFileError(ValueError):
    """A query file breaks the rules above; raised when the files are loaded."""


@dataclasses.dataclass(frozen=True)
class Query:
    name: str
    purpose: str
    text: str  # in the dialect it was loaded for
    source: str  # the file it came from


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


def to_pyformat(statement: str) -> str:
    """`?` placeholders as psycopg's `%s`, and a literal `%` doubled, outside quoted text."""
    out: list[str] = []
    quote: str | None = None
    for char in statement:
        if quote is not None:
            if char == quote:
                quote = None
            out.append("%%" if char == "%" else char)
        elif char in "'\"":
            quote = char
            out.append(char)
        elif char == "?":
            out.append("%s")
        else:
            out.append("%%" if char == "%" else char)
    return "".join(out)


@functools.cache
def load(dialect: Dialect) -> Mapping[str, Query]:
    """Every query, by name, in `dialect`'s text. Cached: the files are read once."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    folder = resources.files("tether.supervisor.ledger").joinpath("sql", "queries")
    shared: dict[str, Query] = {}
    per_dialect: dict[Dialect, dict[str, Query]] = {d: {} for d in DIALECTS}
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
            home[name] = Query(name, purpose, bind_states(statement, entry.name), entry.name)
    sqlite_only, pg_only = set(per_dialect["sqlite"]), set(per_dialect["postgresql"])
    if sqlite_only != pg_only:
        lonely = sorted(sqlite_only ^ pg_only)
        raise QueryFileError(f"queries in one dialect's file but not the other's: {lonely}")
    if both := sorted(sqlite_only & set(shared)):
        raise QueryFileError(f"queries both shared and per dialect: {both}")
    merged = {**shared, **per_dialect[dialect]}
    if dialect == "postgresql":
        merged = {
            name: dataclasses.replace(q, text=to_pyformat(q.text)) for name, q in merged.items()
        }
    return merged


@functools.cache
def texts(dialect: Dialect) -> Mapping[str, str]:
    """Name -> statement in `dialect`: what `Tx` and read sessions look names up in."""
    return {name: query.text for name, query in load(dialect).items()}
