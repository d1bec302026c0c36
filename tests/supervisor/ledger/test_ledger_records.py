"""Rows become typed records at one place (`records.from_row`): a row whose columns are not a
record's fields, in order, is refused rather than misread, and every query the code reads as a
record gives that record's fields on both backends."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import psycopg
import pytest

from tests import pgdb
from tether.supervisor.ledger import queries, records
from tether.supervisor.ledger.queries import Query
from tether.supervisor.ledger.records import NextStep, RowShapeError, from_row
from tether.supervisor.ledger.schema import open_ledger_file

pg_url = pgdb.pg_url

ROOT = Path(__file__).resolve().parents[3]


def _row(select: str) -> sqlite3.Row:
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    row: sqlite3.Row = db.execute(select).fetchone()
    return row


def test_a_row_missing_a_column_is_refused() -> None:
    row = _row("SELECT 's1' AS id, 'waiting' AS state")
    with pytest.raises(RowShapeError, match=r"not NextStep's: missing \['kind'\], extra \[\]"):
        from_row(NextStep, row)


def test_a_row_with_its_columns_in_another_order_is_refused_rather_than_misread() -> None:
    row = _row("SELECT 's1' AS id, 'http' AS kind, 'waiting' AS state")
    with pytest.raises(RowShapeError, match="in another order"):
        from_row(NextStep, row)


def test_a_querys_first_row_is_checked_and_its_later_rows_trusted() -> None:
    query = Query("next", "A test query.", "SELECT 1", "test.sql")
    row = _row("SELECT 's1' AS id, 'waiting' AS state, 'http' AS kind")
    assert from_row(NextStep, row, query) == NextStep(id="s1", state="waiting", kind="http")
    assert query.read_as == {NextStep}
    other = Query("other", "A test query.", "SELECT 1", "test.sql")
    with pytest.raises(RowShapeError, match="query other"):
        from_row(NextStep, _row("SELECT 's1' AS id, 'waiting' AS state"), other)
    assert other.read_as == set()  # refused: checked again next time


def _record_reads() -> list[tuple[type[records.Record], str]]:
    """The record and query of every `one_as`/`all_as` call in the supervisor and the
    explorer."""
    found: list[tuple[type[records.Record], str]] = []
    for folder in ("supervisor", "sim"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("one_as", "all_as")
                    and len(node.args) == 2
                    and isinstance(node.args[0], ast.Name)
                    and isinstance(node.args[1], ast.Constant)
                ):
                    found.append((getattr(records, node.args[0].id), node.args[1].value))
    assert len(found) > 15  # the walk still finds the calls
    return found + _rows_made_records()


def _rows_made_records() -> list[tuple[type[records.Record], str]]:
    """The record and query of every `from_row(Record, row)` in the supervisor whose `row`
    comes from a named query: `row = s.one("q")`, `for row in s.all("q")` (a loop or a
    comprehension), or a loop over a name so bound (the views, on `Statements`)."""
    found: list[tuple[type[records.Record], str]] = []
    for path in sorted((ROOT / "supervisor").rglob("*.py")):
        _walk(ast.parse(path.read_text(), str(path)), {}, found)
    assert len(found) > 30  # the walk still finds the calls
    return found


Bound = dict[str, frozenset[str]]


def _queries_of(node: ast.expr, bound: Bound) -> frozenset[str]:
    if isinstance(node, ast.Subscript):  # `rows[:limit]`
        return _queries_of(node.value, bound)
    if isinstance(node, ast.Name):
        return bound.get(node.id, frozenset())
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("one", "all")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return frozenset({node.args[0].value})
    return frozenset()


def _bind(target: ast.expr, value: ast.expr, bound: Bound, *, join: bool = False) -> None:
    if isinstance(target, ast.Name):
        queries_ = _queries_of(value, bound)
        if join and queries_:  # `row = s.one("a")` in one branch, `s.one("b")` in another
            queries_ |= bound.get(target.id, frozenset())
        bound[target.id] = queries_


def _walk(node: ast.AST, bound: Bound, found: list[tuple[type[records.Record], str]]) -> None:
    """Find the `from_row` calls under `node`, `bound` naming the queries each name's rows
    come from: a comprehension's or a loop's names only inside it, a function's its own."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        inner: Bound = {}
        for child in ast.iter_child_nodes(node):
            _walk(child, inner, found)
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        inner = dict(bound)
        for generator in node.generators:
            _walk(generator.iter, inner, found)
            _bind(generator.target, generator.iter, inner)
            for condition in generator.ifs:
                _walk(condition, inner, found)
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for part in parts:
            _walk(part, inner, found)
    elif isinstance(node, ast.For):
        _walk(node.iter, bound, found)
        inner = dict(bound)
        _bind(node.target, node.iter, inner)
        for child in node.body + node.orelse:
            _walk(child, inner, found)
    elif isinstance(node, ast.Assign):
        _walk(node.value, bound, found)
        for target in node.targets:
            _bind(target, node.value, bound, join=True)
    else:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "from_row"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Name)
            and isinstance(node.args[1], ast.Name)
        ):
            record = getattr(records, node.args[0].id)
            found += [(record, name) for name in sorted(bound.get(node.args[1].id, ()))]
        for child in ast.iter_child_nodes(node):
            _walk(child, bound, found)


def _nulls(query: Query) -> dict[str, object]:
    """Every parameter NULL but a LIMIT's: the statement runs, its columns are described."""
    return {p: 1 if p in ("capacity", "room", "limit") else None for p in query.params}


def test_every_record_read_has_its_querys_columns_on_sqlite(tmp_path: Path) -> None:
    db = open_ledger_file(tmp_path / "ledger.db")
    known = queries.load("sqlite")
    for record, name in _record_reads():
        query = known[name]
        cursor = db.execute(query.text, query.values(_nulls(query)))
        records.check_columns(record, [d[0] for d in cursor.description], name)
    db.close()


def test_every_record_read_has_its_querys_columns_on_postgresql(pg_url: str) -> None:
    known = queries.load("postgresql")
    with psycopg.connect(pg_url) as conn:
        for record, name in _record_reads():
            query = known[name]
            cursor = conn.execute(query.text, query.values(_nulls(query)))
            assert cursor.description is not None
            records.check_columns(record, [d.name for d in cursor.description], name)
            conn.rollback()
