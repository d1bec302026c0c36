"""The ledger's named queries: the file rules the loader enforces, every name the code runs
exists with the parameters the code gives it, no query is dead, and every PostgreSQL text is
one PostgreSQL accepts."""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import psycopg
import pytest

from tests import pgdb
from tether.supervisor.ledger import queries
from tether.supervisor.ledger.invariants import INVARIANTS
from tether.supervisor.ledger.tx import ReadSession, Tx

pg_url = pgdb.pg_url

ROOT = Path(__file__).resolve().parents[3]
# A query run by name: `tx.one("name", ...)`, `s.all("name")`, `tx.many("name", ...)`, and
# as a record: `tx.one_as(Record, "name", ...)`.
CALL = re.compile(
    r"\.(?:one|all|run|count|many)\(\s*\"([a-z][a-z0-9_]*)\""
    r"|\.(?:one_as|all_as)\(\s*\w+,\s*\"([a-z][a-z0-9_]*)\""
)
LITERAL = re.compile(r"\"([a-z][a-z0-9_]*)\"")


def _sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "supervisor").rglob("*.py")))


def test_every_name_the_code_runs_is_a_query_in_both_dialects() -> None:
    """But a fold (`queries.FOLDS`), which the code runs only where `name in tx.sql`."""
    sources = _sources()
    called = {a or b for a, b in CALL.findall(sources)}
    assert len(called) > 100  # the pattern still finds the calls
    for dialect in queries.DIALECTS:
        missing = called - set(queries.load(dialect))
        elsewhere = {name for name, home in queries.FOLDS.items() if home != dialect}
        assert missing == elsewhere, f"{dialect}: no query named {sorted(missing - elsewhere)}"
    for name in queries.FOLDS:
        assert f'"{name}" in tx.sql' in sources, name


def test_no_query_is_dead() -> None:
    named = set(LITERAL.findall(_sources())) | {n.replace("-", "_") for n in INVARIANTS}
    unused = {name for dialect in queries.DIALECTS for name in queries.load(dialect)} - named
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


def test_each_call_names_its_querys_parameters() -> None:
    """Every call of a query by its literal name, in the rules, the explorer and the benches,
    gives exactly the parameters the query's text names (the rest are checked as they run)."""
    known = queries.load("sqlite")
    checked = 0
    wrong: list[str] = []
    for folder in ("supervisor", "sim", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # bench/.peers-venv, bench/.litellm-venv: other projects' code
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                # `one_as(Record, "name", ...)`: the name comes after the record.
                first = 1 if node.func.attr in ("one_as", "all_as") else 0
                if not (
                    node.func.attr in ("one", "all", "run", "count", "one_as", "all_as")
                    and len(node.args) > first
                    and isinstance(node.args[first], ast.Constant)
                    and node.args[first].value in known
                ):
                    continue
                given = {k.arg for k in node.keywords}
                if None in given:  # a ** mapping: checked as it runs
                    continue
                checked += 1
                query = known[node.args[first].value]
                if len(node.args) > first + 1 or given != query.names:
                    wrong.append(f"{path.name}:{node.lineno} {query.name}: {sorted(given)}")
    assert checked > 150  # the walk still finds the calls
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        ("SELECT 1", ()),
        ("UPDATE t SET a = :a WHERE id = :id AND b > :a", ("a", "id")),
        ("SELECT :kinds::jsonb, x::text, (y)::int FROM t WHERE z = :z", ("kinds", "z")),
        ("SELECT ':not' || '?' || \":nor\" FROM t WHERE a = :a -- :nor ?\n", ("a",)),
        ("SELECT a[1:2] FROM t WHERE b = :b1", ("b1",)),
    ],
)
def test_parameters_are_the_names_outside_quotes_casts_and_comments(
    statement: str, params: tuple[str, ...]
) -> None:
    assert queries.params_of(statement, "t.sql", "q") == params


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("SELECT * FROM t WHERE a = ?", "has a `\\?` parameter"),
        ("SELECT * FROM t WHERE a = ? AND b = :b", "mixes `\\?` with named parameters"),
    ],
)
def test_a_question_mark_parameter_is_refused(statement: str, message: str) -> None:
    with pytest.raises(queries.QueryFileError, match=message):
        queries.params_of(statement, "t.sql", "q")


