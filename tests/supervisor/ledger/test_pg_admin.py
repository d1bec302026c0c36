"""`tether-supervisor` admin commands with `--db postgresql://...`: init creates the tables in
an empty database, tokens and budgets run the ledger's rules there, check runs every
invariant, backup points at pg_dump, and a database without a ledger is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests import pgdb
from tests.supervisor.test_cli_admin import TOKEN_LINE, run
from tether.supervisor.ledger.store import open_ledger

pg_url = pgdb.pg_url


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database with no ledger in it."""
    with pgdb.fresh_database() as url:
        yield url


def test_init_creates_the_ledger_in_an_empty_database_once(
    empty_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "token", "list", "--db", empty_database)
    assert code == 1
    assert "no ledger at postgresql://" in err
    code, _, err = run(capsys, "init", "--db", empty_database)
    assert (code, err.strip()) == (0, f"created ledger {empty_database}")
    code, _, err = run(capsys, "init", "--db", empty_database)
    assert (code, err.strip()) == (0, f"ledger {empty_database} exists; left as it was")


def test_tokens_made_and_revoked_by_the_cli_are_the_running_ledgers(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, secret, _ = run(
        capsys, "token", "create", "--db", pg_url, "--tenant", "acme", "--role", "operator"
    )
    assert code == 0
    code, out, _ = run(capsys, "token", "list", "--db", pg_url)
    match = TOKEN_LINE.fullmatch(out.strip())
    assert match is not None
    assert match["scope"] == "acme"

    async def principal() -> object:
        async with open_ledger(pg_url) as ledger:
            return await ledger.authenticate(secret.strip())

    assert anyio.run(principal) is not None
    assert run(capsys, "token", "revoke", "--db", pg_url, match["id"])[0] == 0
    assert anyio.run(principal) is None


def test_check_and_budget_on_a_database(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "budget", "--db", pg_url, "--tenant", "acme", "--tokens", "500")[0] == 0
    code, out, _ = run(capsys, "budget", "--db", pg_url, "--tenant", "acme", "--show")
    assert (code, out.strip()) == (0, "tenant=acme spent=0 budget=500 left=500")
    code, out, _ = run(capsys, "check", "--db", pg_url)
    assert code == 0
    assert out.strip() == f"ok: {pg_url} passes integrity and every ledger invariant"


def test_backup_of_a_database_points_at_pg_dump(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "copy.db"
    code, _, err = run(capsys, "backup", "--db", pg_url, str(dest))
    assert code == 1
    assert "pg_dump" in err
    assert not dest.exists()


def test_another_scheme_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "token", "list", "--db", "mysql://h/db")
    assert code == 1
    assert err.count("\n") == 1
    assert "scheme 'mysql' is not supported" in err
