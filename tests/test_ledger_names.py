"""Names the ledger refuses: the wake-all pool sentinel and blank repository names."""

from __future__ import annotations

import pytest

from supervisor.ledger import InvalidRequest, SqliteLedger

from .conftest import count, make_spec


async def test_a_task_cannot_claim_the_wake_all_pool(ledger: SqliteLedger) -> None:
    with pytest.raises(InvalidRequest, match="pool"):
        await ledger.create_task(make_spec("k", pool="*"))
    assert count(ledger.path, "tasks") == 0


async def test_a_runner_token_cannot_be_scoped_to_the_wake_all_pool(ledger: SqliteLedger) -> None:
    with pytest.raises(InvalidRequest, match="pool"):
        await ledger.create_token("*", "runner")
    assert count(ledger.path, "tokens") == 0


@pytest.mark.parametrize("name", [" ", "\t"])
async def test_blank_repository_names_are_refused(ledger: SqliteLedger, name: str) -> None:
    with pytest.raises(InvalidRequest):
        await ledger.set_repository_head("acme", name, "abc")
    with pytest.raises(InvalidRequest):
        await ledger.create_task(make_spec("k", repository=name, base_sha="abc"))
    assert count(ledger.path, "repositories") + count(ledger.path, "tasks") == 0
