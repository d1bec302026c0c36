"""Idempotent create (docs/design.md, Idempotent create): `(tenant, idempotency_key)` names one
logical execution."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from tests.conftest import count, make_spec
from tests.plain import plain
from tether.supervisor.ledger import (
    Created,
    IdempotencyConflict,
    InvalidRequest,
    SqliteLedger,
    StepSpec,
)
from tether.supervisor.ledger.store import LedgerStore

pytestmark = pytest.mark.backends

TABLES = ("tasks", "steps", "events", "rejections", "tenants")


def sizes(ledger: LedgerStore) -> dict[str, int]:
    return {table: count(ledger, table) for table in TABLES}


async def test_same_plan_answers_the_same_task(ledger: SqliteLedger) -> None:
    first = await ledger.create_task(make_spec(steps=2))
    again = await ledger.create_task(make_spec(steps=2))
    assert first.created is True
    assert again == Created(task_id=first.task_id, created=False)
    view = plain(await ledger.task(first.task_id))
    assert view["state"] == "PLANNED"
    assert [s["id"] for s in view["steps"]] == [f"{first.task_id}.0", f"{first.task_id}.1"]


async def test_same_plan_writes_nothing_the_second_time(ledger: SqliteLedger) -> None:
    await ledger.create_task(make_spec())
    before = sizes(ledger)
    await ledger.create_task(make_spec())
    assert sizes(ledger) == before


@pytest.mark.parametrize(
    "other",
    [
        make_spec(steps=2),
        dataclasses.replace(
            make_spec(), steps=(StepSpec(name="s0", kind="chat", payload={"cmd": "rm -rf"}),)
        ),
        make_spec(owner="someone-else"),
        make_spec(repository="repo", base_sha="abc"),
    ],
    ids=["more-steps", "other-payload", "other-owner", "other-repository"],
)
async def test_another_plan_under_the_key_is_a_conflict_and_writes_nothing(
    ledger: SqliteLedger, other: object
) -> None:
    first = await ledger.create_task(make_spec())
    before = sizes(ledger)
    with pytest.raises(IdempotencyConflict) as caught:
        await ledger.create_task(other)  # type: ignore[arg-type]
    assert first.task_id in caught.value.detail
    assert sizes(ledger) == before
    assert plain(await ledger.task(first.task_id))["plan_hash"] == make_spec().plan_hash


async def test_fifty_concurrent_duplicate_creates_make_one_task(ledger: SqliteLedger) -> None:
    answers: list[Created] = []

    async def create() -> None:
        answers.append(await ledger.create_task(make_spec("dup", steps=3)))

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(create)
    assert len(answers) == 50
    assert len({a.task_id for a in answers}) == 1
    assert sum(a.created for a in answers) == 1
    assert count(ledger, "tasks") == 1
    assert count(ledger, "steps") == 3
    assert count(ledger, "events") == 1


async def test_another_tenant_with_the_same_key_gets_its_own_task(ledger: SqliteLedger) -> None:
    ours = await ledger.create_task(make_spec("shared-key"))
    theirs = await ledger.create_task(make_spec("shared-key", tenant="globex"))
    assert theirs.created is True
    assert theirs.task_id != ours.task_id
    assert plain(await ledger.task(theirs.task_id))["tenant"] == "globex"
    assert plain(await ledger.task(ours.task_id))["tenant"] == "acme"


@pytest.mark.parametrize(
    "spec",
    [
        make_spec(key=""),
        make_spec(tenant=""),
        dataclasses.replace(make_spec(), steps=()),
        dataclasses.replace(make_spec(), steps=(StepSpec(name="", kind="chat", payload=1),)),
        make_spec(expected_checks=("tests",)),
        make_spec(base_sha="abc"),
    ],
    ids=["empty-key", "empty-tenant", "no-steps", "unnamed-step", "checks-no-repo", "sha-no-repo"],
)
async def test_bad_specs_are_refused_and_write_nothing(ledger: SqliteLedger, spec: object) -> None:
    before = sizes(ledger)
    with pytest.raises(InvalidRequest):
        await ledger.create_task(spec)  # type: ignore[arg-type]
    assert sizes(ledger) == before
