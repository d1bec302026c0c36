"""Names the ledger refuses: the wake-all pool sentinel and blank repository names."""

from __future__ import annotations

import pytest

from tests.conftest import count, ledger_rows, make_spec
from tether.supervisor.ledger import InvalidRequest, SqliteLedger

pytestmark = pytest.mark.backends


async def test_a_task_cannot_claim_the_wake_all_pool(ledger: SqliteLedger) -> None:
    with pytest.raises(InvalidRequest, match="pool"):
        await ledger.create_task(make_spec("k", pool="*"))
    assert count(ledger, "tasks") == 0


async def test_a_runner_token_cannot_be_scoped_to_the_wake_all_pool(ledger: SqliteLedger) -> None:
    with pytest.raises(InvalidRequest, match="pool"):
        await ledger.create_token("*", "runner")
    assert count(ledger, "tokens") == 0


@pytest.mark.parametrize("name", [" ", "\t"])
async def test_blank_repository_names_are_refused(ledger: SqliteLedger, name: str) -> None:
    with pytest.raises(InvalidRequest):
        await ledger.set_repository_head("acme", name, "abc")
    with pytest.raises(InvalidRequest):
        await ledger.create_task(make_spec("k", repository=name, base_sha="abc"))
    assert count(ledger, "repositories") + count(ledger, "tasks") == 0


@pytest.mark.parametrize(
    "name", ["two words", "evil\nfake123 admin operator 2020", "", "-lead", "tab\there", "ü"]
)
async def test_names_that_would_break_a_listing_are_refused(
    ledger: SqliteLedger, name: str
) -> None:
    """`token list` prints one line per token, fields split by spaces: a tenant or pool name
    with a space or a line break could forge a line. Such names are refused everywhere."""
    for role in ("operator", "runner"):
        with pytest.raises(InvalidRequest, match="not allowed"):
            await ledger.create_token(name, role)
    with pytest.raises(InvalidRequest, match="pool name"):
        await ledger.create_task(make_spec("k", pool=name))
    with pytest.raises(InvalidRequest, match="tenant name"):
        await ledger.set_budget(name, 10)
    assert count(ledger, "tokens") + count(ledger, "tasks") == 0
    assert count(ledger, "tenants") == 0


async def test_names_as_deployments_write_them_are_accepted(ledger: SqliteLedger) -> None:
    for tenant in ("acme", "acme-corp", "team.ops", "ops@example.org", "a1:b2+c"):
        await ledger.create_token(tenant, "operator")
    for pool in ("default", "acme/gpu", "acme/gpu.eu-1/large"):
        await ledger.create_token(pool, "runner")
    with pytest.raises(InvalidRequest, match="pool name"):
        await ledger.create_token("acme//gpu", "runner")
    with pytest.raises(InvalidRequest, match="tenant name"):
        await ledger.set_budget("acme/gpu", 10)  # a pool, not a tenant
    assert count(ledger, "tokens") == 8


async def test_names_from_before_the_rules_can_still_be_managed(
    ledger: SqliteLedger,
) -> None:
    """A ledger written before the naming rules may hold 'acme corp' and 'acme/team'. Their
    tokens can be rotated and their budgets set; new names are still checked."""
    ledger_rows(
        ledger,
        "INSERT INTO tokens (id, scope, role, secret_hash, created_at) VALUES"
        " ('old1', 'acme corp', 'operator', 'h1', 0), ('old2', 'acme/team', 'operator', 'h2', 0),"
        " ('old3', 'slow pool', 'runner', 'h3', 0)",
    )
    await ledger.create_token("acme corp", "operator")
    await ledger.create_token("acme/team", "operator")
    await ledger.create_token("slow pool", "runner")
    await ledger.set_budget("acme corp", None)
    await ledger.create_task(make_spec("k", pool="slow pool"))
    assert count(ledger, "tokens") == 6
    with pytest.raises(InvalidRequest, match="not allowed"):
        await ledger.create_token("acme corp2 x", "operator")
    with pytest.raises(InvalidRequest, match="no '/'"):
        await ledger.create_token("acme/other", "operator")
    with pytest.raises(InvalidRequest, match="tenant name"):
        await ledger.set_budget("slow pool", 5)  # a pool's name is not a tenant's
