"""Plans are checked when they are submitted, not when they run (issue 16, finding 3): a
built-in kind's payload is read into the same record the runner uses, an unknown key is
refused, and a kind is known only if built in or announced by a runner of the task's pool.
Runners announce their kinds when they claim and are granted only steps of those kinds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    ApiHarness,
    FakeClock,
    assert_error,
    chat_payload,
    count,
    ledger_snapshot,
    raw_db,
    report_for,
    task_body,
)
from tests.supervisor.test_cli_serve import run, serving
from tether.supervisor import admin
from tether.supervisor.ledger import InvalidRequest, SqliteLedger, StepSpec, TaskSpec
from tether.supervisor.ledger.runners import SEEN_RESOLUTION_S

GOOD = chat_payload("hello")

# The five plans accepted by the old `task submit` and run only to fail: each is refused with
# 422 invalid_field, and the detail names the step and the field.
BAD_PLANS: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "unknown_kind",
        {"steps": [{"name": "ask", "kind": "chta", "payload": GOOD}]},
        ["'plan.steps[0].kind'", "'chta'", "'ask'", "known: agent, chat"],
    ),
    (
        "payload_key_typo",
        {"steps": [{"name": "ask", "kind": "chat", "payload": {"mesages": GOOD["messages"]}}]},
        ["'plan.steps[0].payload'", "`mesages`", "did you mean `messages`", "'ask'"],
    ),
    (
        "use_output",
        {
            "steps": [
                {"name": "ask", "kind": "chat", "payload": GOOD},
                {"name": "more", "kind": "chat", "payload": {**GOOD, "use_output": True}},
            ]
        },
        ["'plan.steps[1].payload'", "`use_output`", "did you mean `use_outputs`", "'more'"],
    ),
    (
        "bad_role",
        {
            "steps": [
                {
                    "name": "ask",
                    "kind": "chat",
                    "payload": {"messages": [{"role": "usr", "content": "hi"}]},
                }
            ]
        },
        ["'plan.steps[0].payload.messages[0].role'", "'usr'", "'ask'"],
    ),
    (
        "wrong_type",
        {"steps": [{"name": "ask", "kind": "chat", "payload": {**GOOD, "temperature": "warm"}}]},
        ["'plan.steps[0].payload.temperature'", "expected `float`", "'ask'"],
    ),
    (
        "unknown_step_key",
        {"steps": [{"name": "ask", "kind": "chat", "payload": GOOD, "note": "dropped before"}]},
        ["'plan.steps[0]'", "unknown field `note`"],
    ),
]
ONE_STEP = {"steps": [{"name": "a", "kind": "chat", "payload": GOOD}]}
UNKNOWN_TOP_LEVEL = (
    {"idempotency_key": "k", "plan": ONE_STEP, "pool_name": "gpu"},
    ["unknown field `pool_name`", "did you mean `pool`"],
)


def spec(*kinds: str, key: str = "k1", pool: str = "default") -> TaskSpec:
    return TaskSpec(
        tenant="acme",
        idempotency_key=key,
        pool=pool,
        steps=tuple(StepSpec(name=f"s{i}", kind=k, payload=GOOD) for i, k in enumerate(kinds)),
    )


async def queue(ledger: SqliteLedger, task: TaskSpec) -> str:
    created = await ledger.create_task(task)
    await ledger.approve(task.tenant, created.task_id, task.plan_hash, None)
    return created.task_id


def ledger_but_tokens(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row but the tokens' (a request marks its token's last use)."""
    return {t: rows for t, rows in ledger_snapshot(path).items() if t != "tokens"}


def runners(path: Path) -> list[tuple[Any, ...]]:
    db = raw_db(path)
    try:
        rows = db.execute(
            "SELECT pool, runner_id, token_id, kinds_json, first_seen, last_seen FROM runners"
            " ORDER BY pool, runner_id"
        )
        return [tuple(r) for r in rows]
    finally:
        db.close()


# -- the ledger: grants by kind ------------------------------------------------------------


