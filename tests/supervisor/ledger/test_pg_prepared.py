"""The writer's prepared statements on PostgreSQL: psycopg forgets them all at a refused rule's
`ROLLBACK TO rule`; they are prepared again after one more run, not five (pgperf's note)."""

from __future__ import annotations

from typing import Any

from tests import pgdb
from tests.conftest import FakeClock
from tether.supervisor.ledger import LedgerConfig, StaleFence, queries
from tether.supervisor.ledger.batch import Transactions
from tether.supervisor.ledger.postgres import PostgresBackend
from tether.supervisor.ledger.reaper import next_deadline
from tether.supervisor.ledger.tx import Tx

pg_url = pgdb.pg_url


def refused(tx: Tx) -> Any:
    raise StaleFence("not yours")


def prepared(transactions: Transactions) -> set[str]:
    """The statements the writer's session holds prepared."""
    rows = transactions.db.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    return {row[0] for row in rows}


def test_a_refused_rule_costs_the_writer_its_prepared_statements_for_one_run(
    pg_url: str, clock: FakeClock
) -> None:
    backend = PostgresBackend(pg_url)
    statement = queries.load("postgresql")["next_lease_deadline"].text
    db = backend.open_writer()
    try:
        transactions = Transactions(db=db, config=LedgerConfig(), clock=clock, backend=backend)
        for _ in range(6):
            transactions.one(next_deadline)
        assert statement in prepared(transactions)
        [outcome] = transactions.run([refused]).outcomes
        assert isinstance(outcome.error, StaleFence)
        transactions.one(next_deadline)
        assert statement not in prepared(transactions)  # forgotten: DEALLOCATE ALL
        transactions.one(next_deadline)
        assert statement in prepared(transactions)
    finally:
        backend.close_writer(transactions.db)
