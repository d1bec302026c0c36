"""The ledger's named queries: the file rules the loader enforces, every name the code runs
exists, no query is dead, and every PostgreSQL text is one PostgreSQL accepts."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from tests import pgdb
from tether.supervisor.ledger import queries
from tether.supervisor.ledger.invariants import INVARIANTS

pg_url = pgdb.pg_url

ROOT = Path(__file__).resolve().parents[3]
# A query run by name: `tx.one("name", ...)`, `s.all("name")`, `tx.many("name", ...)`.
CALL = re.compile(r"\.(?:one|all|run|many)\(\s*\"([a-z][a-z0-9_]*)\"")
LITERAL = re.compile(r"\"([a-z][a-z0-9_]*)\"")


def _sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "supervisor").rglob("*.py")))


def test_every_name_the_code_runs_is_a_query_in_both_dialects() -> None:
    called = set(CALL.findall(_sources()))
    assert len(called) > 100  # the pattern still finds the calls
    for dialect in queries.DIALECTS:
        missing = called - set(queries.load(dialect))
        assert not missing, f"{dialect}: no query named {sorted(missing)}"


def test_no_query_is_dead() -> None:
    named = set(LITERAL.findall(_sources())) | {n.replace("-", "_") for n in INVARIANTS}
    unused = set(queries.load("sqlite")) - named
    assert not unused, f"queries nothing runs: {sorted(unused)}"


def test_states_are_bound_from_the_enums() -> None:
    assert queries.bind_states("x = {StepState.QUEUED}", "t") == "x = 'queued'"
    assert queries.bind_states("x = {TaskState.RUNNING}", "t") == "x = 'RUNNING'"
    with pytest.raises(queries.QueryFileError, match="names no state"):
        queries.bind_states("x = {StepState.PARKED}", "t")
    with pytest.raises(queries.QueryFileError, match="brace"):
        queries.bind_states("x = '{}'", "t")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT 1;", "before the first"),
        ("-- name: a\nSELECT 1;", "no line saying"),
        ("-- name: a\n-- purpose\n", "no statement"),
        ("-- name: a\n-- purpose\nSELECT 1; SELECT 2;", "more than one statement"),
    ],
)
def test_a_malformed_file_is_refused(text: str, message: str) -> None:
    with pytest.raises(queries.QueryFileError, match=message):
        queries.parse(text, "bad.sql")


def test_parse_keeps_name_purpose_and_statement() -> None:
    parsed = queries.parse(
        "-- name: first\n-- What it is for.\nSELECT 1\n-- a comment\nFROM t;\n\n"
        "-- name: second\n-- Another.\nDELETE FROM t;\n",
        "ok.sql",
    )
    assert parsed == [
        ("first", "What it is for.", "SELECT 1\nFROM t"),
        ("second", "Another.", "DELETE FROM t"),
    ]


def test_postgresql_placeholders_leave_quoted_text_alone() -> None:
    assert queries.to_pyformat("SELECT '?%' || ? WHERE a LIKE ? AND b % 2") == (
        "SELECT '?%%' || %s WHERE a LIKE %s AND b %% 2"
    )


def _numbered(text: str) -> str:
    """psycopg's `%s` as PREPARE's `$1, $2, ...` (and `%%` as `%`)."""
    count = iter(range(1, 1000))
    return re.sub(r"%%|%s", lambda m: "%" if m.group() == "%%" else f"${next(count)}", text)


def test_every_postgresql_text_prepares(pg_url: str) -> None:
    """PostgreSQL parses and types each statement against the migrated schema: a broken twin
    fails here, not on the first request that runs it."""
    failures: list[str] = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for i, query in enumerate(queries.load("postgresql").values()):
            try:
                with conn.transaction():
                    conn.execute(f"PREPARE q{i} AS {_numbered(query.text)}")
            except psycopg.Error as exc:
                failures.append(f"{query.name} ({query.source}): {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)