async def test_a_step_no_claiming_runner_serves_is_never_granted_nor_burned(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    await ledger.claim("deployer", "default", 1, 0, kinds=("chat", "deploy"))  # announces
    deploy = await queue(ledger, spec("deploy", key="deploy"))
    chat = await queue(ledger, spec("chat", key="chat"))
    for _ in range(10):
        granted = await ledger.claim("chatter", "default", 4, 0, kinds=("chat",))
        for lease in granted:
            await ledger.report(report_for(lease))
    # The chat step behind the deploy step was granted; the deploy step was not, ten times.
    assert count(ledger_path, "steps", "task_id = ? AND state = 'committed'", (chat,)) == 1
    assert count(ledger_path, "attempts", "step_id LIKE ?", (f"{deploy}.%",)) == 0
    assert count(ledger_path, "steps", "task_id = ? AND burned = 0", (deploy,)) == 1
    [lease] = await ledger.claim("deployer", "default", 4, 0, kinds=("chat", "deploy"))
    assert (lease.task_id, lease.kind, lease.attempt) == (deploy, "deploy", 1)


async def test_a_claim_without_kinds_is_granted_chat_only(ledger: SqliteLedger) -> None:
    await ledger.claim("deployer", "default", 1, 0, kinds=("deploy",))
    deploy = await queue(ledger, spec("deploy", key="deploy"))
    chat = await queue(ledger, spec("chat", key="chat"))
    assert [lease.task_id for lease in await ledger.claim("old", "default", 4, 0)] == [chat]
    [lease] = await ledger.claim("deployer", "default", 4, 0, kinds=("deploy",))
    assert lease.task_id == deploy


@pytest.mark.parametrize("kinds", [(), ("",), ("k" * 201,), tuple(f"k{i}" for i in range(65))])
async def test_a_claim_with_unusable_kinds_is_refused(
    ledger: SqliteLedger, ledger_path: Path, kinds: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidRequest, match="kinds"):
        await ledger.claim("r1", "default", 1, 0, kinds=kinds)
    assert runners(ledger_path) == []


async def test_each_claim_records_its_runner_and_moves_last_seen_at_most_once_a_second(
    ledger: SqliteLedger, ledger_path: Path, clock: FakeClock
) -> None:
    start = clock.now
    await ledger.claim("r1", "gpu", 1, 0, token_id="tok1", kinds=("deploy", "chat", "chat"))
    expected = ("gpu", "r1", "tok1", '["chat","deploy"]', start, start)
    assert runners(ledger_path) == [expected]
    clock.advance(SEEN_RESOLUTION_S / 2)
    await ledger.claim("r1", "gpu", 1, 0, token_id="tok1", kinds=("chat", "deploy"))
    assert runners(ledger_path) == [expected]  # nothing written
    clock.advance(SEEN_RESOLUTION_S)
    await ledger.claim("r1", "gpu", 1, 0, token_id="tok1", kinds=("chat", "deploy"))
    later = clock.now
    assert runners(ledger_path) == [(*expected[:5], later)]
    await ledger.claim("r1", "gpu", 1, 0, token_id="tok2", kinds=("chat",))  # at once
    assert runners(ledger_path) == [("gpu", "r1", "tok2", '["chat"]', start, later)]


# -- the ledger: kinds known at creation ---------------------------------------------------


async def test_a_kind_nobody_announced_is_refused_and_nothing_is_created(
    ledger: SqliteLedger, ledger_path: Path
) -> None:
    before = ledger_snapshot(ledger_path)
    with pytest.raises(InvalidRequest) as caught:
        await ledger.create_task(spec("chat", "chta"))
    detail = caught.value.detail
    for words in ("'plan.steps[1].kind'", "'chta'", "'s1'", "pool 'default'", "known: agent, chat"):
        assert words in detail
    assert ledger_snapshot(ledger_path) == before


async def test_a_kind_is_known_in_the_pools_whose_runners_announced_it_lately(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    await ledger.claim("deployer", "gpu", 1, 0, kinds=("chat", "deploy"))
    with pytest.raises(InvalidRequest, match=r"known: agent, chat, git.push, http$"):
        await ledger.create_task(spec("deploy", key="elsewhere"))  # pool default
    assert (await ledger.create_task(spec("deploy", key="gpu", pool="gpu"))).created
    clock.advance(ledger.config.runner_seen_window_s + 1)
    known = r"seen in the last 3600 s; known: agent, chat, git.push, http$"
    with pytest.raises(InvalidRequest, match=known):
        await ledger.create_task(spec("deploy", key="stale", pool="gpu"))
    # The retry of a create that succeeded returns its task, whoever serves the kind now.
    assert not (await ledger.create_task(spec("deploy", key="gpu", pool="gpu"))).created
    assert (await ledger.create_task(spec("chat", key="built-in", pool="gpu"))).created


# -- over HTTP -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "words"), [c[1:] for c in BAD_PLANS], ids=[c[0] for c in BAD_PLANS]
)
async def test_a_bad_plan_is_refused_at_submit_naming_step_and_field(
    api: ApiHarness, plan: dict[str, Any], words: list[str]
) -> None:
    before = ledger_but_tokens(api.path)
    body = {"idempotency_key": "k", "plan": plan}
    response = await api.client.post("/v1/tasks", headers=api.operator, json=body)
    detail = assert_error(response, 422, "invalid_field")["detail"]
    for word in words:
        assert word in detail
    assert ledger_but_tokens(api.path) == before


async def test_an_unknown_top_level_key_is_refused_at_submit(api: ApiHarness) -> None:
    body, words = UNKNOWN_TOP_LEVEL
    response = await api.client.post("/v1/tasks", headers=api.operator, json=body)
    detail = assert_error(response, 422, "invalid_field")["detail"]
    assert all(word in detail for word in words)
    assert count(api.path, "tasks") == 0


async def test_a_runners_claim_announces_the_kinds_it_is_granted(api: ApiHarness) -> None:
    async def claim(**extra: Any) -> list[dict[str, Any]]:
        body = {"runner_id": "r1", "capacity": 4, "wait_s": 0, **extra}
        response = await api.client.post("/v1/leases/claim", headers=api.runner, json=body)
        assert response.status_code in (200, 204), response.text
        return list(response.json()["leases"]) if response.status_code == 200 else []

    assert await claim(kinds=["chat", "deploy"]) == []
    deploy_step = {"name": "ship", "kind": "deploy", "payload": {"to": "prod"}}
    plan = {"idempotency_key": "ship", "plan": {"steps": [deploy_step]}}
    created = await api.client.post("/v1/tasks", headers=api.operator, json=plan)
    assert created.status_code == 201, created.text
    task = created.json()
    approval = {"plan_hash": task["plan_hash"]}
    approved = await api.client.post(
        f"/v1/tasks/{task['id']}/approve", headers=api.operator, json=approval
    )
    assert approved.status_code == 200, approved.text
    assert await claim() == []  # no `kinds`: an older runner, chat only
    assert await claim(kinds=["chat"]) == []
    [lease] = await claim(kinds=["deploy"])
    assert (lease["task_id"], lease["kind"], lease["attempt"]) == (task["id"], "deploy", 1)
    db = raw_db(api.path)
    try:
        token_id = db.execute(
            "SELECT id FROM tokens WHERE role = 'runner' AND scope = 'default'"
        ).fetchone()[0]
    finally:
        db.close()
    [row] = runners(api.path)
    assert row[:4] == ("default", "r1", token_id, '["deploy"]')


# -- `tether-supervisor task submit` -------------------------------------------------------


@pytest.fixture(scope="module")
def submit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], Path]]:
    """`task submit` against a real supervisor: the command's first words, and a folder."""
    folder = tmp_path_factory.mktemp("submit")
    db = folder / "ledger.db"
    token_file = folder / "operator-token"
    token_file.write_text(admin.create_token(db, "acme", "operator", init=True).secret + "\n")
    with serving(db, folder / "serve.log") as (_proc, url):
        yield ["task", "submit", "--url", url, "--token-file", str(token_file)], folder


@pytest.mark.parametrize(
    ("body", "words"),
    [*[({"idempotency_key": c[0], "plan": c[1]}, c[2]) for c in BAD_PLANS], UNKNOWN_TOP_LEVEL],
    ids=[*[c[0] for c in BAD_PLANS], "unknown_top_level_key"],
)
def test_task_submit_refuses_a_bad_plan_with_one_line(
    submit: tuple[list[str], Path],
    capsys: pytest.CaptureFixture[str],
    body: dict[str, Any],
    words: list[str],
) -> None:
    argv, folder = submit
    path = folder / "task.json"
    path.write_text(json.dumps(body))
    code, out, err = run(capsys, [*argv, "--file", str(path), "--approve"])
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert "422 invalid_field" in err
    assert all(word in err for word in words)
    path.write_text(json.dumps(task_body("good")))
    code, out, _ = run(capsys, [*argv, "--file", str(path)])  # a good plan is taken
    assert (code, json.loads(out)["state"]) == (0, "PLANNED")