def test_the_loader_refuses_a_file_with_a_question_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load` reads the package's folder; a copy with one `?` put back is refused whole."""
    folder = tmp_path / "tether" / "supervisor" / "ledger"
    sql = folder / "sql" / "queries"
    sql.mkdir(parents=True)
    for d in (tmp_path / "tether", tmp_path / "tether" / "supervisor", folder):
        (d / "__init__.py").write_text("")
    source = ROOT / "supervisor" / "ledger" / "sql" / "queries"
    for f in source.iterdir():
        text = f.read_text()
        if f.name == "fencing.sql":
            text = text.replace("WHERE id = :step_id;", "WHERE id = ?;", 1)
        (sql / f.name).write_text(text)
    monkeypatch.setattr(queries.resources, "files", lambda _: folder)  # the copy
    queries.load.cache_clear()
    try:
        with pytest.raises(queries.QueryFileError, match=r"fencing\.sql: query lease_step mixes"):
            queries.load("sqlite")
    finally:
        monkeypatch.undo()
        queries.load.cache_clear()
    assert queries.load("sqlite")["extend_lease"].params == ("lease_deadline", "step_id")


@pytest.mark.parametrize(
    ("moved", "message"),
    [
        ("fencing.sqlite.sql", r"but not the other's .*: \['grant_lease'\]"),
        ("fencing.sql", r"but not the other's .*: \['grant_lease'\]"),
    ],
)
def test_the_loader_keeps_a_fold_in_its_own_dialect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved: str, message: str
) -> None:
    """A fold (`queries.FOLDS`) found in the other dialect's file, or missing from its own
    (put in a shared file), is refused like any query in one dialect's file alone."""
    folder = tmp_path / "tether" / "supervisor" / "ledger"
    sql = folder / "sql" / "queries"
    sql.mkdir(parents=True)
    source = ROOT / "supervisor" / "ledger" / "sql" / "queries"
    before, _, after = (
        source.joinpath("fencing.postgresql.sql").read_text().partition("-- name: grant_lease\n")
    )
    fold, _, rest = after.partition("\n-- name:")
    for f in source.iterdir():
        text = f.read_text()
        if f.name == "fencing.postgresql.sql":
            text = before + ("-- name:" + rest if rest else "")  # grant_lease may be last
        if f.name == moved:
            text += "\n-- name: grant_lease\n" + fold
        (sql / f.name).write_text(text)
    monkeypatch.setattr(queries.resources, "files", lambda _: folder)  # the copy
    queries.load.cache_clear()
    try:
        with pytest.raises(queries.QueryFileError, match=message):
            queries.load("postgresql")
    finally:
        monkeypatch.undo()
        queries.load.cache_clear()
    assert "grant_lease" in queries.load("postgresql")
    assert "grant_lease" not in queries.load("sqlite")


def test_postgresql_text_has_pyformat_names_and_doubled_percents() -> None:
    assert queries.to_pyformat(
        "SELECT '?%:x' || :a::jsonb, \"c:d\" WHERE a LIKE :b AND c % 2 = :a -- 5%: :z\n"
    ) == (
        "SELECT '?%%:x' || %(a)s::jsonb, \"c:d\" WHERE a LIKE %(b)s AND c %% 2 = %(a)s -- 5%%: :z\n"
    )
    # The explorer's and the tests' own statements, given tuples.
    assert queries.to_pyformat("SELECT '?' || ? WHERE b % 2") == "SELECT '?' || %s WHERE b %% 2"


def test_sqlite_text_has_a_mark_per_use_given_the_values_in_order() -> None:
    statement = "SELECT :a || '::' || :b || ':a' || :a -- :c"
    assert queries.to_qmark(statement) == (
        "SELECT ? || '::' || ? || ':a' || ? -- :c",
        ("a", "b", "a"),
    )
    values = {"a": "x", "b": "y"}
    text, order = queries.to_qmark(statement)
    assert queries.binder(order)(values) == ("x", "y", "x")
    assert sqlite3.connect(":memory:").execute(text, queries.binder(order)(values)).fetchone() == (
        "x::y:ax",
    )
    assert queries.binder(("a",))(values) == ("x",)
    assert queries.binder(())(values) == ()


def test_a_call_with_other_parameters_is_refused_at_once() -> None:
    """A mistake in the code: the query is not run, and the error names what differs."""
    ran: list[str] = []

    class Db:
        def execute(self, sql: str, parameters: object = (), /) -> object:
            ran.append(sql)
            raise AssertionError("not run")

        def executemany(self, sql: str, parameters: object, /) -> object:
            ran.append(sql)
            raise AssertionError("not run")

    tx = Tx(db=Db(), now=0.0, config=None, new_id=str)  # type: ignore[arg-type]
    with pytest.raises(queries.QueryParamsError, match=r"extend_lease .*: missing step_id$"):
        tx.run("extend_lease", lease_deadline=1.0)
    with pytest.raises(
        queries.QueryParamsError, match=r"missing lease_deadline; unexpected deadline, fence$"
    ):
        tx.count("extend_lease", step_id="s", deadline=1.0, fence=3)
    with pytest.raises(queries.QueryParamsError, match=r"task_state .*unexpected step_id$"):
        tx.one("task_state", task_id="t", step_id="s")
    with pytest.raises(queries.QueryParamsError, match=r"next_fence .*unexpected fence$"):
        tx.all("next_fence", fence=1)
    with pytest.raises(queries.QueryParamsError, match=r"missing at$"):
        tx.many("keep_log_line", [_log_line(), {k: 1 for k in _log_line() if k != "at"}])
    with pytest.raises(queries.QueryParamsError, match=r"owned_task .*missing tenant$"):
        ReadSession(Db()).one("owned_task", task_id="t")  # type: ignore[arg-type]
    on_pg = Tx(db=Db(), now=0.0, config=None, sql=queries.load("postgresql"), new_id=str)  # type: ignore[arg-type]
    with pytest.raises(queries.QueryParamsError, match=r"missing lease_deadline$"):
        on_pg.run("extend_lease", step_id="s")
    with pytest.raises(queries.QueryParamsError, match=r"task_state .*unexpected step_id$"):
        on_pg.one("task_state", task_id="t", step_id="s")
    assert ran == []


def _log_line() -> dict[str, object]:
    return dict.fromkeys(queries.load("sqlite")["keep_log_line"].params, 1)


def test_a_parameter_may_be_called_name() -> None:
    """The query's name is positional only, so `name=` is a parameter."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE tokens (scope TEXT, role TEXT)")
    db.execute("CREATE TABLE tenants (name TEXT)")
    db.execute("INSERT INTO tenants VALUES ('acme')")
    s = ReadSession(db)  # type: ignore[arg-type]
    assert s.one("tenant_name_held", name="acme") is not None
    assert s.one("tenant_name_held", name="other") is None


def _numbered(text: str) -> str:
    """psycopg's `%(name)s` as PREPARE's `$1, $2, ...`, a name used again keeping its number
    as psycopg sends it (and `%%` as `%`)."""
    numbers: dict[str, str] = {}

    def number(m: re.Match[str]) -> str:
        if m.group() == "%%":
            return "%"
        return numbers.setdefault(m.group(1), f"${len(numbers) + 1}")

    return re.sub(r"%%|%\((\w+)\)s", number, text)


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
