"""Issue 26, finding 5: task ids and plan hashes by unique prefixes (at least 8 characters)
wherever a full one is taken, resolved once (`supervisor/ledger/prefixes.py`): the API's task
routes and so every `task` command, `--plan-hash`, and the ledger read directly (`--db`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import pgdb
from tests.conftest import ApiHarness, FakeClock, chat_payload, open_api
from tether.supervisor import admin
from tether.supervisor.ledger import LedgerConfig, StepSpec, TaskSpec, identity
from tether.supervisor.ledger.batch import Transactions
from tether.supervisor.ledger.errors import InvalidRequest, NotFound, PlanMismatch
from tether.supervisor.ledger.prefixes import resolve_plan_hash, resolve_task_id


@pytest.fixture
async def api(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ApiHarness]:
    async with open_api(tmp_path / "prefixes.db", clock, synchronous="OFF") as harness:
        yield harness


async def test_a_unique_prefix_names_the_task_on_every_task_route(api: ApiHarness) -> None:
    task = await api.create("by-prefix")
    prefix = task["id"][:12]
    for path in (
        f"/v1/tasks/{prefix}",
        f"/v1/tasks/{prefix}/review",
        f"/v1/tasks/{prefix}/events",
        f"/v1/tasks/{prefix}/logs",
    ):
        answer = await api.client.get(path, headers=api.operator)
        assert answer.status_code == 200, (path, answer.text)
    assert (await api.client.get(f"/v1/tasks/{prefix}", headers=api.operator)).json()["id"] == task[
        "id"
    ]
    approved = await api.client.post(
        f"/v1/tasks/{prefix}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"][:12]},
    )
    assert approved.status_code == 200, approved.text
    assert (approved.json()["id"], approved.json()["state"]) == (task["id"], "QUEUED")


async def test_a_short_prefix_or_another_tenants_task_is_refused(api: ApiHarness) -> None:
    task = await api.create("too-short")
    short = await api.client.get(f"/v1/tasks/{task['id'][:7]}", headers=api.operator)
    assert short.status_code == 404
    assert "at least 8" in short.json()["detail"]
    rival = {"Authorization": f"Bearer {api.secrets['rival']}"}
    assert (await api.client.get(f"/v1/tasks/{task['id'][:12]}", headers=rival)).status_code == 404
    wrong = await api.client.post(
        f"/v1/tasks/{task['id']}/approve",
        headers=api.operator,
        json={"plan_hash": task["plan_hash"][:7]},
    )
    assert wrong.status_code == 409
    assert "at least 8" in wrong.json()["detail"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_ambiguous_prefix_names_the_tasks_it_begins(tmp_path: Path, backend: str) -> None:
    """On the ledger itself (as `--db` commands read it), a file or a database: two ids that
    share their first 10 characters. The prefix they share is refused naming both; one more
    character picks one."""
    with contextlib.ExitStack() as stack:
        db: Path | str = tmp_path / "ledger.db"
        if backend == "postgresql":
            db = stack.enter_context(pgdb.fresh_database())
        _ambiguous(db)


def _ambiguous(db: Path | str) -> None:
    admin.init_ledger(db)
    ids = iter(["abcdef0123" + tail for tail in ("aa" * 11, "bb" * 11)])
    with admin.ledger_file(db) as opened:
        transactions = Transactions(
            db=opened.db,
            config=LedgerConfig(),
            clock=time.time,
            backend=opened.backend,
            new_id=lambda: next(ids),
        )
        for key in ("one", "two"):
            spec = TaskSpec(
                tenant="acme",
                idempotency_key=key,
                steps=(StepSpec(name="s", kind="chat", payload=chat_payload(key)),),
            )
            transactions.one(lambda tx, spec=spec: identity.create_task(tx, spec))
        reads = opened.reads()
        with pytest.raises(InvalidRequest, match="ambiguous") as refused:
            resolve_task_id(reads, "acme", "abcdef0123")
        assert "abcdef0123" + "aa" * 11 in str(refused.value)
        assert "abcdef0123" + "bb" * 11 in str(refused.value)
        assert resolve_task_id(reads, "acme", "abcdef0123b") == "abcdef0123" + "bb" * 11
        assert resolve_task_id(reads, None, "abcdef0123a") == "abcdef0123" + "aa" * 11
        with pytest.raises(NotFound):
            resolve_task_id(reads, "rival", "abcdef0123a")
        with pytest.raises(NotFound):
            resolve_task_id(reads, "acme", "abcdef0123c")


@pytest.mark.parametrize(
    ("given", "outcome"),
    [("f" * 64, "f" * 64), ("f" * 8, "f" * 64), ("f" * 7, PlanMismatch), ("e" * 8, PlanMismatch)],
)
def test_a_plan_hash_prefix_must_begin_the_tasks_own(
    given: str, outcome: str | type[Exception]
) -> None:
    if isinstance(outcome, str):
        assert resolve_plan_hash("t", "f" * 64, given) == outcome
    else:
        with pytest.raises(outcome):
            resolve_plan_hash("t", "f" * 64, given)
